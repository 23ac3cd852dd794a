package launcher

import (
	"flag"
	"slices"
	"time"

	"github.com/stormdock/stormdock/internal/cmdline"
)

// Command is the name of the subcommand that runs the lease launcher, in stormdock-shim and
// (hidden) in stormdock. Agents write its command lines with Config.Args; Main reads them
// with Config.Parse.
const Command = "launch"

// DefaultGrace is the time between SIGTERM and SIGKILL when a command line names none: the
// default grace period of a job (cluster.DefaultGracePeriod, which a test keeps equal; this
// package imports nothing heavy to say so).
const DefaultGrace = 10 * time.Second

// flags binds the flags of `launch` to c's fields, with their defaults.
func (c *Config) flags() *flag.FlagSet {
	fs := cmdline.NewFlagSet(Command)
	fs.StringVar(&c.Lease, "lease", "", "lease `FILE` whose age the launcher watches (required)")
	fs.DurationVar(&c.TTL, "ttl", 0, "stop the worker when the lease is older than this (required)")
	fs.DurationVar(&c.Grace, "grace", DefaultGrace, "time between SIGTERM and SIGKILL")
	return fs
}

// Args is the command line of `launch` for c, after the subcommand's name: every flag, then
// "--" and the worker's command, which may thus start with a dash. Parse reads it back;
// Check and Stderr are not part of it.
func (c Config) Args() []string {
	args := []string{"--lease", c.Lease, "--ttl", c.TTL.String(), "--grace", c.Grace.String(), "--"}
	return append(args, c.Command...)
}

// Parse sets c's Lease, TTL, Grace and Command from a command line of `launch` after the
// subcommand's name: flags first, then the command, after "--" or from the first argument
// that is not a flag. --lease and --ttl are required, --grace defaults to DefaultGrace; -h or
// --help gives flag.ErrHelp. An empty command is no error here (Run refuses it), so that the
// caller can say how to give one. On error c is left as it was.
func (c *Config) Parse(args []string) error {
	var p Config
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

// Usage lists the flags of `launch`, for its help.
func Usage() string {
	var c Config
	return cmdline.Usage(c.flags())
}
