package agents_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/keyring"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/master/httpapi"
)

// secretsMaster is a real master on the harness's store, leading, with a keyring, serving its
// API over TLS on a test server whose certificate it advertises; down makes the server drop
// every connection, as an unreachable master would.
type secretsMaster struct {
	m    *master.Master
	srv  *httptest.Server
	ring *keyring.Keyring
	down atomic.Bool
}

func startSecretsMaster(t *testing.T, h *harness) *secretsMaster {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secrets.key")
	if _, err := keyring.Generate(p); err != nil {
		t.Fatal(err)
	}
	file, err := keyring.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	sm := &secretsMaster{}
	sm.ring, _ = file.Ring()
	var api http.Handler
	sm.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if sm.down.Load() {
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					c.Close()
					return
				}
			}
		}
		api.ServeHTTP(w, r)
	}))
	sm.srv.StartTLS()
	t.Cleanup(sm.srv.Close)
	sum := sha256.Sum256(sm.srv.TLS.Certificates[0].Certificate[0])
	ms := h.agentStore()
	sm.m, err = master.New(ms, master.Config{ID: "m1", API: sm.srv.URL, APICertSHA256: hex.EncodeToString(sum[:]), Keyring: file,
		TenantUIDs: cluster.UIDRange{First: tenantUID, Last: tenantUID + 999}, Debounce: 20 * time.Millisecond,
		ReregisterGrace: 50 * time.Millisecond, Logger: testenv.Logger(t, slog.LevelError)})
	if err != nil {
		t.Fatal(err)
	}
	api = httpapi.New(sm.m, httpapi.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = sm.m.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	testenv.Eventually(t, "the master leads", 10*time.Second, sm.m.Leader)
	return sm
}

// secretSpec is a job of the helper that copies secret db from its file at start and on
// every SIGHUP.
func secretSpec(h *harness, name string) *cluster.JobSpec {
	return &cluster.JobSpec{Name: name, Tenant: "search", Workers: 1,
		Resources: cluster.Resources{Memory: 128 << 20, CPU: 200},
		Command:   []string{"stormdock", "helper"}, GracePeriod: cluster.Duration(2 * time.Second),
		Env:     map[string]string{"HELPER_DIR": h.helperDir, "HELPER_SECRET": "db"},
		Secrets: []string{"db"}}
}

// secretCopy is what the helper of key with pid read from its secret file the n-th time.
func (h *harness) secretCopy(key string, pid, n int) (string, bool) {
	b, err := os.ReadFile(filepath.Join(h.helperDir, fmt.Sprintf("%s.%d.secret.%d", key, pid, n)))
	return string(b), err == nil
}

