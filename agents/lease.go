package agents

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// A lease is a file whose modification time the agent renews while its store session is live.
// Every worker runs under the launcher (see Launch), which stops the worker once the lease is
// older than its ttl: a worker whose agent died, or lost its session, stops by itself at
// about the time the master re-places it elsewhere. Each worker has a directory of its own
// so that docker workers can get exactly their lease bind-mounted, read-only.

const leaseName = "lease"

func (a *Agent) leaseFile(id string) string {
	return filepath.Join(a.leasesDir(), id, leaseName)
}

// renewLease creates or touches a worker's lease.
func (a *Agent) renewLease(id string, now time.Time) error {
	p := a.leaseFile(id)
	err := os.Chtimes(p, now, now)
	if errors.Is(err, os.ErrNotExist) {
		if err = os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("lease of %s: %w", id, err)
		}
		var f *os.File
		if f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			err = f.Close()
		}
		if err == nil {
			err = os.Chtimes(p, now, now)
		}
	}
	if err != nil {
		return fmt.Errorf("lease of %s: %w", id, err)
	}
	return nil
}

// removeLease deletes a worker's lease directory once the worker is gone.
func (a *Agent) removeLease(id string) error {
	if err := os.RemoveAll(filepath.Dir(a.leaseFile(id))); err != nil {
		return fmt.Errorf("remove lease of %s: %w", id, err)
	}
	return nil
}
