// Command stormdock-shim is the small binary every process worker starts with: the process
// driver's shim (package shim), which waits until it is placed in the worker's cgroup and
// drops to the worker's user, and, run in place by it, the lease launcher (`stormdock-shim
// launch ...`, package launcher), which runs the worker and stops it when its lease lapses.
// It imports nothing else, so that what runs in every worker's process tree starts in about
// a millisecond of cpu; install it beside the stormdock binary, where agents look for it.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/stormdock/stormdock/agents/launcher"
	"github.com/stormdock/stormdock/isolation/shim"
)

func main() {
	// The agent sends a worker SIGHUP when its live configuration changes, which may be
	// right after it starts (its job's routers starting): while this process is the shim,
	// and then the launcher until it listens for it, SIGHUP must not kill it. Ignored, it
	// stays ignored across the exec into the launcher, which takes it up with Notify.
	signal.Ignore(syscall.SIGHUP)
	// As the shim this returns only when the program is this binary: the launcher, run in
	// place with its own argv.
	shim.Run()
	if len(os.Args) >= 2 && os.Args[1] == launcher.Command {
		os.Exit(launcher.Main(os.Args[2:], os.Stderr))
	}
	fmt.Fprintf(os.Stderr, "usage: %s %s --lease FILE --ttl D [--grace D] -- COMMAND [ARGS...]\n"+
		"%s is started by stormdock's process driver and agents; it is not meant to be run by hand.\n",
		shim.Name, launcher.Command, shim.Name)
	os.Exit(2)
}
