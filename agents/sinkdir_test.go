package agents_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents"
)

// TestRouterSinkDir: before it starts an output router, the agent makes SINKDIR/<tenant>
// (0750, owned by the router's user: its tenant's router uid) and names SINKDIR in the router's
// environment; a tenant's worker gets neither.
func TestRouterSinkDir(t *testing.T) {
	h := newHarness(t, "mem")
	sinkDir := filepath.Join(t.TempDir(), "sinks")
	cfg := h.cfg
	cfg.SinkDir = sinkDir
	h.start(cfg, h.agentStore())
	tenant := h.wa("mirror", 0, 1, "run")
	tenant.Key.Link = "dc-a"
	router := h.wa("mirror.router", 0, 1, "run")
	router.System = true
	h.assign(tenant, router)
	h.waitRecord("both workers run", 20*time.Second, allRunning("mirror@dc-a/0", "mirror.router/0"))
	r := h.waitReports("mirror.router.0", 1)[0]
	if got := r.Env[agents.EnvSinkDir]; got != sinkDir {
		t.Errorf("router's %s = %q, want %s", agents.EnvSinkDir, got, sinkDir)
	}
	w := h.waitReports("mirror.dc-a.0", 1)[0]
	if got, ok := w.Env[agents.EnvSinkDir]; ok {
		t.Errorf("a tenant's worker was given the sink dir %q", got)
	}
	fi, err := os.Lstat(filepath.Join(sinkDir, "search"))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || fi.Mode().Perm() != 0o750 || int(st.Uid) != router.UID || router.UID == 0 {
		t.Fatalf("tenant sink dir: %v owner %d, want a 0750 directory of the router's uid %d", fi.Mode(), st.Uid, router.UID)
	}
}
