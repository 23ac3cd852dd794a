package shim

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// envFD is a file holding b, open for reading, as the driver gives the shim on EnvFD.
func envFD(t *testing.T, b []byte) int {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "env")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	return int(f.Fd())
}

// FuzzEnv: what EncodeEnv writes, readEnv reads back, whatever the file offset.
func FuzzEnv(f *testing.F) {
	f.Add("A", "1", "LD_PRELOAD", "/x.so=y")
	f.Add("E", "", "S", " a b ")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		for _, s := range []string{k1, v1, k2, v2} {
			if strings.IndexByte(s, 0) >= 0 {
				t.Skip("NUL bytes are refused by the driver")
			}
		}
		if k1 == "" || k2 == "" || strings.Contains(k1, "=") || strings.Contains(k2, "=") ||
			strings.HasPrefix(k1, EnvPrefix) || strings.HasPrefix(k2, EnvPrefix) {
			t.Skip("not a variable of a worker")
		}
		env := []string{k1 + "=" + v1, k2 + "=" + v2}
		got, err := readEnv(envFD(t, EncodeEnv(env)))
		if err != nil || !slices.Equal(got, env) {
			t.Fatalf("readEnv(EncodeEnv(%q)) = %q, %v", env, got, err)
		}
	})
}

// readEnv refuses what no driver writes, and reads an empty environment as one.
func TestReadEnv(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  string
	}{
		{"", []string{}, ""},
		{"A=1\x00B=\x00", []string{"A=1", "B="}, ""},
		{"A=1", nil, "not ended by a NUL"},
		{"A=1\x00\x00", nil, "bad entry"},
		{"=1\x00", nil, "bad entry"},
		{"NOEQUALS\x00", nil, "bad entry"},
		{EnvPrefix + "USER=0:0:\x00", nil, "the protocol's"},
	} {
		got, err := readEnv(envFD(t, []byte(tc.in)))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("readEnv(%q) = %q, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("readEnv(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
