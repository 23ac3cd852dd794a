package tools

import (
	"context"
	"strings"

	"github.com/urfave/cli/v2"
)

// reorderArgs moves the flags that follow a leaf command's positional arguments in front
// of them, so that `stormdock job submit FILE --master URL` works as scripts write it:
// urfave/cli stops reading flags at the first positional argument. Everything after "--"
// stays as it is.
func reorderArgs(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	cmds := app.Commands
	var leaf *cli.Command
	i := 1
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" || strings.HasPrefix(a, "-") {
			if leaf == nil {
				return args // global flags first: leave the line to urfave/cli
			}
			break
		}
		next := findCommand(cmds, a)
		if next == nil {
			break
		}
		leaf = next
		cmds = next.Subcommands
	}
	if leaf == nil || len(leaf.Subcommands) > 0 {
		return args
	}
	takesValue := map[string]bool{}
	known := map[string]bool{}
	for _, f := range leaf.Flags {
		_, isBool := f.(*cli.BoolFlag)
		for _, n := range f.Names() {
			known[n] = true
			takesValue[n] = !isBool
		}
	}
	var flags, pos []string
	rest := args[i:]
	for j := 0; j < len(rest); j++ {
		a := rest[j]
		if a == "--" {
			pos = append(pos, rest[j:]...)
			break
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && len(a) > 1 && known[name] {
			flags = append(flags, a)
			if takesValue[name] && !hasValue && j+1 < len(rest) {
				flags = append(flags, rest[j+1])
				j++
			}
			continue
		}
		pos = append(pos, a)
	}
	out := append([]string{}, args[:i]...)
	out = append(out, flags...)
	return append(out, pos...)
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.Name == name {
			return c
		}
		for _, a := range c.Aliases {
			if a == name {
				return c
			}
		}
	}
	return nil
}

// Run runs stormdock with args (os.Args), after moving trailing flags in front of the
// positional arguments of the command they belong to.
func Run(ctx context.Context, args []string) error {
	app := App()
	return app.RunContext(ctx, reorderArgs(app, args))
}
