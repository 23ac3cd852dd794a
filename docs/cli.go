package docs

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
)

// CLIReference renders app's command tree as markdown: every visible command, its usage,
// arguments, description and flags. It replaces urfave/cli's own ToMarkdown, which prints
// neither arguments nor environment variables and leaves the placeholders of flag values out.
//
// Defaults that come from the environment of whoever renders it are written as a reader's
// (the home directory as ~, a STORMDOCK_DATA set as the default it overrides), so that the
// file is the same on every machine.
func CLIReference(app *cli.App) string {
	var b strings.Builder
	b.WriteString("# stormdock command reference\n\n")
	b.WriteString("<!-- Generated from the CLI's command tree by `go generate ./docs`; do not edit. -->\n\n")
	fmt.Fprintf(&b, "`%s`: %s.\n\n", app.Name, app.Usage)
	if app.Description != "" {
		b.WriteString(app.Description + "\n\n")
	}
	b.WriteString("Every command takes `--help`; `stormdock help COMMAND...` prints the same.\n\n")
	b.WriteString("## Commands\n\n")
	for _, c := range visible(app.Commands) {
		index(&b, []string{app.Name}, c, 0)
	}
	b.WriteString("\n")
	for _, c := range visible(app.Commands) {
		command(&b, []string{app.Name}, c)
	}
	return normalize(b.String())
}

func visible(cmds []*cli.Command) []*cli.Command {
	var out []*cli.Command
	for _, c := range cmds {
		if !c.Hidden && c.Name != "help" {
			out = append(out, c)
		}
	}
	return out
}

func index(b *strings.Builder, parents []string, c *cli.Command, depth int) {
	path := append(append([]string{}, parents...), c.Name)
	full := strings.Join(path, " ")
	fmt.Fprintf(b, "%s- [`%s`](#%s): %s\n", strings.Repeat("  ", depth), full, anchor(full), c.Usage)
	for _, s := range visible(c.Subcommands) {
		index(b, path, s, depth+1)
	}
}

// anchor is the id GitHub gives a heading.
func anchor(heading string) string {
	return strings.ReplaceAll(strings.ToLower(heading), " ", "-")
}

func command(b *strings.Builder, parents []string, c *cli.Command) {
	path := append(append([]string{}, parents...), c.Name)
	full := strings.Join(path, " ")
	level := len(path)
	if level > 4 {
		level = 4
	}
	fmt.Fprintf(b, "%s %s\n\n", strings.Repeat("#", level), full)
	b.WriteString(c.Usage + ".\n\n")
	if len(c.Aliases) > 0 {
		fmt.Fprintf(b, "Also: `%s`.\n\n", strings.Join(c.Aliases, "`, `"))
	}
	subs := visible(c.Subcommands)
	usage := full
	if len(visibleFlags(c.Flags)) > 0 {
		usage += " [options]"
	}
	if len(subs) > 0 {
		usage += " COMMAND"
	} else if c.ArgsUsage != "" {
		usage += " " + c.ArgsUsage
	}
	if c.UsageText != "" {
		usage = strings.TrimSpace(c.UsageText)
	}
	fmt.Fprintf(b, "```\n%s\n```\n\n", usage)
	if c.Description != "" {
		b.WriteString(strings.TrimSpace(c.Description) + "\n\n")
	}
	if fl := visibleFlags(c.Flags); len(fl) > 0 {
		b.WriteString("| flag | default | meaning |\n| --- | --- | --- |\n")
		for _, f := range fl {
			flag(b, f)
		}
		b.WriteString("\n")
	}
	if len(subs) > 0 {
		b.WriteString("Commands:\n\n")
		for _, s := range subs {
			fmt.Fprintf(b, "- [`%s %s`](#%s): %s\n", full, s.Name, anchor(full+" "+s.Name), s.Usage)
		}
		b.WriteString("\n")
		for _, s := range subs {
			command(b, path, s)
		}
	}
}

func visibleFlags(flags []cli.Flag) []cli.Flag {
	var out []cli.Flag
	for _, f := range flags {
		if v, ok := f.(cli.VisibleFlag); ok && !v.IsVisible() {
			continue
		}
		out = append(out, f)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Names()[0] < out[j].Names()[0] })
	return out
}

func flag(b *strings.Builder, f cli.Flag) {
	d, ok := f.(cli.DocGenerationFlag)
	if !ok {
		fmt.Fprintf(b, "| `--%s` | | |\n", strings.Join(f.Names(), "`, `--"))
		return
	}
	placeholder, usage := unquote(d.GetUsage())
	if placeholder == "" && d.TakesValue() {
		placeholder = "value"
	}
	var names []string
	for _, n := range f.Names() {
		dash := "--"
		if len(n) == 1 {
			dash = "-"
		}
		name := dash + n
		if d.TakesValue() {
			name += " " + placeholder
		}
		names = append(names, "`"+name+"`")
	}
	def := d.GetDefaultText()
	if !d.TakesValue() && def == "false" {
		def = ""
	}
	if def != "" {
		def = "`" + def + "`"
	}
	if s, ok := f.(cli.DocGenerationSliceFlag); ok && s.IsSliceFlag() && !strings.Contains(usage, "repeat") {
		usage += " (repeatable)"
	}
	if env := d.GetEnvVars(); len(env) > 0 {
		usage += "; environment: `" + strings.Join(env, "`, `") + "`"
	}
	fmt.Fprintf(b, "| %s | %s | %s |\n", strings.Join(names, ", "), cell(def), cell(usage))
}

// unquote takes the first `word` of a usage text as the flag value's placeholder, as
// urfave/cli's help does.
func unquote(usage string) (string, string) {
	i := strings.IndexByte(usage, '`')
	if i < 0 {
		return "", usage
	}
	j := strings.IndexByte(usage[i+1:], '`')
	if j < 0 {
		return "", usage
	}
	name := usage[i+1 : i+1+j]
	return name, usage[:i] + name + usage[i+1+j+1:]
}

func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}

func normalize(s string) string {
	// The data directory's default is read from STORMDOCK_DATA when the flags are made.
	if dir := os.Getenv("STORMDOCK_DATA"); dir != "" {
		s = strings.ReplaceAll(s, fmt.Sprintf("%q", dir), `"~/.stormdock"`)
	}
	if home, err := os.UserHomeDir(); err == nil && home != "/" && home != "" {
		s = strings.ReplaceAll(s, home+"/", "~/")
	}
	return s
}
