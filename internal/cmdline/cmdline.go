// Package cmdline holds what stormdock's typed command lines share. Those are the command
// lines one stormdock process writes for another to read (launcher.Config for
// `stormdock-shim launch`, multidc.RouterArgs for `stormdock router`): each type builds its argv
// with Args and reads it back with Parse, on the standard flag package, so that writer and
// reader are one piece of code and cannot drift apart.
package cmdline

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// NewFlagSet returns a flag set that reports errors to its caller rather than printing them
// or exiting. Like urfave/cli, the flag package takes both -name and --name.
func NewFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// Parse parses args into fs and checks that each flag named in required was given (even
// with an empty value). -h or --help gives flag.ErrHelp.
func Parse(fs *flag.FlagSet, args []string, required ...string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var missing []string
	for _, name := range required {
		if !given[name] {
			missing = append(missing, name)
		}
	}
	switch len(missing) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("required flag %q not set", missing[0])
	}
	return fmt.Errorf("required flags %q not set", strings.Join(missing, ", "))
}

// Usage lists fs's flags for a command's help text, one per line (no final newline): --name VALUE, what it
// is, and its default when it has one.
func Usage(fs *flag.FlagSet) string {
	type line struct{ left, right string }
	var lines []line
	width := 0
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		left := "--" + f.Name
		if arg != "" {
			left += " " + arg
		}
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "0s" {
			usage += " (default: " + f.DefValue + ")"
		}
		lines = append(lines, line{left, usage})
		width = max(width, len(left))
	})
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = fmt.Sprintf("   %-*s  %s", width, l.left, l.right)
	}
	return strings.Join(out, "\n")
}
