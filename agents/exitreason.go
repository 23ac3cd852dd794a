package agents

import (
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	"github.com/stormdock/stormdock/agents/launcher"
	"github.com/stormdock/stormdock/agents/leasefile"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/isolation"
)

// lapseSlack is how long after its lease lapsed a worker's end may still be the launcher's
// doing, beyond the worker's grace period: the launcher's check interval (100ms at most),
// the kill, the reaping and the driver's report.
const lapseSlack = 2 * time.Second

// lapsedStop is LastExit of a worker its launcher stopped for a lapsed lease.
const lapsedStop = "stopped: lease lapsed (not counted as a crash)"

// exitReason tells a worker's own failure (cluster.ExitCrashed) from its launcher stopping it
// for a lapsed lease (cluster.ExitLeaseLapsed), for an end the agent did not ask for (the
// agent's own stops, evictions included, never come here: see stopped). The launcher's
// status alone is not enough: a tenant's program may exit with it too, and it runs as the
// tenant's user, so anything it writes the worker could forge. The agent trusts the status
// only when its own view agrees: the node lease (which the worker can read, never write)
// was past its ttl when the worker ended, or the keeper recorded a lapse that ended within
// the worker's grace before that, or the lease is of a later generation than when the worker
// began to run (started: the keeper renewed it after a lapse, or began anew, while the worker
// ran; only the keeper writes the lease).
func (a *Agent) exitReason(ex isolation.Exit, lost error, grace time.Duration, st KeeperStatus, began leaseGen) string {
	if lost != nil || a.cfg.NoLease || ex.Code != launcher.ExitLeaseLapsed || ex.Signal != 0 || ex.OOMKilled {
		return cluster.ExitCrashed
	}
	at := ex.At
	if at.IsZero() {
		at = time.Now()
	}
	if a.leaseLapsedAround(at, grace+lapseSlack, st) {
		return cluster.ExitLeaseLapsed
	}
	if now := a.currentLeaseGen(); began.known && now.known && now.gen != began.gen {
		return cluster.ExitLeaseLapsed
	}
	return cluster.ExitCrashed
}

// leaseGen is a generation of the node lease (leasefile.Record.Gen), where known.
type leaseGen struct {
	gen   uint64
	known bool
}

// currentLeaseGen reads the node lease's generation. The agent reads it once a worker has
// started, about when the worker's launcher reads its own (before it runs the command). A
// worker could pass off its own exit as a lapse only if the keeper renewed a lapsed lease
// within those moments and the two reads fell on either side of it: one uncounted crash,
// and only in the wake of a real lapse.
func (a *Agent) currentLeaseGen() leaseGen {
	if a.cfg.NoLease {
		return leaseGen{}
	}
	r, err := leasefile.Read(a.nodeLease())
	if err != nil {
		return leaseGen{} // no record (an older keeper's mtime-only lease): unknown
	}
	return leaseGen{gen: r.Gen, known: true}
}

// leaseLapsedAround reports whether the node lease was lapsed at some time within window
// before at: still lapsed at at (by the file), or within the keeper's last recorded lapse.
// The comparisons are on the boot clock; at (the driver's time of the exit, taken moments
// ago) is carried over to it by its age.
func (a *Agent) leaseLapsedAround(at time.Time, window time.Duration, st KeeperStatus) bool {
	now := leasefile.Now()
	atBoot := now - time.Since(at)
	if r, err := leasefile.Stamp(a.nodeLease(), leasefile.Now); err == nil && r.Lapsed(atBoot, a.leaseTTL(), leasefile.BootID()) {
		return true
	}
	if st.LapsedBoot != 0 && (st.Boot == "" || st.Boot == leasefile.BootID()) {
		return st.LapsedFromBoot <= atBoot && st.LapsedBoot >= atBoot-window
	}
	// A keeper older than boot stamps.
	if st.Lapsed.IsZero() {
		return false
	}
	from := st.LapsedFrom
	if from.IsZero() {
		from = st.Lapsed
	}
	return !from.After(at) && !st.Lapsed.Before(at.Add(-window))
}

// keeperFileStatus reads the keeper's last status from keeper.json, for the agent's start
// (before its keeper link exists); the zero status when there is none.
func (a *Agent) keeperFileStatus() KeeperStatus {
	var st KeeperStatus
	if b, err := os.ReadFile(filepath.Join(a.cfg.StateDir, keeperStatusFile)); err == nil {
		_ = json.Unmarshal(b, &st)
	}
	return st
}
