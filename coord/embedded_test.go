package coord_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
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
	sid := a.SessionID()
	a.Crash()
	if _, err := a.Get(ctx, "/nodes/a"); !errors.Is(err, coord.ErrClosed) {
		t.Fatalf("crashed client still answers: %v", err)
	}
	// The timeout runs from the last keepalive the server had, which a loaded machine may
	// have sent well before the crash: measured from the crash, the end comes sooner.
	start := srv.LastSeen(sid)
	if start.IsZero() {
		t.Fatal("the session ended at the crash")
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
	if took < timeout || took > timeout+testenv.Timeout(3*time.Second) {
		t.Fatalf("session ended %s after its last keepalive, timeout %s", took, timeout)
	}
	if len(srv.Sessions()) != 1 {
		t.Fatalf("sessions left: %v", srv.Sessions())
	}
}

// A write whose save fails on a full disk has no effect at all: it is reported failed, no
// read sees it, no watcher hears of it, and a restart finds the store as it was. The disk is
// a real tmpfs filled up (ENOSPC from the kernel), freed again afterwards.
func TestEmbeddedSaveBeforeApply(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(30*time.Second))
	defer cancel()
	dir := testenv.Tmpfs(t, 256<<10)
	path := filepath.Join(dir, "store.json")
	srv, err := coord.NewServer(coord.ServerOptions{Path: path, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, err := srv.Connect(coord.Options{SessionTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Create(ctx, "/jobs/a", []byte("v1"), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	data, err := c.Watch(ctx, "/jobs/a")
	if err != nil {
		t.Fatal(err)
	}
	kids, err := c.WatchChildren(ctx, "/jobs")
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-data; string(ev.Entry.Value) != "v1" {
		t.Fatalf("first event %+v", ev)
	}
	if ev := <-kids; !slices.Equal(ev.Children, []string{"a"}) {
		t.Fatalf("first children event %+v", ev)
	}

	filler := testenv.FillUp(t, dir)
	writes := []struct {
		name string
		do   func() error
	}{
		{"put", func() error { _, err := c.Put(ctx, "/jobs/a", []byte("v2"), 0); return err }},
		{"create", func() error { _, err := c.Create(ctx, "/jobs/b", []byte("b"), coord.Persistent); return err }},
		{"create with parents", func() error { _, err := c.Create(ctx, "/other/x/y", nil, coord.Persistent); return err }},
		{"delete", func() error { return c.Delete(ctx, "/jobs/a", 0) }},
		{"txn", func() error {
			_, err := c.Txn(ctx, coord.PutOp("/jobs/a", []byte("v2"), 0), coord.CreateOp("/jobs/b", nil, coord.Persistent))
			return err
		}},
		{"txn with parents", func() error {
			_, err := c.Txn(ctx, coord.CreateOp("/other/x/y", nil, coord.Persistent))
			return err
		}},
	}
	for _, w := range writes {
		if err := w.do(); !errors.Is(err, coord.ErrUnavailable) || !strings.Contains(err.Error(), "no space left") {
			t.Errorf("%s on a full disk: %v; want ErrUnavailable naming the full disk", w.name, err)
		}
	}
	check := func(when string, s coord.Store) {
		t.Helper()
		if e, err := s.Get(ctx, "/jobs/a"); err != nil || string(e.Value) != "v1" || e.Version != 0 {
			t.Errorf("%s: /jobs/a is %+v, %v; want v1 at version 0", when, e, err)
		}
		if names, err := s.Children(ctx, "/jobs"); err != nil || !slices.Equal(names, []string{"a"}) {
			t.Errorf("%s: children of /jobs %v, %v; want [a]", when, names, err)
		}
		if _, err := s.Get(ctx, "/other"); !errors.Is(err, coord.ErrNotFound) {
			t.Errorf("%s: /other exists (%v): a failed write's parents were kept", when, err)
		}
	}
	check("after the failed writes", c)

	// Space again: the next writes succeed, and the watchers' next events are theirs.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "/jobs/a", []byte("v3"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, "/jobs/c", nil, coord.Persistent); err != nil {
		t.Fatal(err)
	}
	if ev := <-data; string(ev.Entry.Value) != "v3" || ev.Entry.Version != 1 {
		t.Errorf("the watcher's next event is %q at version %d; want v3 at 1 (a failed write was announced)", ev.Entry.Value, ev.Entry.Version)
	}
	if ev := <-kids; !slices.Equal(ev.Children, []string{"a", "c"}) {
		t.Errorf("the children watcher's next event is %v; want [a c] (a failed create was announced)", ev.Children)
	}
	// What the file holds is what was reported written.
	if _, err := c.Put(ctx, "/jobs/a", []byte("v1"), 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, "/jobs/c", 0); err != nil {
		t.Fatal(err)
	}
	c.Close()
	srv.Close()
	files, _ := os.ReadDir(dir)
	for _, f := range files {
		if strings.Contains(f.Name(), ".tmp") {
			t.Errorf("temporary file %s left on the disk", f.Name())
		}
	}
	srv2, err := coord.NewServer(coord.ServerOptions{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer srv2.Close()
	c2, err := srv2.Connect(coord.Options{SessionTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if e, err := c2.Get(ctx, "/jobs/a"); err != nil || string(e.Value) != "v1" || e.Version != 2 {
		t.Errorf("after a restart /jobs/a is %+v, %v; want v1 at version 2", e, err)
	}
	if names, err := c2.Children(ctx, "/jobs"); err != nil || !slices.Equal(names, []string{"a"}) {
		t.Errorf("after a restart children of /jobs %v, %v; want [a]", names, err)
	}
}
