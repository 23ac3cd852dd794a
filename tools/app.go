// Package tools is stormdock's command-line application: the commands of its sub-packages
// gathered into one app. The client commands are in commands/<noun>, the daemons' entry
// points in daemons, and bench, demo and the example worker in packages of their own.
package tools

import (
	"fmt"
	"runtime/debug"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/tools/bench"
	"github.com/stormdock/stormdock/tools/commands/cluster"
	"github.com/stormdock/stormdock/tools/commands/dc"
	"github.com/stormdock/stormdock/tools/commands/events"
	"github.com/stormdock/stormdock/tools/commands/image"
	"github.com/stormdock/stormdock/tools/commands/job"
	"github.com/stormdock/stormdock/tools/commands/link"
	"github.com/stormdock/stormdock/tools/commands/node"
	"github.com/stormdock/stormdock/tools/commands/plan"
	"github.com/stormdock/stormdock/tools/commands/run"
	"github.com/stormdock/stormdock/tools/commands/secret"
	"github.com/stormdock/stormdock/tools/commands/tenant"
	"github.com/stormdock/stormdock/tools/daemons"
	"github.com/stormdock/stormdock/tools/demo"
	"github.com/stormdock/stormdock/tools/worker"
)

// Version is set at build time with -ldflags "-X github.com/stormdock/stormdock/tools.Version=...".
var Version = ""

// App returns the stormdock command-line application.
func App() *cli.App {
	return &cli.App{
		Name:                 "stormdock",
		Usage:                "deploy and keep alive long-running streaming jobs on many machines",
		Version:              version(),
		EnableBashCompletion: true,
		HideVersion:          true,
		Description: "Flags may come before or after positional arguments (`stormdock job submit FILE --wait`\n" +
			"works); after `--` everything is an argument.\n" +
			"Exit codes: 0 ok, 1 failed, 2 bad usage or input.",
		Commands: []*cli.Command{
			daemons.UpCommand,
			demo.Command,
			daemons.MasterCommand,
			job.Command,
			node.Command,
			tenant.Command,
			secret.Command,
			dc.Command,
			events.Command,
			VersionCommand,
			daemons.AgentCommand,
			daemons.LaunchCommand,
			daemons.KeeperCommand,
			worker.Command,
			plan.Command,
			bench.Command,
			run.Command,
			image.Command,
			daemons.RouterCommand,
			link.Command,
			cluster.Command,
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return cli.Exit(fmt.Sprintf("stormdock: unknown command %q (see stormdock --help)", c.Args().First()), 2)
			}
			return cli.ShowAppHelp(c)
		},
		OnUsageError: func(c *cli.Context, err error, _ bool) error {
			return cli.Exit(fmt.Sprintf("%s: %v (see --help)", c.App.Name, err), 2)
		},
	}
}

// VersionCommand prints the build's version.
var VersionCommand = &cli.Command{
	Name:  "version",
	Usage: "print the version of this stormdock binary",
	Action: func(c *cli.Context) error {
		fmt.Fprintf(c.App.Writer, "stormdock %s\n", version())
		return nil
	},
}

func version() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		v := bi.Main.Version
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " (" + s.Value[:12] + ")"
			}
		}
		if v != "" {
			return v
		}
	}
	return "(devel)"
}
