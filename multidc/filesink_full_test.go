package multidc

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stormdock/stormdock/internal/testenv"
)

// A file sink on a disk that fills up (a real tmpfs): the batch that does not fit fails and
// is cut off again, so the file ends on a whole line; once there is space the router goes on
// from its last record, and a restarted one recognises the file and goes on too. No record
// is joined onto a torn one, none is missing or doubled.
func TestFileSinkOnAFullDisk(t *testing.T) {
	ctx := context.Background()
	disk := testenv.Tmpfs(t, 256<<10)
	base := filepath.Join(disk, "sinks", testTenant)
	if err := os.MkdirAll(base, 0o750); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(disk, "filler")
	if err := os.WriteFile(filler, make([]byte, 128<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(base, "out.jsonl")
	s, err := openTestFileSink(path, FsyncCheckpoint)
	if err != nil {
		t.Fatal(err)
	}
	var next int64
	var werr error
	for werr == nil && next < 100000 {
		if werr = s.Write(ctx, recs("dc-a", next, next+37)); werr == nil {
			next += 37
			werr = s.Sync(ctx)
		}
	}
	if werr == nil || !strings.Contains(werr.Error(), "no space left on device") {
		t.Fatalf("writes to a full disk ended with %v; want the disk's error", werr)
	}
	lines := readSinkFile(t, path) // every line whole
	if last, _ := s.LastOffset(ctx); int64(len(lines)) != last+1 || lines[len(lines)-1].Offset != last {
		t.Fatalf("%d lines in the file, the sink's last offset %d: they disagree", len(lines), last)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	from, _ := s.LastOffset(ctx)
	if err := s.Write(ctx, recs("dc-b", from+1, from+50)); err != nil {
		t.Fatalf("write once there is space: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = openTestFileSink(path, FsyncCheckpoint)
	if err != nil {
		t.Fatalf("reopen after the full disk: %v", err)
	}
	last, _ := s.LastOffset(ctx)
	if err := s.Write(ctx, recs("dc-b", last+1, last+10)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	lines = readSinkFile(t, path)
	for i, l := range lines {
		if l.Offset != int64(i) {
			t.Fatalf("line %d holds offset %d: a record missing or doubled", i, l.Offset)
		}
	}
	if got := lines[len(lines)-1].Offset; got != from+58 {
		t.Errorf("last offset %d; want %d", got, from+58)
	}
}
