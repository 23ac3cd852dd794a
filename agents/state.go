package agents

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/atomicfile"
)

// record is what the agent keeps on disk about a worker it started, beside the driver's own
// state: the assignment it runs (to tell whether a new assignment changes it), its port and
// its restart count, so that a restarted agent adopts the worker without replacing it.
type record struct {
	Assignment cluster.WorkerAssignment `json:"assignment"`
	Isolation  string                   `json:"isolation"`
	Port       int                      `json:"port"`
	// MetricsPort is the worker's STORMDOCK_METRICS_PORT (0: it has none).
	MetricsPort int `json:"metricsPort,omitempty"`
	Restarts    int `json:"restarts"`
	// Secrets are the worker's secrets in its directory, names and versions (never values).
	Secrets []cluster.SecretRef `json:"secrets,omitempty"`
}

func (a *Agent) recordPath(id string) string { return filepath.Join(a.workersDir(), id+".json") }

// writeRecord replaces the record atomically.
func (a *Agent) writeRecord(id string, rec record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(a.recordPath(id), b, 0o600); err != nil {
		return fmt.Errorf("write worker record: %w", err)
	}
	return nil
}

// readRecord returns the record of id; ok is false when there is none.
func (a *Agent) readRecord(id string) (rec record, ok bool, err error) {
	b, err := os.ReadFile(a.recordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, fmt.Errorf("read worker record: %w", err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, false, fmt.Errorf("parse worker record %s: %w", id, err)
	}
	return rec, true, nil
}

func (a *Agent) removeRecord(id string) error {
	err := os.Remove(a.recordPath(id))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove worker record: %w", err)
	}
	return nil
}

// recordIDs lists the workers that have a record.
func (a *Agent) recordIDs() ([]string, error) {
	ents, err := os.ReadDir(a.workersDir())
	if err != nil {
		return nil, fmt.Errorf("read worker records: %w", err)
	}
	var ids []string
	for _, e := range ents {
		if n := e.Name(); !e.IsDir() && strings.HasSuffix(n, ".json") {
			ids = append(ids, strings.TrimSuffix(n, ".json"))
		}
	}
	return ids, nil
}
