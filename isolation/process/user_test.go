package process_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/isolation"
)

// userHelperEnv makes this test binary, run by the driver in place (its program is the
// binary itself, as the lease launcher is), print its own status and that of a child it
// starts from its main goroutine, as the launcher starts its worker.
const userHelperEnv = "STORMDOCK_PROCESS_TEST_USER"

func init() {
	if os.Getenv(userHelperEnv) != "status" {
		return
	}
	self, _ := os.ReadFile("/proc/self/status")
	child, err := exec.Command("cat", "/proc/self/status").Output()
	fmt.Printf("self:\n%s\nchild:\n%s\nerr: %v\n", self, child, err)
	os.Exit(0)
}

// statusLines picks the identity lines of /proc/PID/status texts.
func statusLines(out string, key string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, key+":") {
			lines = append(lines, strings.Join(strings.Fields(strings.TrimPrefix(l, key+":")), " "))
		}
	}
	return lines
}

// TestRunAsUser: a worker with a User runs as that user, without supplementary groups,
// with no_new_privs, both when its program is exec'd and when it is the shim's own binary
// (stormdock-shim's launcher, exec'd afresh on v1, run in place on v2; this test binary as
// its own shim, run in place), and so do the processes it starts.
func TestRunAsUser(t *testing.T) {
	nobody := &isolation.User{UID: 65534, GID: 65534, Name: "nobody"}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	lease := filepath.Join(t.TempDir(), "lease")
	if err := os.WriteFile(lease, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		shim    string
		command []string
		env     map[string]string
		procs   int // status blocks in the output
	}{
		{"exec", shimBin, []string{"cat", "/proc/self/status"}, nil, 1},
		// The launcher's child prints its own status and its parent's: the launcher's.
		{"launcher-in-place", shimBin, []string{shimBin, "launch", "--lease", lease, "--ttl", "1m", "--",
			"/bin/sh", "-c", "cat /proc/self/status /proc/$PPID/status"}, nil, 2},
		{"in-place-by-self-shim", selfShim, []string{self}, map[string]string{userHelperEnv: "status"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriverWith(t, tc.shim)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			spec := harness().Spec(t, "user-"+tc.name, "unused")
			spec.Command, spec.Env, spec.User = tc.command, tc.env, nobody
			w, err := d.Start(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			stopOnCleanup(t, d, spec.ID)
			if ex, err := d.Wait(ctx, spec.ID); err != nil || !ex.Success() {
				out, _ := os.ReadFile(w.LogPath)
				t.Fatalf("wait: %v, %v\n%s", ex, err, out)
			}
			b, _ := os.ReadFile(w.LogPath)
			out := string(b)
			uids, gids, nnp, groups := statusLines(out, "Uid"), statusLines(out, "Gid"), statusLines(out, "NoNewPrivs"), statusLines(out, "Groups")
			if len(uids) != tc.procs || len(nnp) != tc.procs {
				t.Fatalf("want %d process status blocks:\n%s", tc.procs, out)
			}
			for i := range uids {
				if uids[i] != "65534 65534 65534 65534" || gids[i] != "65534 65534 65534 65534" || nnp[i] != "1" || groups[i] != "" {
					t.Errorf("process %d runs as uid %q gid %q groups %q no_new_privs %q; want nobody, no groups, 1", i, uids[i], gids[i], groups[i], nnp[i])
				}
			}
			if strings.Contains(out, "_STORMDOCK_ISOLATION_USER") {
				t.Error("the shim's user variable leaked into the worker's environment")
			}
		})
	}
}

// TestRunAsUserRefusedExec: a program the worker's user may not run fails the start with a
// message saying so, and nothing keeps running.
func TestRunAsUserRefusedExec(t *testing.T) {
	d := newDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A copy of hog in a directory only root may enter.
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(hog)
	if err != nil {
		t.Fatal(err)
	}
	private := filepath.Join(dir, "hog")
	if err := os.WriteFile(private, b, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := harness().Spec(t, "user-refused", "unused")
	spec.Command[0] = private
	spec.User = &isolation.User{UID: 65534, GID: 65534}
	_, err = d.Start(ctx, spec)
	if err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("start of a program out of the user's reach: %v", err)
	}
}

// TestProtocolVariablesFromTheWorker: the shim's variables are the driver's alone. A worker's
// environment that names them (a job spec the API would refuse, an older master's) steers
// nothing: the worker runs as its spec's user, and the shim writes no file it names.
func TestProtocolVariablesFromTheWorker(t *testing.T) {
	nobody := &isolation.User{UID: 65534, GID: 65534, Name: "nobody"}
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("intact"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, shim := range []string{shimBin, selfShim} {
		t.Run(filepath.Base(shim), func(t *testing.T) {
			d := newDriverWith(t, shim)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			spec := harness().Spec(t, "spoof-"+filepath.Base(shim), "unused")
			spec.Command = []string{"cat", "/proc/self/status"}
			spec.User = nobody
			spec.Env = map[string]string{
				"_STORMDOCK_ISOLATION_USER":  "0:0:",
				"_STORMDOCK_ISOLATION_PLACE": victim,
				"_STORMDOCK_ISOLATION_SHIM":  "place-self-then-exec-v1",
			}
			w, err := d.Start(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			stopOnCleanup(t, d, spec.ID)
			if ex, err := d.Wait(ctx, spec.ID); err != nil || !ex.Success() {
				out, _ := os.ReadFile(w.LogPath)
				t.Fatalf("wait: %v, %v\n%s", ex, err, out)
			}
			b, _ := os.ReadFile(w.LogPath)
			if uids := statusLines(string(b), "Uid"); len(uids) != 1 || uids[0] != "65534 65534 65534 65534" {
				t.Errorf("the worker runs as uid %q, want nobody's", uids)
			}
			if got, _ := os.ReadFile(victim); string(got) != "intact" {
				t.Errorf("a file the worker's environment named was written: %q", got)
			}
			if strings.Contains(string(b), "_STORMDOCK_ISOLATION") {
				t.Errorf("protocol variables reached the worker:\n%s", b)
			}
		})
	}
}
