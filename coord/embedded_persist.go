package coord

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/stormdock/stormdock/internal/atomicfile"
)

// fileFormat is the embedded store's file: persistent entries only (sessions, and so
// ephemeral entries, do not survive a restart).
type fileFormat struct {
	Format  string      `json:"format"`
	Rev     int64       `json:"rev"`
	Entries []fileEntry `json:"entries"`
}

type fileEntry struct {
	Key       string `json:"key"`
	Value     []byte `json:"value,omitempty"`
	Version   int64  `json:"version"`
	CVersion  int64  `json:"cversion"`
	CreateRev int64  `json:"createRev"`
	ModRev    int64  `json:"modRev"`
}

const fileFormatName = "stormdock-coord/1"

// saveTree writes the persistent entries of t to path atomically.
func saveTree(path string, t *tree) error {
	f := fileFormat{Format: fileFormatName, Rev: t.rev}
	for _, k := range slices.Sorted(maps.Keys(t.nodes)) {
		n := t.nodes[k]
		if n.owner != 0 {
			continue
		}
		f.Entries = append(f.Entries, fileEntry{Key: k, Value: n.value, Version: n.version,
			CVersion: n.cversion, CreateRev: n.createRev, ModRev: n.modRev})
	}
	data, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, data, 0o600)
}

// loadTree reads path; a missing file is an empty tree (its directory is created).
func loadTree(path string) (*tree, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, err
		}
		return newTree(), nil
	}
	if err != nil {
		return nil, err
	}
	var f fileFormat
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if f.Format != fileFormatName {
		return nil, fmt.Errorf("unknown format %q", f.Format)
	}
	t := newTree()
	t.rev = f.Rev
	for _, e := range f.Entries { // sorted: parents come before children
		if err := ValidateKey(e.Key); err != nil {
			return nil, err
		}
		n := &enode{value: e.Value, version: e.Version, cversion: e.CVersion,
			createRev: e.CreateRev, modRev: e.ModRev, children: map[string]struct{}{}}
		if e.Key == "/" {
			n.children = t.nodes["/"].children
			t.nodes["/"] = n
			continue
		}
		p, ok := t.nodes[parentKey(e.Key)]
		if !ok {
			return nil, fmt.Errorf("entry %s has no parent", e.Key)
		}
		p.children[baseName(e.Key)] = struct{}{}
		t.nodes[e.Key] = n
	}
	return t, nil
}

// lockFile takes an exclusive flock on path, so that a second process opening the same store
// file fails instead of overwriting the first one's changes.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: store file in use by another process (%v)", ErrUnavailable, err)
	}
	return f, nil
}
