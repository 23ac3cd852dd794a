package tools

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"
)

// DCCommand shows data centers and fails work over between them.
var DCCommand = &cli.Command{
	Name:  "dc",
	Usage: "list data centers, fail one over, restore it",
	Subcommands: []*cli.Command{
		{
			Name:   "list",
			Usage:  "list data centers with their nodes, slots and state",
			Flags:  append(masterFlags(), outputFlag),
			Action: dcList,
		},
		{
			Name:      "fail",
			Usage:     "move every worker out of a data center, whole jobs by priority, and keep new ones out",
			ArgsUsage: "DC",
			Flags:     masterFlags(),
			Action:    dcFail,
		},
		{
			Name:      "restore",
			Usage:     "let work into a data center again (nothing moves back unless --rebalance)",
			ArgsUsage: "DC",
			Flags:     append(masterFlags(), &cli.BoolFlag{Name: "rebalance", Usage: "spread jobs back into it now (moves workers)"}),
			Action:    dcRestore,
		},
	},
}

func dcList(c *cli.Context) error {
	if err := wantArgs(c, 0, "no arguments"); err != nil {
		return err
	}
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	dcs, err := cl.DCs(c.Context)
	if err != nil {
		return apiErr(c, err)
	}
	return printOut(c, dcs, func(w io.Writer) {
		fmt.Fprintln(w, "DC\tSTATE\tNODES\tSLOTS\tFREE\tWORKERS\tSINCE")
		for _, d := range dcs {
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%s\n", clip(d.Name, 20), d.State, d.Nodes, d.Slots, d.SlotsFree, d.Workers, d.Since.Format("2006-01-02 15:04:05"))
		}
	})
}

func dcFail(c *cli.Context) error {
	if err := wantName(c, "the data center DC"); err != nil {
		return err
	}
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	if _, err := cl.FailDC(c.Context, c.Args().First()); err != nil {
		return apiErr(c, err)
	}
	fmt.Fprintf(c.App.Writer, "data center %s failed: its workers move to the others that have room (see `stormdock job list`)\n", c.Args().First())
	return nil
}

func dcRestore(c *cli.Context) error {
	if err := wantName(c, "the data center DC"); err != nil {
		return err
	}
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	if _, err := cl.RestoreDC(c.Context, c.Args().First(), c.Bool("rebalance")); err != nil {
		return apiErr(c, err)
	}
	fmt.Fprintf(c.App.Writer, "data center %s restored\n", c.Args().First())
	return nil
}
