package shim

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// FuzzUserSpec: what UserSpec writes, ParseUserSpec reads back.
func FuzzUserSpec(f *testing.F) {
	f.Add(uint32(65534), uint32(65534), uint32(0), uint32(1), 0)
	f.Add(uint32(0), uint32(0), uint32(10), uint32(20), 2)
	f.Fuzz(func(t *testing.T, uid, gid, g1, g2 uint32, n int) {
		groups := []uint32{g1, g2}[:max(0, min(n, 2))]
		u, g, gs, err := ParseUserSpec(UserSpec(uid, gid, groups))
		if err != nil {
			t.Fatal(err)
		}
		want := make([]int, len(groups))
		for i, x := range groups {
			want[i] = int(x)
		}
		if u != int(uid) || g != int(gid) || !slices.Equal(gs, want) {
			t.Fatalf("%d:%d:%v read back as %d:%d:%v", uid, gid, groups, u, g, gs)
		}
	})
}

func TestParseUserSpecRefuses(t *testing.T) {
	for _, s := range []string{"", "1", "1:2", "a:2:", "1:b:", "1:2:x", "1:2:3,", "-1:2:", "4294967296:0:"} {
		if _, _, _, err := ParseUserSpec(s); err == nil {
			t.Errorf("ParseUserSpec(%q) accepted", s)
		}
	}
}

// Beside finds stormdock-shim in the directory of a binary, when it may be run.
func TestBeside(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "stormdock")
	if _, ok := Beside(exe); ok {
		t.Fatal("found a stormdock-shim in an empty directory")
	}
	p := filepath.Join(dir, Name)
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := Beside(exe); ok {
		t.Fatal("found a stormdock-shim that may not be run")
	}
	if err := os.Chmod(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, ok := Beside(exe); !ok || got != p {
		t.Fatalf("Beside(%s) = %q, %v; want %s", exe, got, ok, p)
	}
}
