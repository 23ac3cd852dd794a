// Package node is `stormdock node`: list, drain and undrain nodes through a master's API.
package node

import (
	"fmt"
	"io"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/tools/commands"
)

// Command inspects and drains nodes.
var Command = &cli.Command{
	Name:  "node",
	Usage: "list, drain and undrain nodes",
	Subcommands: []*cli.Command{
		{
			Name:   "list",
			Usage:  "list live nodes with their slots and health",
			Flags:  append(commands.MasterFlags(), commands.OutputFlag),
			Action: nodeList,
		},
		{
			Name:      "drain",
			Usage:     "move every worker off a node (each with its grace period) and place nothing new there",
			ArgsUsage: "ID",
			Flags:     commands.MasterFlags(),
			Action:    nodeDrain(true),
		},
		{
			Name:      "undrain",
			Usage:     "let a drained node take work again (and end its avoidances after crash loops)",
			ArgsUsage: "ID",
			Flags: append(commands.MasterFlags(),
				&cli.StringFlag{Name: "job", Usage: "only end the node's avoidance of this `JOB` (its crash loops there forgotten); its draining stays as it is"}),
			Action: nodeDrain(false),
		},
	},
}

func nodeList(c *cli.Context) error {
	if err := commands.WantArgs(c, 0, "no arguments"); err != nil {
		return err
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	nodes, err := cl.Nodes(c.Context)
	if err != nil {
		return commands.APIErr(c, err)
	}
	return commands.PrintOut(c, nodes, func(w io.Writer) {
		fmt.Fprintln(w, "ID\tDC\tRACK\tSLOTS\tFREE\tTHROTTLED\tHEALTH\tREASON")
		for _, n := range nodes {
			health := n.Health
			if n.Draining {
				health += ",draining"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", commands.Clip(n.ID, 20), commands.Clip(n.DC, 10), commands.Clip(n.Rack, 10), n.Slots, n.SlotsFree, n.SlotsThrottled, health, commands.Clip(n.Reason, 30))
		}
		// Avoidances after crash loops, below the table: they end by themselves (or with
		// `node undrain`).
		for _, n := range nodes {
			for _, a := range n.Avoided {
				fmt.Fprintf(w, "node %s avoids job %s until %s (crash loop %d there)\n", commands.Clip(n.ID, 20),
					commands.Clip(a.Job, 30), a.Until.UTC().Format(time.RFC3339), a.Strikes)
			}
		}
	})
}

func nodeDrain(drain bool) cli.ActionFunc {
	return func(c *cli.Context) error {
		if err := commands.WantName(c, "the node ID"); err != nil {
			return err
		}
		cl, err := commands.NewClient(c)
		if err != nil {
			return err
		}
		id := c.Args().First()
		if job := c.String("job"); job != "" && !drain {
			if err := cl.EndAvoidance(c.Context, id, job); err != nil {
				return commands.APIErr(c, err)
			}
			fmt.Fprintf(c.App.Writer, "node %s takes job %s's workers again\n", id, job)
			return nil
		}
		if err := cl.DrainNode(c.Context, id, drain); err != nil {
			return commands.APIErr(c, err)
		}
		if drain {
			fmt.Fprintf(c.App.Writer, "node %s draining: its workers move elsewhere\n", id)
		} else {
			fmt.Fprintf(c.App.Writer, "node %s takes work again\n", id)
		}
		return nil
	}
}
