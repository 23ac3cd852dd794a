package master

import (
	"context"
	"time"

	"github.com/stormdock/stormdock/cluster"
)

// What the package's cluster tests (package master_test, which runs on clustertest's
// cluster) read of its internals.

// RolloutCrashRestarts is how many restarts mark a replaced worker crash-looping.
const RolloutCrashRestarts = rolloutCrashRestarts

// MirrorView is the cluster as m's mirrors hold it now.
func (m *Master) MirrorView() *View { return m.view() }

// InGrace reports whether m waits for nodes to re-register, and until when.
func (m *Master) InGrace() (bool, time.Time) { return m.inGrace() }

// ObserveEvents has a reconciler of m's term that began at since observe jobs as its
// first view of the cluster.
func ObserveEvents(m *Master, since time.Time, jobs map[string]cluster.JobRecord) {
	v := &View{jobs: map[string]Job{}}
	for name, rec := range jobs {
		v.jobs[name] = Job{rec: rec}
	}
	r := &reconciler{m: m, since: since}
	r.observeEvents(v)
}

// HoldCommits makes hook run before each of m's assignment transactions: it returns the
// context to send the transaction with and a function that gets its outcome. nil removes
// the hook.
func HoldCommits(m *Master, hook func(ctx context.Context) (context.Context, func(error))) {
	if hook == nil {
		m.beforeCommit.Store(nil)
		return
	}
	h := commitHook(hook)
	m.beforeCommit.Store(&h)
}

// AvoidFor is how long the strikes-th crash loop of a job on a node keeps it off the node.
func AvoidFor(cfg Config, strikes int) time.Duration {
	cfg.defaults()
	return cfg.avoidFor(strikes)
}

// Heal is what time passing does to a node's avoidances at now.
func Heal(cfg Config, nc cluster.NodeConf, now time.Time) (cluster.NodeConf, []string, bool) {
	cfg.defaults()
	return cfg.heal(nc, now)
}
