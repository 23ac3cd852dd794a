package agents

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/stormdock/stormdock/agents/leasefile"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/atomicfile"
	"github.com/stormdock/stormdock/isolation"
)

// A lease is a file whose record (package leasefile: a stamp on the machine's boot clock and
// a generation) says how long its worker may run: every worker runs under the launcher (see
// Launch), which stops the worker once the lease is older than its ttl or of another
// generation. Each worker's lease is a hard link of the node lease (leases/.node) that the
// node's keeper renews, so one renewal renews every worker's, and a worker stops by itself
// when its keeper stops renewing: the node lost its session, or its agent is gone for good.
// Each worker has a directory of its own so that docker workers get exactly their lease
// bind-mounted, read-only.

const leaseName = "lease"

func (a *Agent) leaseFile(id string) string {
	return filepath.Join(a.leasesDir(), id, leaseName)
}

// configFile is a worker's live configuration, beside its lease.
func (a *Agent) configFile(id string) string {
	return filepath.Join(a.leasesDir(), id, "config.json")
}

// writeConfig writes a worker's live configuration (cluster.WorkerConfig) atomically: the
// worker re-reads it when it changes. It holds the job's whole environment: 0600, the
// worker's user's (u; nil: the agent's).
func (a *Agent) writeConfig(id string, wa cluster.WorkerAssignment, u *isolation.User) error {
	p := a.configFile(id)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("config of %s: %w", id, err)
	}
	var env map[string]string
	if len(wa.Env)+len(wa.LiveEnv) > 0 {
		env = wa.RunEnv()
	}
	b, err := json.Marshal(cluster.WorkerConfig{Job: wa.Key.Job, Link: wa.Key.Link, Worker: wa.Key.Worker,
		Workers: wa.Workers, Epoch: wa.Epoch, Generation: wa.Generation, Routers: wa.Routers, Env: env})
	if err != nil {
		return err
	}
	if err := writeOwned(p, b, 0o600, u); err != nil {
		return fmt.Errorf("config of %s: %w", id, err)
	}
	return nil
}

func (a *Agent) nodeLease() string { return filepath.Join(a.leasesDir(), nodeLeaseName) }

// leaseValid reports whether the node lease, which every worker's is a link of, lets a
// worker run at now (on the boot clock), with a margin for a launcher's check interval.
func (a *Agent) leaseValid(now time.Duration) bool {
	r, err := leasefile.Stamp(a.nodeLease(), leasefile.Now)
	return err == nil && !r.Lapsed(now, a.leaseTTL()*3/4, leasefile.BootID())
}

func (a *Agent) aliveFile() string { return filepath.Join(a.cfg.StateDir, agentAliveFile) }

// linkLease makes a worker's lease a hard link of the node lease.
func (a *Agent) linkLease(id string) error {
	p := a.leaseFile(id)
	node, err := ensureNodeLease(a.cfg.StateDir)
	if err != nil {
		return err
	}
	if same, err := sameFile(p, node); err == nil && same {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("lease of %s: %w", id, err)
	}
	// Replaced, not removed and linked: a launcher never finds its lease missing.
	if err := atomicfile.Link(node, p); err != nil {
		return fmt.Errorf("lease of %s: %w", id, err)
	}
	return nil
}

func sameFile(a, b string) (bool, error) {
	fa, err := os.Stat(a)
	if err != nil {
		return false, err
	}
	fb, err := os.Stat(b)
	if err != nil {
		return false, err
	}
	return os.SameFile(fa, fb), nil
}

// removeLease deletes a worker's lease directory, and its secrets, once the worker is gone.
func (a *Agent) removeLease(id string) error {
	if err := os.RemoveAll(filepath.Dir(a.leaseFile(id))); err != nil {
		return fmt.Errorf("remove lease of %s: %w", id, err)
	}
	return a.removeSecrets(id)
}

// touch sets a file's times to now, creating it if missing.
func touch(p string, now time.Time) error {
	err := os.Chtimes(p, now, now)
	if errors.Is(err, os.ErrNotExist) {
		var f *os.File
		if f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
			err = f.Close()
		}
	}
	return err
}
