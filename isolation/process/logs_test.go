package process

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

func TestTailStart(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	old := write("w.log.1", "a\nb\n")
	cur := write("w.log", "c\nd\ne")
	files := []string{old, cur}
	read := func(i int, off int64) string {
		var b strings.Builder
		if err := copyFrom(context.Background(), &b, files, i, off, nil); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	for _, tc := range []struct {
		n    int
		want string
	}{
		{0, ""}, {1, "e"}, {2, "d\ne"}, {3, "c\nd\ne"}, {4, "b\nc\nd\ne"}, {5, "a\nb\nc\nd\ne"}, {50, "a\nb\nc\nd\ne"},
	} {
		i, off, err := tailStart(files, tc.n, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := read(i, off); got != tc.want {
			t.Errorf("tail %d = %q, want %q", tc.n, got, tc.want)
		}
	}
	// A tail ends where the files ended when it was asked for, however much the worker
	// writes before the reader gets to copy (the driver suite's tail of 2 once read 3).
	i, off, err := tailStart(files, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	ends := []int64{4, 5}
	f, err := os.OpenFile(cur, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("\nf\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var b strings.Builder
	if err := copyFrom(context.Background(), &b, files, i, off, ends); err != nil {
		t.Fatal(err)
	}
	if b.String() != "d\ne" {
		t.Errorf("tail 2 as of before a write = %q, want %q", b.String(), "d\ne")
	}
	// Lines written after the ends were taken and before the tail is counted back are not
	// counted either (the cgroup v2 VM's tail of 2 read 3: counted from the file's end then).
	i, off, err = tailStart(files, 2, ends)
	if err != nil {
		t.Fatal(err)
	}
	b.Reset()
	if err := copyFrom(context.Background(), &b, files, i, off, ends); err != nil {
		t.Fatal(err)
	}
	if b.String() != "d\ne" {
		t.Errorf("tail 2 counted back from ends taken before a write = %q, want %q", b.String(), "d\ne")
	}
}

// TestFollowAcrossRotations follows a log from its start while the worker writes, while
// capLog rotates it and while a restart moves it away: the follower sees every byte written,
// once, in order (the first lines included: the follow takes over from the copy of what was
// there through one descriptor).
func TestFollowAcrossRotations(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "w.log")
	f, err := openLog(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		pw.CloseWithError(follow(ctx, pw, []string{p + ".1", p}, 1, 0))
	}()
	var got lockedBuf
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(&got, pr)
	}()
	var want strings.Builder
	for i := range 300 {
		line := fmt.Sprintf("line %03d %s\n", i, strings.Repeat("x", 40))
		want.WriteString(line)
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
		switch {
		case i%50 == 49:
			time.Sleep(2 * followPoll) // read, then rotated
			if err := capLog(p, 500, nil); err != nil {
				t.Fatal(err)
			}
		case i == 220:
			time.Sleep(2 * followPoll) // a restart: the run's file moves away
			f.Close()
			if err := rotatePrevious(p); err != nil {
				t.Fatal(err)
			}
			if f, err = openLog(p, nil); err != nil {
				t.Fatal(err)
			}
		}
		if i%10 == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	f.Close()
	testenv.EventuallyWith(t, "the follower caught up", 10*time.Second, func() (bool, string) {
		n := strings.Count(got.String(), "\n")
		return n >= 300, fmt.Sprintf("%d lines", n)
	})
	cancel()
	wg.Wait()
	<-done
	if got.String() != want.String() {
		t.Fatalf("followed %d bytes, wrote %d; they differ", len(got.String()), want.Len())
	}
}

type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
