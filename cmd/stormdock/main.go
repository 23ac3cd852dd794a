// Command stormdock is the one binary of stormdock: master, agent, command-line tools,
// local cluster and the example worker.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/stormdock/stormdock/tools"
	"github.com/urfave/cli/v2"
)

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "worker" || os.Args[1] == "launch") {
		// A worker's agent sends SIGHUP when its live configuration changes, which may be
		// right after it starts (its job's routers starting): until the lease launcher and
		// the worker listen for it (they do, with signal.Notify), SIGHUP must not kill them.
		signal.Ignore(syscall.SIGHUP)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := tools.Run(ctx, os.Args)
	stop()
	if err != nil {
		if ec, ok := err.(cli.ExitCoder); ok {
			if msg := ec.Error(); msg != "" {
				fmt.Fprintln(os.Stderr, msg)
			}
			os.Exit(ec.ExitCode())
		}
		fmt.Fprintln(os.Stderr, "stormdock:", err)
		os.Exit(1)
	}
}
