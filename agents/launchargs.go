package agents

import (
	"flag"
	"slices"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/cmdline"
)

// LaunchCommand is the name of the stormdock subcommand that runs the lease launcher. It is
// hidden: agents write its command lines, with LaunchConfig.Args, and the subcommand reads
// them with LaunchConfig.Parse.
const LaunchCommand = "launch"

// flags binds the flags of `stormdock launch` to c's fields, with their defaults.
func (c *LaunchConfig) flags() *flag.FlagSet {
	fs := cmdline.NewFlagSet(LaunchCommand)
	fs.StringVar(&c.Lease, "lease", "", "lease `FILE` whose age the launcher watches (required)")
	fs.DurationVar(&c.TTL, "ttl", 0, "stop the worker when the lease is older than this (required)")
	fs.DurationVar(&c.Grace, "grace", cluster.DefaultGracePeriod, "time between SIGTERM and SIGKILL")
	return fs
}

// Args is the command line of `stormdock launch` for c, after the subcommand's name: every
// flag, then "--" and the worker's command, which may thus start with a dash. Parse reads it
// back; Check and Stderr are not part of it.
func (c LaunchConfig) Args() []string {
	args := []string{"--lease", c.Lease, "--ttl", c.TTL.String(), "--grace", c.Grace.String(), "--"}
	return append(args, c.Command...)
}

// Parse sets c's Lease, TTL, Grace and Command from a command line of `stormdock launch`
// after the subcommand's name: flags first, then the command, after "--" or from the first
// argument that is not a flag. --lease and --ttl are required, --grace defaults to
// cluster.DefaultGracePeriod; -h or --help gives flag.ErrHelp. An empty command is no error
// here (Launch refuses it), so that the caller can say how to give one. On error c is left
// as it was.
func (c *LaunchConfig) Parse(args []string) error {
	var p LaunchConfig
	fs := p.flags()
	if err := cmdline.Parse(fs, args, "lease", "ttl"); err != nil {
		return err
	}
	c.Lease, c.TTL, c.Grace = p.Lease, p.TTL, p.Grace
	c.Command = nil
	if fs.NArg() > 0 {
		c.Command = slices.Clone(fs.Args())
	}
	return nil
}

// LaunchUsage lists the flags of `stormdock launch`, for its help.
func LaunchUsage() string {
	var c LaunchConfig
	return cmdline.Usage(c.flags())
}
