package tools

import (
	"fmt"
	"io"

	"github.com/stormdock/stormdock/cluster"
	"github.com/urfave/cli/v2"
)

// TenantCommand manages tenants and their quotas.
var TenantCommand = &cli.Command{
	Name:  "tenant",
	Usage: "create and list tenants",
	Subcommands: []*cli.Command{
		{
			Name:      "create",
			Usage:     "create a tenant with its quota",
			ArgsUsage: "NAME",
			Flags: append(masterFlags(),
				&cli.IntFlag{Name: "max-workers", Usage: "most workers the tenant's jobs may have together (0: no cap)"},
				&cli.StringFlag{Name: "max-memory", Usage: "most memory the tenant's workers may ask for together, like 64Gi (empty: no cap)"}),
			Action: tenantCreate,
		},
		{
			Name:      "token",
			Usage:     "make a new API token for a tenant (the old one stops working); shown once",
			ArgsUsage: "NAME",
			Flags:     masterFlags(),
			Action:    tenantToken,
		},
		{
			Name:   "list",
			Usage:  "list tenants with their quota and use",
			Flags:  append(masterFlags(), outputFlag),
			Action: tenantList,
		},
	},
}

func tenantCreate(c *cli.Context) error {
	if err := wantName(c, "the tenant NAME"); err != nil {
		return err
	}
	t := cluster.Tenant{Name: c.Args().First(), MaxWorkers: c.Int("max-workers")}
	if s := c.String("max-memory"); s != "" {
		m, err := cluster.ParseBytes(s)
		if err != nil {
			return usageErr("--max-memory: %v", err)
		}
		t.MaxMemory = m
	}
	if err := t.Validate(); err != nil {
		return usageErr("%v", err)
	}
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	if err := cl.CreateTenant(c.Context, t); err != nil {
		return apiErr(c, err)
	}
	fmt.Fprintf(c.App.Writer, "tenant %s created\n", t.Name)
	return nil
}

func tenantList(c *cli.Context) error {
	if err := wantArgs(c, 0, "no arguments"); err != nil {
		return err
	}
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	ts, err := cl.Tenants(c.Context)
	if err != nil {
		return apiErr(c, err)
	}
	return printOut(c, ts, func(w io.Writer) {
		fmt.Fprintln(w, "NAME\tJOBS\tWORKERS\tMAX WORKERS\tMEMORY\tMAX MEMORY")
		for _, t := range ts {
			maxW, maxM := "-", "-"
			if t.MaxWorkers > 0 {
				maxW = fmt.Sprint(t.MaxWorkers)
			}
			if t.MaxMemory > 0 {
				maxM = t.MaxMemory.String()
			}
			fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\t%s\n", clip(t.Name, 24), t.Jobs, t.UsedWorkers, maxW, t.UsedMemory, maxM)
		}
	})
}

func tenantToken(c *cli.Context) error {
	if err := wantName(c, "the tenant NAME"); err != nil {
		return err
	}
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	token, err := cl.TenantToken(c.Context, c.Args().First())
	if err != nil {
		return apiErr(c, err)
	}
	fmt.Fprintln(c.App.Writer, token)
	return nil
}
