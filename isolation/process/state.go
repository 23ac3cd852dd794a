package process

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/stormdock/stormdock/internal/atomicfile"
	"github.com/stormdock/stormdock/isolation"
)

// state is the per-worker file that lets a restarted agent adopt what an earlier one started.
// It is written before the cgroup exists, so that a crash at any point leaves a file that
// names what to clean up.
type state struct {
	Spec   isolation.Spec `json:"spec"`
	Cgroup string         `json:"cgroup"`
	// PID and StartTicks (from /proc/PID/stat) together name one process: a pid alone may
	// have been reused by an unrelated process after the worker ended.
	PID        int             `json:"pid,omitempty"`
	StartTicks uint64          `json:"start_ticks,omitempty"`
	Started    time.Time       `json:"started"`
	LogPath    string          `json:"log_path"`
	Exit       *isolation.Exit `json:"exit,omitempty"`
}

const stateExt = ".json"

func statePath(dir, id string) string { return filepath.Join(dir, id+stateExt) }

// writeState replaces the file atomically, so a crash leaves the old or the new state.
func writeState(dir string, st state) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(statePath(dir, st.Spec.ID), b, 0o600); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	return nil
}

func removeState(dir, id string) error {
	err := os.Remove(statePath(dir, id))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// readStates reads every state file in dir.
func readStates(dir string) ([]state, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read state dir: %w", err)
	}
	var out []state
	for _, e := range ents {
		if e.IsDir() || !strings.HasSuffix(e.Name(), stateExt) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read state: %w", err)
		}
		var st state
		if err := json.Unmarshal(b, &st); err != nil {
			return nil, fmt.Errorf("parse state %s: %w", e.Name(), err)
		}
		out = append(out, st)
	}
	return out, nil
}
