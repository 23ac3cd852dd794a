package daemons

import (
	"errors"
	"flag"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/agents/launcher"
)

// launchRun is `stormdock launch`, the lease launcher in the whole binary (agents run
// stormdock-shim launch where they find it): the same parser and exit codes as
// stormdock-shim's. Exit codes: 1 for a bad or missing flag, 2 without a command, 127 when
// the worker cannot start, launcher.ExitLeaseLapsed (75) when the lease lapsed and the
// launcher stopped the worker, and otherwise the worker's own (launcher.ExitLike).
func launchRun(c *cli.Context) error {
	var cfg launcher.Config
	if err := cfg.Parse(c.Args().Slice()); errors.Is(err, flag.ErrHelp) {
		return cli.ShowCommandHelp(c, c.Command.Name)
	}
	if code := launcher.Main(c.Args().Slice(), c.App.ErrWriter); code != 0 {
		return cli.Exit("", code)
	}
	return nil
}
