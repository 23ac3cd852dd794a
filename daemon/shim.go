package daemon

import (
	"log/slog"
	"os"
	"sync"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/isolation/shim"
)

var noShimOnce sync.Once

// selfShim is the process driver's shim when it is the running stormdock binary itself.
const selfShim = "/proc/self/exe"

// Launchers picks what every process worker starts as: the process driver's shim, which runs
// the agent's lease launcher in place, both one binary. That is stormdock-shim beside the
// stormdock binary self where there is one: about a millisecond of cpu per start instead of
// the whole binary's package initialisation. Otherwise (a go run build) it is self.
//
// The launcher runs as the workers' users (each tenant's uid, or runAs) and runs a job's
// `stormdock ...` command by its path, which they must then reach. Where they cannot (self
// in a directory only its owner may enter), self is the launcher again: it runs such
// commands through /proc/self/exe, past the directories, at the whole binary's start cost.
// Only a runAs that is the agent's own user runs nothing as another user.
func Launchers(self string, runAs *isolation.User, log *slog.Logger) (shimBin, launcher string) {
	p, ok := shim.Beside(self)
	workers := agents.AnyUser
	if runAs != nil {
		workers = *runAs
	}
	switch {
	case !ok:
		// Once per process: a local cluster builds many agents.
		noShimOnce.Do(func() {
			log.Info("no "+shim.Name+" beside the stormdock binary: every worker starts through the whole binary (several ms more cpu per start); install "+shim.Name+" beside it",
				"binary", self)
		})
	case !agents.MayRun(self, workers) && !(runAs != nil && int(runAs.UID) == os.Geteuid()):
		log.Info("the workers' users cannot run the stormdock binary by its path: workers start through the whole binary, not "+shim.Name,
			"user", workers.String(), "binary", self)
	default:
		return p, p
	}
	return selfShim, self
}