// TestSecretsDelivered runs a real master and a real agent: the worker finds its secret as a
// file of its own uid (checked from the host: owner, mode, another uid refused), a new value
// reaches the running worker as a rewritten file and SIGHUP without a restart (same pid),
// the values are nowhere else on the node (config, records, environment), a worker whose
// master cannot be reached waits, saying why, and starts once it can, and the secrets go
// with the worker; a directory left by a worker gone while the agent was down is swept.
func TestSecretsDelivered(t *testing.T) {
	testenv.Root(t)
	h := newHarness(t, "mem")
	openUp(t, filepath.Dir(h.stateDir), 0o711)
	sm := startSecretsMaster(t, h)
	ctx := context.Background()
	if _, err := desired.CreateTenantIn(ctx, h.store, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}},
		cluster.UIDRange{First: tenantUID, Last: tenantUID + 999}); err != nil {
		t.Fatal(err)
	}
	const v1, v2 = "first-value-7f3a91", "second-value-c40e22"
	if _, _, err := desired.SetSecret(ctx, h.store, sm.ring, "search", "db", []byte(v1), "admin"); err != nil {
		t.Fatal(err)
	}
	ra := h.start(h.cfg, h.agentStore())
	h.waitRecord("node registered with its identity", 10*time.Second, func(rec cluster.NodeRecord) bool {
		return rec.Identity != nil && len(rec.Identity.Sign) > 0 && len(rec.Identity.Seal) > 0
	})
	if _, err := desired.SubmitJob(ctx, h.store, secretSpec(h, "wc")); err != nil {
		t.Fatal(err)
	}
	h.waitRecord("wc running", 30*time.Second, allRunning("wc/0"))
	rep := h.waitReports("wc.0", 1)[0]
	dir := rep.Env[agents.EnvSecretsDir]
	if dir == "" {
		t.Fatalf("the worker's environment has no %s: %v", agents.EnvSecretsDir, rep.Env)
	}
	// From the host: the directory and the file are the tenant's uid's alone.
	owned(t, dir, 0o500, tenantUID)
	owned(t, filepath.Join(dir, "db"), 0o400, tenantUID)
	if b, err := os.ReadFile(filepath.Join(dir, "db")); err != nil || string(b) != v1 {
		t.Fatalf("the secret file holds %q (%v), want %q", b, err, v1)
	}
	testenv.Eventually(t, "the worker read its secret", 10*time.Second, func() bool {
		got, ok := h.secretCopy("wc.0", rep.PID, 0)
		return ok && got == v1
	})
	for _, uid := range []uint32{tenantUID + 1, tenantUID + 2, 65534} {
		if out, err := asUID(uid, "cat", filepath.Join(dir, "db")); err == nil || strings.Contains(out, v1) {
			t.Errorf("uid %d reads the worker's secret: %q %v", uid, out, err)
		}
		if out, err := asUID(uid, "ls", dir); err == nil {
			t.Errorf("uid %d lists the worker's secrets: %q", uid, out)
		}
	}

	// A new value: the same process gets it, as a file rewritten and SIGHUP.
	if _, _, err := desired.SetSecret(ctx, h.store, sm.ring, "search", "db", []byte(v2), "admin"); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyWith(t, "the running worker re-read the rotated secret on SIGHUP", 20*time.Second, func() (bool, string) {
		got, ok := h.secretCopy("wc.0", rep.PID, 1)
		return ok && got == v2, fmt.Sprintf("read %q", got)
	})
	if reps := h.reports("wc.0"); len(reps) != 1 || !alive(rep.PID) {
		t.Errorf("rotation restarted the worker: %d starts, pid %d alive %v", len(reps), rep.PID, alive(rep.PID))
	}
	owned(t, filepath.Join(dir, "db"), 0o400, tenantUID)

	// Nothing else on the node holds a value: the worker's configuration, records, the
	// agent's state, the node record, the process's environment.
	for _, v := range []string{v1, v2} {
		_ = filepath.Walk(h.stateDir, func(p string, fi os.FileInfo, err error) error {
			if err != nil || fi.IsDir() || strings.HasPrefix(p, dir) {
				return nil
			}
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(v)) {
				t.Errorf("%s holds a secret value", p)
			}
			return nil
		})
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", rep.PID)); bytes.Contains(b, []byte(v)) {
			t.Error("the worker's environment holds a secret value")
		}
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", rep.PID)); bytes.Contains(b, []byte(v)) {
			t.Error("the worker's command line holds a secret value")
		}
	}
	if rec, e, _ := h.record(); bytes.Contains(e.Value, []byte(v2)) || rec.Identity == nil {
		t.Error("the node record holds a secret value, or no identity")
	}

	// The master cannot be reached: a new worker waits, saying why, and starts once it can.
	sm.down.Store(true)
	if _, err := desired.SubmitJob(ctx, h.store, secretSpec(h, "late")); err != nil {
		t.Fatal(err)
	}
	h.waitRecord("late waits for its secrets", 30*time.Second, func(rec cluster.NodeRecord) bool {
		w, ok := states(rec)["late/0"]
		return ok && w.State == cluster.WorkerFailed && strings.Contains(w.LastExit, "waiting for its secrets: cannot reach the leading master")
	})
	if reps := h.reports("late.0"); len(reps) != 0 {
		t.Fatalf("late started without its secrets: %+v", reps)
	}
	sm.down.Store(false)
	h.waitRecord("late running once the master answers", 30*time.Second, allRunning("wc/0", "late/0"))

	// Killed, the worker's secrets go with it.
	if _, err := desired.KillJob(ctx, h.store, "wc", time.Second); err != nil {
		t.Fatal(err)
	}
	h.waitRecord("wc gone", 30*time.Second, allRunning("late/0"))
	testenv.Eventually(t, "wc's secrets removed", 10*time.Second, func() bool {
		_, err := os.Lstat(dir)
		return os.IsNotExist(err)
	})

	// A directory of a worker gone while the agent was down is swept at its next start.
	leases := filepath.Dir(dir)
	ghost := filepath.Join(leases, "n1.ghost.0.secrets")
	if err := os.MkdirAll(ghost, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ghost, "db"), []byte(v1), 0o400); err != nil {
		t.Fatal(err)
	}
	if err := ra.stop(); err != nil {
		t.Fatal(err)
	}
	h.start(h.cfg, h.agentStore())
	testenv.Eventually(t, "the ghost's secrets swept", 20*time.Second, func() bool {
		_, err := os.Lstat(ghost)
		return os.IsNotExist(err)
	})
	h.waitRecord("late adopted, running", 30*time.Second, allRunning("late/0"))
}
