package tools

import (
	"errors"
	"flag"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/agents"
)

// launchRun is `stormdock launch`: it parses its command line with the type the agent
// writes it with. Exit codes: 1 for a bad or missing flag, 2 without a command, 127 when the
// worker cannot start, and otherwise the worker's own (agents.ExitLike).
func launchRun(c *cli.Context) error {
	var cfg agents.LaunchConfig
	if err := cfg.Parse(c.Args().Slice()); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cli.ShowCommandHelp(c, c.Command.Name)
		}
		return cli.Exit(fmt.Sprintf("stormdock launch: %v (see --help)", err), 1)
	}
	if len(cfg.Command) == 0 {
		return cli.Exit("stormdock launch: no command given (flags first, then -- COMMAND)", 2)
	}
	ws, err := agents.Launch(c.Context, cfg)
	if err != nil && !errors.Is(err, agents.ErrLeaseExpired) {
		return cli.Exit("stormdock launch: "+err.Error(), 127)
	}
	agents.ExitLike(ws)
	return nil
}
