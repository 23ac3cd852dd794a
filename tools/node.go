package tools

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"
)

// NodeCommand inspects and drains nodes.
var NodeCommand = &cli.Command{
	Name:  "node",
	Usage: "list, drain and undrain nodes",
	Subcommands: []*cli.Command{
		{
			Name:   "list",
			Usage:  "list live nodes with their slots and health",
			Flags:  append(masterFlags(), outputFlag),
			Action: nodeList,
		},
		{
			Name:      "drain",
			Usage:     "move every worker off a node (each with its grace period) and place nothing new there",
			ArgsUsage: "ID",
			Flags:     masterFlags(),
			Action:    nodeDrain(true),
		},
		{
			Name:      "undrain",
			Usage:     "let a drained node take work again",
			ArgsUsage: "ID",
			Flags:     masterFlags(),
			Action:    nodeDrain(false),
		},
	},
}

func nodeList(c *cli.Context) error {
	if err := wantArgs(c, 0, "no arguments"); err != nil {
		return err
	}
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	nodes, err := cl.Nodes(c.Context)
	if err != nil {
		return apiErr(c, err)
	}
	return printOut(c, nodes, func(w io.Writer) {
		fmt.Fprintln(w, "ID\tDC\tRACK\tSLOTS\tFREE\tTHROTTLED\tHEALTH\tREASON")
		for _, n := range nodes {
			health := n.Health
			if n.Draining {
				health += ",draining"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", clip(n.ID, 20), clip(n.DC, 10), clip(n.Rack, 10), n.Slots, n.SlotsFree, n.SlotsThrottled, health, clip(n.Reason, 30))
		}
	})
}

func nodeDrain(drain bool) cli.ActionFunc {
	return func(c *cli.Context) error {
		if err := wantName(c, "the node ID"); err != nil {
			return err
		}
		cl, err := newClient(c)
		if err != nil {
			return err
		}
		id := c.Args().First()
		if err := cl.DrainNode(c.Context, id, drain); err != nil {
			return apiErr(c, err)
		}
		if drain {
			fmt.Fprintf(c.App.Writer, "node %s draining: its workers move elsewhere\n", id)
		} else {
			fmt.Fprintf(c.App.Writer, "node %s takes work again\n", id)
		}
		return nil
	}
}
