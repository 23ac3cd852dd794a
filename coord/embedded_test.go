package coord_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/coord/coordtest"
	"github.com/stormdock/stormdock/internal/testenv"
)

const embeddedTimeout = 500 * time.Millisecond

type embeddedBackend struct {
	srv *coord.Server
}

func newEmbeddedBackend(t *testing.T) coordtest.Backend {
	srv, err := coord.NewServer(coord.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return &embeddedBackend{srv: srv}
}

func (b *embeddedBackend) Client(t *testing.T) coord.Store {
	c, err := b.srv.Connect(coord.Options{SessionTimeout: embeddedTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (b *embeddedBackend) Expire(t *testing.T, s coord.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev := s.SessionEvents(ctx)
	if err := b.srv.ExpireSession(s.SessionID()); err != nil {
		t.Fatal(err)
	}
	for e := range ev {
		if e.Type == coord.SessionNew {
			return
		}
	}
	t.Fatal("no new session after expiry")
}

func (b *embeddedBackend) StartLeader(t *testing.T, prefix, id string) func() {
	c, err := b.srv.Connect(coord.Options{SessionTimeout: embeddedTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	e, err := coord.NewElection(c, prefix, id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	return c.Crash // keepalives stop; the session times out like a killed process's
}

func (b *embeddedBackend) SessionTimeout() time.Duration { return embeddedTimeout }
func (b *embeddedBackend) ExpiryGrace() time.Duration    { return 1500 * time.Millisecond }

func TestEmbeddedConformance(t *testing.T) {
	t.Parallel()
	coordtest.RunSuite(t, newEmbeddedBackend)
}

func TestEmbeddedFilePersistence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "state", "store.json")
	url := "file://" + path

	s1, err := coord.Open(ctx, url, coord.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s2, err := coord.Open(ctx, url, coord.Options{}) // a second client of the same server
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s1.Create(ctx, "/jobs/wc", []byte("spec"), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	if _, err := s1.Put(ctx, "/jobs/wc", []byte("spec2"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s1.Create(ctx, "/q/item-", nil, coord.PersistentSequential); err != nil {
		t.Fatal(err)
	}
	if _, err := s1.Create(ctx, "/nodes/n1", []byte("up"), coord.Ephemeral); err != nil {
		t.Fatal(err)
	}
	if _, err := s1.Txn(ctx, coord.CreateOp("/jobs/wc/status", []byte("run"), coord.Persistent),
		coord.PutOp("/jobs/wc", []byte("spec3"), 1)); err != nil {
		t.Fatal(err)
	}
	if e, err := s2.Get(ctx, "/nodes/n1"); err != nil || e.Owner != s1.SessionID() {
		t.Fatalf("second client of the same file does not see the first's session entry: %+v %v", e, err)
	}
	before, _ := s1.Get(ctx, "/jobs/wc")
	s1.Close()
	s2.Close()

	files, _ := os.ReadDir(filepath.Dir(path))
	if len(files) != 2 || files[0].Name() != "store.json" || files[1].Name() != "store.json.lock" {
		t.Fatalf("files next to the store: %v (temp files left?)", files)
	}
	raw, _ := os.ReadFile(path)
	if strings.Contains(string(raw), "/nodes/n1") {
		t.Fatal("ephemeral entry persisted")
	}

	s3, err := coord.Open(ctx, url, coord.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	// A second server on the same file (as another process would open) is refused.
	if _, err := coord.NewServer(coord.ServerOptions{Path: path}); !errors.Is(err, coord.ErrUnavailable) {
		t.Fatalf("second server on a locked file: %v", err)
	}
	after, err := s3.Get(ctx, "/jobs/wc")
	if err != nil {
		t.Fatal(err)
	}
	if string(after.Value) != "spec3" || after.Version != 2 || after.CreateRev != before.CreateRev || after.ModRev != before.ModRev {
		t.Fatalf("after reopen %+v, before %+v", after, before)
	}
	if e, err := s3.Get(ctx, "/jobs/wc/status"); err != nil || string(e.Value) != "run" {
		t.Fatalf("txn entry after reopen: %+v %v", e, err)
	}
	if _, err := s3.Get(ctx, "/nodes/n1"); !errors.Is(err, coord.ErrNotFound) {
		t.Fatalf("ephemeral entry survived reopen: %v", err)
	}
	if kids, _ := s3.Children(ctx, "/nodes"); len(kids) != 0 {
		t.Fatalf("children of /nodes after reopen: %v", kids)
	}
	// Sequence numbers go on from where they were (children versions are persisted).
	k, err := s3.Create(ctx, "/q/item-", nil, coord.PersistentSequential)
	if err != nil || k != "/q/item-0000000001" {
		t.Fatalf("sequential after reopen = %q, %v", k, err)
	}
	// Revisions go on too: a new write is newer than anything before the restart.
	v, _ := s3.Put(ctx, "/jobs/wc", []byte("spec4"), 2)
	if e, _ := s3.Get(ctx, "/jobs/wc"); v != 3 || e.ModRev <= before.ModRev {
		t.Fatalf("after write: version %d rev %d (before rev %d)", v, e.ModRev, before.ModRev)
	}
}

func TestEmbeddedCorruptFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "store.json")
	if err := os.WriteFile(path, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := coord.Open(context.Background(), "file://"+path, coord.Options{}); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("open of a corrupt file: %v", err)
	}
}

func TestEmbeddedNamedMemShared(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, err := coord.Open(ctx, "mem://shared-test", coord.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := coord.Open(ctx, "mem://shared-test", coord.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := coord.Open(ctx, "mem://", coord.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := a.Put(ctx, "/k", []byte("v"), coord.AnyVersion); err != nil {
		t.Fatal(err)
	}
	if e, err := b.Get(ctx, "/k"); err != nil || string(e.Value) != "v" {
		t.Fatalf("second client of mem://shared-test: %+v %v", e, err)
	}
	if _, err := p.Get(ctx, "/k"); !errors.Is(err, coord.ErrNotFound) {
		t.Fatalf("private mem:// store sees shared data: %v", err)
	}
	if a.SessionID() == b.SessionID() {
		t.Fatal("clients share a session")
	}
	a.Close()
	b.Close()
	c, err := coord.Open(ctx, "mem://shared-test", coord.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Get(ctx, "/k"); !errors.Is(err, coord.ErrNotFound) {
		t.Fatalf("mem store outlived its last client: %v", err)
	}
}

// A client that stops sending keepalives (Crash) loses its session after the timeout, not
// before, and its entries go.
func TestEmbeddedKeepaliveTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := coord.NewServer(coord.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	const timeout = 300 * time.Millisecond
	a, _ := srv.Connect(coord.Options{SessionTimeout: timeout})
	w, _ := srv.Connect(coord.Options{SessionTimeout: -1}) // never times out
	defer w.Close()
	if _, err := a.Create(ctx, "/nodes/a", nil, coord.Ephemeral); err != nil {
		t.Fatal(err)
	}
	// A live client keeps its session well past the timeout.
	testenv.AssertUntil(t, "the live client's entry", 3*timeout, func() (bool, string) {
		if _, err := w.Get(ctx, "/nodes/a"); err != nil {
			return false, fmt.Sprintf("live client lost its entry: %v", err)
		}
		return true, ""
	})
	ch, _ := w.Watch(ctx, "/nodes/a")
	<-ch
	start := time.Now()
	a.Crash()
	if _, err := a.Get(ctx, "/nodes/a"); !errors.Is(err, coord.ErrClosed) {
		t.Fatalf("crashed client still answers: %v", err)
	}
	select {
	case ev := <-ch:
		if ev.Exists {
			t.Fatalf("got %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("entry of a crashed client never went")
	}
	took := time.Since(start)
	if took < timeout*2/3 || took > timeout+testenv.Timeout(3*time.Second) {
		t.Fatalf("session ended %s after the crash, timeout %s", took, timeout)
	}
	if len(srv.Sessions()) != 1 {
		t.Fatalf("sessions left: %v", srv.Sessions())
	}
}
