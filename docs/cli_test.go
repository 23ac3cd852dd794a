package docs

import (
	"os"
	"strings"
	"testing"

	"github.com/stormdock/stormdock/tools"
	"github.com/urfave/cli/v2"
)

// app is the CLI's command tree: the one place these tests name the CLI's constructor.
func app() *cli.App { return tools.App() }

// TestCLIReferenceIsCurrent fails when cli.md is not what the CLI's command tree renders:
// a command, flag or help text changed without the reference.
func TestCLIReferenceIsCurrent(t *testing.T) {
	want := CLIReference(app())
	got, err := os.ReadFile("cli.md")
	if err != nil {
		t.Fatalf("read the command reference: %v (make it with `go generate ./docs`)", err)
	}
	if string(got) == want {
		return
	}
	g, w := strings.Split(string(got), "\n"), strings.Split(want, "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			t.Fatalf("docs/cli.md is stale: regenerate it with `go generate ./docs`\nline %d is\n\t%s\nthe CLI renders\n\t%s", i+1, gl, wl)
		}
	}
}

// TestCLIReferenceRendersTheTree checks what the renderer makes of the CLI's tree: a command
// under its parent with its arguments, flags, environment variables and index entry, and no
// hidden command.
func TestCLIReferenceRendersTheTree(t *testing.T) {
	tree := app()
	md := CLIReference(tree)
	for _, want := range []string{
		"### stormdock job submit\n",
		"stormdock job submit [options] FILE\n",
		"| `--master URL` |",
		"environment: `STORMDOCK_MASTER`",
		"- [`stormdock job submit`](#stormdock-job-submit): ",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the reference lacks %q", want)
		}
	}
	for _, c := range tree.Commands {
		if c.Hidden && strings.Contains(md, "## stormdock "+c.Name+"\n") {
			t.Errorf("hidden command %q is in the reference", c.Name)
		}
	}
}
