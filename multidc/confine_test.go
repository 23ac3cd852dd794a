package multidc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
)

// victim is a file a tenant must not be able to touch through a file sink: its bytes and
// mode are compared before and after.
type victim struct {
	path string
	data []byte
	mode os.FileMode
}

func newVictim(t *testing.T, path string) victim {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	// No trailing newline: the old recovery cut whatever followed the last one.
	data := []byte("root:x:0:0:root:/root:/bin/sh\nsecret without a newline")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return victim{path: path, data: data, mode: 0o600}
}

func (v victim) check(t *testing.T) {
	t.Helper()
	fi, err := os.Lstat(v.path)
	if err != nil {
		t.Fatalf("victim %s: %v", v.path, err)
	}
	got, err := os.ReadFile(v.path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, v.data) || fi.Mode() != v.mode {
		t.Fatalf("victim %s changed: %q mode %v, was %q mode %v", v.path, got, fi.Mode(), v.data, v.mode)
	}
}

// TestFileSinkConfined: every way a tenant could point a file sink at a file that is not
// its router's is refused, and the file is byte for byte (and mode) unchanged.
func TestFileSinkConfined(t *testing.T) {
	for _, c := range []struct {
		name string
		// setup makes the victim and returns the sink path to open, below sinkDir/acme
		// or not; after runs between validation and opening (a swap).
		setup func(t *testing.T, sinkDir, base string) (victim, string, func())
		want  string // in the error
	}{
		{"outside the sink dir", func(t *testing.T, sinkDir, base string) (victim, string, func()) {
			v := newVictim(t, filepath.Join(filepath.Dir(sinkDir), "etc", "passwd"))
			return v, v.path, nil
		}, "outside this tenant's sink directory"},
		{"another tenant's dir", func(t *testing.T, sinkDir, base string) (victim, string, func()) {
			v := newVictim(t, filepath.Join(sinkDir, "other", "out.jsonl"))
			return v, v.path, nil
		}, "outside this tenant's sink directory"},
		{"dot dot", func(t *testing.T, sinkDir, base string) (victim, string, func()) {
			v := newVictim(t, filepath.Join(filepath.Dir(sinkDir), "victim"))
			return v, base + "/../../victim", nil
		}, "not a clean path"},
		{"symlink at a middle component", func(t *testing.T, sinkDir, base string) (victim, string, func()) {
			v := newVictim(t, filepath.Join(filepath.Dir(sinkDir), "etc", "passwd"))
			if err := os.Symlink(filepath.Dir(v.path), filepath.Join(base, "etc")); err != nil {
				t.Fatal(err)
			}
			return v, filepath.Join(base, "etc", "passwd"), nil
		}, "symlink"},
		{"symlink as the file", func(t *testing.T, sinkDir, base string) (victim, string, func()) {
			v := newVictim(t, filepath.Join(filepath.Dir(sinkDir), "etc", "passwd"))
			if err := os.Symlink(v.path, filepath.Join(base, "out.jsonl")); err != nil {
				t.Fatal(err)
			}
			return v, filepath.Join(base, "out.jsonl"), nil
		}, "symlink"},
		{"dir swapped for a symlink after validation", func(t *testing.T, sinkDir, base string) (victim, string, func()) {
			v := newVictim(t, filepath.Join(filepath.Dir(sinkDir), "etc", "passwd"))
			if err := os.Mkdir(filepath.Join(base, "etc"), 0o750); err != nil {
				t.Fatal(err)
			}
			return v, filepath.Join(base, "etc", "passwd"), func() {
				if err := os.Remove(filepath.Join(base, "etc")); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(filepath.Dir(v.path), filepath.Join(base, "etc")); err != nil {
					t.Fatal(err)
				}
			}
		}, "symlink"},
		{"existing foreign file", func(t *testing.T, sinkDir, base string) (victim, string, func()) {
			v := newVictim(t, filepath.Join(base, "out.jsonl"))
			return v, v.path, nil
		}, "was not written by this router"},
		{"foreign file that looks like a sink", func(t *testing.T, sinkDir, base string) (victim, string, func()) {
			v := newVictim(t, filepath.Join(base, "out.jsonl"))
			v.data = []byte("{\"offset\":0,\"link\":\"dc-a\",\"record\":{}}\n{\"offset\":1,\"li")
			if err := os.WriteFile(v.path, v.data, 0o600); err != nil {
				t.Fatal(err)
			}
			return v, v.path, nil
		}, "was not written by this router"},
		{"hard link to a foreign file", func(t *testing.T, sinkDir, base string) (victim, string, func()) {
			v := newVictim(t, filepath.Join(filepath.Dir(sinkDir), "etc", "shadow"))
			if err := os.Link(v.path, filepath.Join(base, "out.jsonl")); err != nil {
				t.Skipf("hard link: %v", err)
			}
			return v, filepath.Join(base, "out.jsonl"), nil
		}, "hard links"},
		{"router's file rewritten after its last write", func(t *testing.T, sinkDir, base string) (victim, string, func()) {
			path := filepath.Join(base, "out.jsonl")
			writeOwn(t, sinkDir, path, 3)
			data, _ := os.ReadFile(path)
			data = bytes.Replace(data, []byte(`"offset":2`), []byte(`"offset":9`), 1)
			if err := os.WriteFile(path, data, 0o640); err != nil {
				t.Fatal(err)
			}
			return victim{path: path, data: data, mode: 0o640}, path, nil
		}, "was not written by this router"},
		{"foreign line appended to the router's file", func(t *testing.T, sinkDir, base string) (victim, string, func()) {
			path := filepath.Join(base, "out.jsonl")
			writeOwn(t, sinkDir, path, 3)
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = f.WriteString("* * * * * root /tmp/x\npartial")
			f.Close()
			data, _ := os.ReadFile(path)
			return victim{path: path, data: data, mode: 0o640}, path, nil
		}, "changed after this router's last write"},
		{"router's file replaced by another", func(t *testing.T, sinkDir, base string) (victim, string, func()) {
			path := filepath.Join(base, "out.jsonl")
			writeOwn(t, sinkDir, path, 3)
			data, _ := os.ReadFile(path)
			// Same bytes, another inode: the sidecar's evidence names the first.
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			return victim{path: path, data: data, mode: 0o600}, path, nil
		}, "was not written by this router"},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := testSinkBase(t)
			sinkDir := filepath.Dir(base)
			v, path, swap := c.setup(t, sinkDir, base)
			valid := cluster.CheckSinkPath(sinkDir, testTenant, path)
			if swap != nil {
				if valid != nil {
					t.Fatalf("the path to swap is refused already: %v", valid)
				}
				swap()
			}
			s, err := OpenFileSink(sinkDir, testTenant, path, FileSinkOptions{})
			if err == nil {
				s.Close()
				t.Fatalf("file sink %s opened", path)
			}
			if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q: want one line with %q", err, c.want)
			}
			t.Logf("refused: %v", err)
			v.check(t)
		})
	}
}

