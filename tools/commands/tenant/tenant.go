// Package tenant is `stormdock tenant`: create tenants, list them and issue their tokens
// through a master's API, and let the admin change their caps.
package tenant

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/images"
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
				&cli.StringFlag{Name: "max-memory", Usage: "most memory the tenant's workers may ask for together, like 64Gi (empty: no cap)"},
				maxPriorityFlag),
			Action: tenantCreate,
		},
		{
			Name:      "update",
			Usage:     "change a tenant's quota and priority cap (admin only); flags not given stay as they are",
			ArgsUsage: "NAME",
			Flags: append(commands.MasterFlags(),
				&cli.IntFlag{Name: "max-workers", Usage: "most workers the tenant's jobs may have together (0: no cap)"},
				&cli.StringFlag{Name: "max-memory", Usage: "most memory the tenant's workers may ask for together, like 64Gi (0: no cap)"},
				maxPriorityFlag),
			Action: tenantUpdate,
		},
		{
			Name:      "token",
			Usage:     "make a new API token for a tenant (the old one stops working); shown once",
			ArgsUsage: "NAME",
			Flags:     commands.MasterFlags(),
			Action:    tenantToken,
		},
		{
			Name: "registry-auth",
			Usage: "give a tenant registry credentials (Docker's config.json; - reads stdin), used for its images alone; " +
				"--clear removes them (the admin for any tenant, a tenant's token for its own)",
			ArgsUsage: "NAME FILE|-",
			Flags:     append(commands.MasterFlags(), &cli.BoolFlag{Name: "clear", Usage: "remove the tenant's registry credentials (no FILE)"}),
			Action:    tenantRegistryAuth,
		},
		{
			Name:   "list",
			Usage:  "list tenants with their quota and use",
			Flags:  append(commands.MasterFlags(), commands.OutputFlag),
			Action: tenantList,
		},
	},
}

// maxPriorityFlag is the tenant's priority cap. Its default, 0, is the lowest class:
// preemption takes only workers of strictly lower priority, so such a tenant preempts no one.
var maxPriorityFlag = &cli.IntFlag{Name: "max-priority",
	Usage: fmt.Sprintf("highest priority the tenant's jobs may ask for, 0 to %d (0, the lowest class: its jobs preempt no one)", cluster.MaxPriority)}

func tenantCreate(c *cli.Context) error {
	if err := commands.WantName(c, "the tenant NAME"); err != nil {
		return err
	}
	t := cluster.Tenant{Name: c.Args().First(), MaxWorkers: c.Int("max-workers"), MaxPriority: c.Int("max-priority")}
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

func tenantUpdate(c *cli.Context) error {
	if err := commands.WantName(c, "the tenant NAME"); err != nil {
		return err
	}
	var ch api.TenantChange
	if c.IsSet("max-workers") {
		n := c.Int("max-workers")
		ch.MaxWorkers = &n
	}
	if c.IsSet("max-memory") {
		m, err := cluster.ParseBytes(c.String("max-memory"))
		if err != nil {
			return commands.UsageErr("--max-memory: %v", err)
		}
		ch.MaxMemory = &m
	}
	if c.IsSet("max-priority") {
		n := c.Int("max-priority")
		ch.MaxPriority = &n
	}
	if ch == (api.TenantChange{}) {
		return commands.UsageErr("nothing to change: give --max-workers, --max-memory or --max-priority")
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	t, err := cl.UpdateTenant(c.Context, c.Args().First(), ch)
	if err != nil {
		return commands.APIErr(c, err)
	}
	fmt.Fprintf(c.App.Writer, "tenant %s updated: max priority %d\n", t.Name, t.MaxPriority)
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
		fmt.Fprintln(w, "NAME\tUID\tJOBS\tWORKERS\tMAX WORKERS\tMEMORY\tMAX MEMORY\tMAX PRIORITY\tREGISTRY-AUTH")
		for _, t := range ts {
			maxW, maxM := "-", "-"
			if t.MaxWorkers > 0 {
				maxW = fmt.Sprint(t.MaxWorkers)
			}
			if t.MaxMemory > 0 {
				maxM = t.MaxMemory.String()
			}
			uid := "-" // a tenant stored before uids, until the leading master gives it one
			if t.UID > 0 {
				uid = fmt.Sprint(t.UID)
			}
			regAuth := "no"
			if t.RegistryAuth {
				regAuth = "yes (" + strings.Join(t.RegistryHosts, ", ") + ")"
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%d\t%s\n", commands.Clip(t.Name, 24), uid, t.Jobs, t.UsedWorkers, maxW, t.UsedMemory, maxM, t.PriorityCap(), regAuth)
		}
	})
}

// tenantRegistryAuth sends a tenant's registry credentials, checked here first with the
// parser the master uses, so that a wrong file is refused before any request. Nothing of the
// file is ever printed.
func tenantRegistryAuth(c *cli.Context) error {
	name := c.Args().First()
	if c.Bool("clear") {
		if err := commands.WantName(c, "the tenant NAME (and no FILE with --clear)"); err != nil {
			return err
		}
	} else {
		if err := commands.WantArgs(c, 2, "the tenant NAME and a FILE in Docker's config.json format (- for stdin)"); err != nil {
			return err
		}
		if err := cluster.CheckName(name); err != nil {
			return commands.UsageErr("the tenant NAME: %v", err)
		}
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	if c.Bool("clear") {
		if err := cl.ClearRegistryAuth(c.Context, name); err != nil {
			return commands.APIErr(c, err)
		}
		fmt.Fprintf(c.App.Writer, "tenant %s: registry credentials removed\n", name)
		return nil
	}
	file := c.Args().Get(1)
	var data []byte
	if file == "-" {
		data, err = io.ReadAll(io.LimitReader(c.App.Reader, api.MaxBodyBytes+1))
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return commands.UsageErr("read registry credentials %s: %v", file, err)
	}
	source := file
	if file == "-" {
		source = "stdin"
	}
	if _, err := images.ParseAuth(data, source); err != nil {
		return commands.UsageErr("%s: %v", source, err)
	}
	hosts, err := cl.SetRegistryAuth(c.Context, name, data)
	if err != nil {
		return commands.APIErr(c, err)
	}
	fmt.Fprintf(c.App.Writer, "tenant %s: registry credentials set for %s\n", name, strings.Join(hosts, ", "))
	return nil
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
