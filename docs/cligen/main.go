// Command cligen writes docs/cli.md, the command reference, from the CLI's own command tree:
// `go generate ./docs` runs it.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/stormdock/stormdock/docs"
	"github.com/stormdock/stormdock/tools"
)

func main() {
	out := flag.String("o", "cli.md", "`FILE` to write")
	flag.Parse()
	if err := os.WriteFile(*out, []byte(docs.CLIReference(tools.App())), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "cligen:", err)
		os.Exit(1)
	}
}