// writeOwn has a router's file sink write n records to path and close.
func writeOwn(t *testing.T, sinkDir, path string, n int64) *SinkEvidence {
	t.Helper()
	s, err := OpenFileSink(sinkDir, testTenant, path, FileSinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(context.Background(), recs("dc-a", 0, n)); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	ev := s.Evidence()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return ev
}

// TestFileSinkRecognisesItsOwn: the router's own file reopens by the sidecar's evidence or
// by the record's alone; only a torn line after its last durable record is cut; new
// directories are made below the tenant's dir, and a missing tenant dir is not made.
func TestFileSinkRecognisesItsOwn(t *testing.T) {
	ctx := context.Background()
	base := testSinkBase(t)
	sinkDir := filepath.Dir(base)
	path := filepath.Join(base, "a", "b", "out.jsonl")
	ev := writeOwn(t, sinkDir, path, 3)
	if fi, err := os.Stat(filepath.Join(base, "a", "b")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Fatalf("made dir: %v %v", fi, err)
	}
	// Records after the last durable one (written, not synced, before a crash) are kept;
	// a torn line after them is cut.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	l3, l4 := appendLine(nil, rec("dc-a", 3)), appendLine(nil, rec("dc-a", 4))
	_, _ = f.Write(append(l3, l4[:len(l4)-3]...))
	f.Close()
	// The sidecar gone (a store-backed router keeps the evidence in its record): the
	// record's evidence suffices.
	side := filepath.Join(filepath.Dir(path), sidecarName("out.jsonl"))
	if err := os.Remove(side); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenFileSink(sinkDir, testTenant, path, FileSinkOptions{}); err == nil {
		t.Fatal("opened without any evidence")
	}
	s, err := OpenFileSink(sinkDir, testTenant, path, FileSinkOptions{Evidence: ev})
	if err != nil {
		t.Fatal(err)
	}
	if last, _ := s.LastOffset(ctx); last != 3 {
		t.Fatalf("last = %d, want 3", last)
	}
	s.Close()
	if lines := readSinkFile(t, path); len(lines) != 4 {
		t.Fatalf("%d lines, want 4", len(lines))
	}
	// And the sidecar is back.
	if _, err := os.Stat(side); err != nil {
		t.Fatal(err)
	}
	// A tenant dir that does not exist is not made: the agent makes it.
	if _, err := OpenFileSink(sinkDir, "nobody-here", filepath.Join(sinkDir, "nobody-here", "x"), FileSinkOptions{}); err == nil ||
		!strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("missing tenant dir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(sinkDir, "nobody-here")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("tenant dir made: %v", err)
	}
}

func TestCheckSinkPath(t *testing.T) {
	for _, c := range []struct {
		dir, tenant, path string
		ok                bool
	}{
		{"/srv/sinks", "acme", "/srv/sinks/acme/out.jsonl", true},
		{"/srv/sinks/", "acme", "/srv/sinks/acme/a/b.jsonl", true},
		{"", "acme", "/srv/sinks/acme/out.jsonl", false},
		{"/srv/sinks", "acme", "/srv/sinks/acme", false},
		{"/srv/sinks", "acme", "/srv/sinks/acme/", false},
		{"/srv/sinks", "acme", "/srv/sinks/other/x", false},
		{"/srv/sinks", "acme", "/srv/sinks/acme2/x", false},
		{"/srv/sinks", "acme", "/srv/sinks/acme/../other/x", false},
		{"/srv/sinks", "acme", "/srv/sinks/acme/./x", false},
		{"/srv/sinks", "acme", "/srv/sinks/acme//x", false},
		{"/srv/sinks", "acme", "srv/sinks/acme/x", false},
		{"/srv/sinks", "acme", "/etc/passwd", false},
		{"/srv/sinks", "../etc", "/srv/etc/x", false},
	} {
		err := cluster.CheckSinkPath(c.dir, c.tenant, c.path)
		if (err == nil) != c.ok {
			t.Errorf("CheckSinkPath(%q, %q, %q) = %v, want ok=%v", c.dir, c.tenant, c.path, err, c.ok)
		}
		if err != nil && c.dir != "" && !strings.Contains(err.Error(), "below") && !strings.Contains(err.Error(), "tenant") {
			t.Errorf("error %q does not say where sinks go", err)
		}
	}
}

// TestRouterSinkEvidence: a router that would write a foreign file stops with the refusal
// and leaves it untouched; a router's own file, its sidecar gone, is recognised by the
// evidence in the router's record, and the next router continues after it.
func TestRouterSinkEvidence(t *testing.T) {
	base := testSinkBase(t)
	sinkDir := filepath.Dir(base)
	open := func(path string, got **SinkEvidence) func(_ context.Context, ev *SinkEvidence) (Sink, error) {
		return func(_ context.Context, ev *SinkEvidence) (Sink, error) {
			if got != nil {
				*got = ev
			}
			return OpenSink(context.Background(), "file://"+path, SinkOptions{SinkDir: sinkDir, Tenant: testTenant, Evidence: ev})
		}
	}

	// A foreign file: Run fails with the refusal, the file is as it was.
	_, store := embeddedStore(t)
	v := newVictim(t, filepath.Join(base, "foreign.jsonl"))
	r, err := New(Config{Job: "wordcount", Links: []string{"dc-a", "dc-b"}, Store: store, OpenSink: open(v.path, nil), TokenHash: testTokenHash})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Run(ctx); err == nil || !errors.Is(err, ErrSinkBroken) || !strings.Contains(err.Error(), "was not written by this router") {
		t.Fatalf("router on a foreign file: %v", err)
	}
	v.check(t)

	// The router's own file: written, the router stopped, the sidecar removed.
	path := filepath.Join(base, "own.jsonl")
	tr := startRouter(t, store, []string{"dc-a", "dc-b"}, func(c *Config) { c.Sink, c.OpenSink = nil, open(path, nil) })
	waitReady(t, tr.URL())
	var body strings.Builder
	for off := range 10 {
		fmt.Fprintf(&body, "{\"offset\":%d,\"link\":\"dc-a\",\"worker\":0,\"workers\":1}\n", off)
	}
	testenv.EventuallyWith(t, "10 records delivered", 10*time.Second, func() (bool, string) {
		post(t, tr.URL()+"/v1/records?link=dc-a&worker=0", body.String())
		post(t, tr.URL()+"/v1/heartbeat?link=dc-b&worker=0&workers=1", "")
		st, _ := tr.Status()
		return st.Delivered == 9, fmt.Sprintf("delivered %d", st.Delivered)
	})
	tr.stop(t)
	rec, ok, err := ReadRecord(context.Background(), store, "wordcount")
	if err != nil || !ok || rec.Sink == nil || rec.Sink.Last != 9 {
		t.Fatalf("router record: %+v %v %v; want the evidence of offset 9", rec.Sink, ok, err)
	}
	if err := os.Remove(filepath.Join(base, sidecarName("own.jsonl"))); err != nil {
		t.Fatal(err)
	}
	var given *SinkEvidence
	tr = startRouter(t, store, []string{"dc-a", "dc-b"}, func(c *Config) { c.Sink, c.OpenSink = nil, open(path, &given) })
	waitReady(t, tr.URL())
	if given == nil || given.Size != rec.Sink.Size {
		t.Fatalf("the next router's sink got evidence %+v, want the record's %+v", given, rec.Sink)
	}
	if st, _ := tr.Status(); st.Checkpoint != 9 {
		t.Fatalf("the next router starts at checkpoint %d, want 9", st.Checkpoint)
	}
}
