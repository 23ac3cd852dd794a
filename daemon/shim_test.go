package daemon

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/isolation/shim"
)

// Launchers: stormdock-shim beside the binary is the shim and the launcher; without it, or
// when the workers' user could not run the binary for a `stormdock` command, the binary is
// both (the driver's own, /proc/self/exe, as the shim).
func TestLaunchers(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	nobody := &isolation.User{UID: 65534, GID: 65534, Name: "nobody"}
	install := func(t *testing.T, mode os.FileMode, withShim bool) (self, shimPath string) {
		// The test's directories open to others, as /usr/local/bin is; then bin in mode.
		base := t.TempDir()
		for _, d := range []string{base, filepath.Dir(base)} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		dir := filepath.Join(base, "bin")
		if err := os.Mkdir(dir, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		self, shimPath = filepath.Join(dir, "stormdock"), filepath.Join(dir, shim.Name)
		if err := os.WriteFile(self, nil, 0o755); err != nil {
			t.Fatal(err)
		}
		if withShim {
			if err := os.WriteFile(shimPath, nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return self, shimPath
	}
	for _, tc := range []struct {
		name     string
		mode     os.FileMode
		withShim bool
		runAs    *isolation.User
		shimSelf bool // the binary is both
	}{
		{"installed", 0o755, true, nil, false},
		{"installed, workers as nobody", 0o755, true, nobody, false},
		{"alone", 0o755, false, nil, true},
		{"private directory, workers as nobody", 0o700, true, nobody, true},
		{"private directory, workers as their tenants' uids", 0o700, true, nil, true},
		{"private directory, workers as the agent (--run-as itself)", 0o700, true, &isolation.User{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid())}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			self, shimPath := install(t, tc.mode, tc.withShim)
			gotShim, gotLauncher := Launchers(self, tc.runAs, log)
			wantShim, wantLauncher := shimPath, shimPath
			if tc.shimSelf {
				wantShim, wantLauncher = selfShim, self
			}
			if gotShim != wantShim || gotLauncher != wantLauncher {
				t.Fatalf("Launchers = %s, %s; want %s, %s", gotShim, gotLauncher, wantShim, wantLauncher)
			}
		})
	}
}
