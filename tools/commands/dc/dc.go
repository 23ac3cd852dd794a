// Package dc is `stormdock dc`: list data centers, fail one over and restore it through a
// master's API.
package dc

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/tools/commands"
)

// Command shows data centers and fails work over between them.
var Command = &cli.Command{
	Name:  "dc",
	Usage: "list data centers, fail one over, restore it",
	Subcommands: []*cli.Command{
		{
			Name:   "list",
			Usage:  "list data centers with their nodes, slots and state",
			Flags:  append(commands.MasterFlags(), commands.OutputFlag),
			Action: dcList,
		},
		{
			Name:      "fail",
			Usage:     "move every worker out of a data center, whole jobs by priority, and keep new ones out",
			ArgsUsage: "DC",
			Flags:     commands.MasterFlags(),
			Action:    dcFail,
		},
		{
			Name:      "restore",
			Usage:     "let work into a data center again (nothing moves back unless --rebalance)",
			ArgsUsage: "DC",
			Flags:     append(commands.MasterFlags(), &cli.BoolFlag{Name: "rebalance", Usage: "spread jobs back into it now (moves workers)"}),
			Action:    dcRestore,
		},
	},
}

func dcList(c *cli.Context) error {
	if err := commands.WantArgs(c, 0, "no arguments"); err != nil {
		return err
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	dcs, err := cl.DCs(c.Context)
	if err != nil {
		return commands.APIErr(c, err)
	}
	return commands.PrintOut(c, dcs, func(w io.Writer) {
		fmt.Fprintln(w, "DC\tSTATE\tNODES\tSLOTS\tFREE\tWORKERS\tSINCE")
		for _, d := range dcs {
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%s\n", commands.Clip(d.Name, 20), d.State, d.Nodes, d.Slots, d.SlotsFree, d.Workers, d.Since.Format("2006-01-02 15:04:05"))
		}
	})
}

func dcFail(c *cli.Context) error {
	if err := commands.WantName(c, "the data center DC"); err != nil {
		return err
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	if _, err := cl.FailDC(c.Context, c.Args().First()); err != nil {
		return commands.APIErr(c, err)
	}
	fmt.Fprintf(c.App.Writer, "data center %s failed: its workers move to the others that have room (see `stormdock job list`)\n", c.Args().First())
	return nil
}

func dcRestore(c *cli.Context) error {
	if err := commands.WantName(c, "the data center DC"); err != nil {
		return err
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	if _, err := cl.RestoreDC(c.Context, c.Args().First(), c.Bool("rebalance")); err != nil {
		return commands.APIErr(c, err)
	}
	fmt.Fprintf(c.App.Writer, "data center %s restored\n", c.Args().First())
	return nil
}
