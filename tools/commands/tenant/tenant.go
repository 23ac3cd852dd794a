// Package tenant is `stormdock tenant`: create tenants, list them and issue their tokens
// through a master's API.
package tenant

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/tools/commands"
)

// Command manages tenants and their quotas.
var Command = &cli.Command{
	Name:  "tenant",
	Usage: "create and list tenants",
	Subcommands: []*cli.Command{
		{
			Name:      "create",
			Usage:     "create a tenant with its quota",
			ArgsUsage: "NAME",
			Flags: append(commands.MasterFlags(),
				&cli.IntFlag{Name: "max-workers", Usage: "most workers the tenant's jobs may have together (0: no cap)"},
				&cli.StringFlag{Name: "max-memory", Usage: "most memory the tenant's workers may ask for together, like 64Gi (empty: no cap)"}),
			Action: tenantCreate,
		},
		{
			Name:      "token",
			Usage:     "make a new API token for a tenant (the old one stops working); shown once",
			ArgsUsage: "NAME",
			Flags:     commands.MasterFlags(),
			Action:    tenantToken,
		},
		{
			Name:   "list",
			Usage:  "list tenants with their quota and use",
			Flags:  append(commands.MasterFlags(), commands.OutputFlag),
			Action: tenantList,
		},
	},
}

func tenantCreate(c *cli.Context) error {
	if err := commands.WantName(c, "the tenant NAME"); err != nil {
		return err
	}
	t := cluster.Tenant{Name: c.Args().First(), MaxWorkers: c.Int("max-workers")}
	if s := c.String("max-memory"); s != "" {
		m, err := cluster.ParseBytes(s)
		if err != nil {
			return commands.UsageErr("--max-memory: %v", err)
		}
		t.MaxMemory = m
	}
	if err := t.Validate(); err != nil {
		return commands.UsageErr("%v", err)
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	if err := cl.CreateTenant(c.Context, t); err != nil {
		return commands.APIErr(c, err)
	}
	fmt.Fprintf(c.App.Writer, "tenant %s created\n", t.Name)
	return nil
}

func tenantList(c *cli.Context) error {
	if err := commands.WantArgs(c, 0, "no arguments"); err != nil {
		return err
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	ts, err := cl.Tenants(c.Context)
	if err != nil {
		return commands.APIErr(c, err)
	}
	return commands.PrintOut(c, ts, func(w io.Writer) {
		fmt.Fprintln(w, "NAME\tJOBS\tWORKERS\tMAX WORKERS\tMEMORY\tMAX MEMORY")
		for _, t := range ts {
			maxW, maxM := "-", "-"
			if t.MaxWorkers > 0 {
				maxW = fmt.Sprint(t.MaxWorkers)
			}
			if t.MaxMemory > 0 {
				maxM = t.MaxMemory.String()
			}
			fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\t%s\n", commands.Clip(t.Name, 24), t.Jobs, t.UsedWorkers, maxW, t.UsedMemory, maxM)
		}
	})
}

func tenantToken(c *cli.Context) error {
	if err := commands.WantName(c, "the tenant NAME"); err != nil {
		return err
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	token, err := cl.TenantToken(c.Context, c.Args().First())
	if err != nil {
		return commands.APIErr(c, err)
	}
	fmt.Fprintln(c.App.Writer, token)
	return nil
}
