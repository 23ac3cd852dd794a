package process_test

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation"
)

// envHelperEnv makes this test binary, run in place by the driver as its own shim (as the
// lease launcher is run by the stormdock binary), print its environment as the process sees
// it, then that of a child it starts (as the launcher starts its worker), NUL-separated, the
// two parts separated by a line "--"; "sleep" makes it wait for its stop instead.
const envHelperEnv = "STORMDOCK_PROCESS_TEST_ENV"

func init() {
	switch os.Getenv(envHelperEnv) {
	case "print":
		os.Stdout.WriteString(strings.Join(os.Environ(), "\x00") + "\x00\n--\n")
		cmd := exec.Command("cat", "/proc/self/environ")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	case "sleep":
		select {}
	}
}

// environ splits a NUL-separated environment, sorted.
func environ(b []byte) []string {
	var out []string
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		if len(kv) > 0 {
			out = append(out, string(kv))
		}
	}
	slices.Sort(out)
	return out
}

// wantEnviron is what a worker of spec sees: its spec's environment with the contract's
// variables, PATH by default, nothing of the shim's protocol.
func wantEnviron(spec isolation.Spec) []string {
	env := slices.DeleteFunc(spec.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "_STORMDOCK_ISOLATION_") })
	if spec.Env["PATH"] == "" {
		env = append(env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	slices.Sort(env)
	return env
}

// TestWorkerEnvironment: the worker's program sees exactly its spec's environment and the
// contract's variables, whichever shim starts it, whether or not it drops to another user,
// and whether it is exec'd or is the shim's own binary (the launcher: stormdock-shim's, and
// this test binary as its own shim, run in place), and so do the processes it starts. The
// spec's copies of the protocol's variables are gone.
func TestWorkerEnvironment(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	lease := filepath.Join(t.TempDir(), "lease")
	if err := os.WriteFile(lease, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	printEnv := []string{"cat", "/proc/self/environ"}
	type program struct {
		name    string
		command []string
		helper  bool // this test binary in place: its own and its child's environment
	}
	for _, shim := range []struct {
		name     string
		path     string
		programs []program
	}{
		{"stormdock-shim", shimBin, []program{
			{"exec", printEnv, false},
			{"launcher", append([]string{shimBin, "launch", "--lease", lease, "--ttl", "1m", "--"}, printEnv...), false},
		}},
		{"self", selfShim, []program{
			{"exec", printEnv, false},
			{"in-place", []string{self}, true},
		}},
	} {
		for _, user := range []*isolation.User{nil, {UID: 65534, GID: 65534, Name: "nobody"}} {
			for _, prog := range shim.programs {
				name := fmt.Sprintf("%s/%s/root", shim.name, prog.name)
				if user != nil {
					name = fmt.Sprintf("%s/%s/nobody", shim.name, prog.name)
				}
				t.Run(name, func(t *testing.T) {
					d := newDriverWith(t, shim.path)
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					spec := harness().Spec(t, "env-"+strings.ReplaceAll(name, "/", "-"), "unused")
					spec.Command, spec.User = prog.command, user
					spec.Env = map[string]string{
						"PLAIN": "1", "WITH_EQUALS": "a=b=c", "EMPTY": "", "SPACES": " x  y ",
						"LD_LIBRARY_PATH": "/nonexistent", "GOTRACEBACK": "none", "STORMDOCK_JOB": "overridden",
						"_STORMDOCK_ISOLATION_USER": "0:0:",
					}
					if prog.helper {
						spec.Env[envHelperEnv] = "print"
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
					out, err := os.ReadFile(w.LogPath)
					if err != nil {
						t.Fatal(err)
					}
					parts := [][]byte{out}
					if prog.helper {
						parts = bytes.Split(out, []byte("\n--\n"))
						if len(parts) != 2 {
							t.Fatalf("want the helper's environment and its child's:\n%q", out)
						}
					}
					want := wantEnviron(spec)
					for i, p := range parts {
						if got := environ(p); !slices.Equal(got, want) {
							t.Errorf("process %d of the worker sees environment\n%q\nwant\n%q", i, got, want)
						}
					}
				})
			}
		}
	}
}

// TestRunningWorkerEnviron: what the host sees in /proc/PID/environ of a running worker is
// its environment, with no variable of the shim's protocol, whichever shim started it.
func TestRunningWorkerEnviron(t *testing.T) {
	self := selfShimPath(t)
	for _, tc := range []struct {
		name    string
		shim    string
		command []string
		env     map[string]string
	}{
		{"stormdock-shim", shimBin, []string{"/bin/sleep", "100000"}, nil},
		{"self", selfShim, []string{"/bin/sleep", "100000"}, nil},
		// The shim's binary run in place, as the launcher is by the stormdock binary.
		{"self-in-place", selfShim, []string{self}, map[string]string{envHelperEnv: "sleep"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriverWith(t, tc.shim)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			spec := harness().Spec(t, "environ-"+tc.name, "unused")
			spec.Command = tc.command
			spec.User = &isolation.User{UID: 65534, GID: 65534}
			spec.Env = map[string]string{"SECRET_OF_A": "a-value", "PATH": "/usr/bin:/bin"}
			maps.Copy(spec.Env, tc.env)
			w, err := d.Start(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			stopOnCleanup(t, d, spec.ID)
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", w.PID))
			if err != nil {
				t.Fatal(err)
			}
			if got, want := environ(b), wantEnviron(spec); !slices.Equal(got, want) {
				t.Errorf("/proc/%d/environ holds\n%q\nwant\n%q", w.PID, got, want)
			}
		})
	}
}

// TestPreloadNeverRunsAsRoot: a worker's LD_PRELOAD is loaded by its own program, as its
// user, and never by the dynamic loader of a shim, which runs as the driver's user (root)
// until the drop. The library appends the uid and euid of every process that loads it to a
// marker file; the shims are dynamically linked: one built with cgo, moved into its cgroup by
// the driver; the same named stormdock-shim, which places itself (v1) or is cloned into its
// cgroup (v2); and this test binary as its own shim when it is linked dynamically (-race).
func TestPreloadNeverRunsAsRoot(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		testenv.Missing(t, "gcc, to build the preloaded library: %v (apt-get install gcc)", err)
	}
	if _, err := exec.LookPath("go"); err != nil {
		testenv.Missing(t, "go, to build a cgo-linked shim: %v", err)
	}
	// Everything here is the worker's user's to read and run, the marker its to write.
	dir, err := os.MkdirTemp("", "stormdock-preload-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "mark.c")
	lib := filepath.Join(dir, "libmark.so")
	if err := os.WriteFile(src, []byte(`#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
	const char *p = getenv("STORMDOCK_TEST_MARKER");
	FILE *f;
	if (p == NULL || (f = fopen(p, "a")) == NULL) return;
	fprintf(f, "uid=%d euid=%d\n", (int)getuid(), (int)geteuid());
	fclose(f);
}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", lib, err, out)
	}
	cgo := buildCgoShim(t, dir)
	named := filepath.Join(dir, "named", "stormdock-shim")
	if err := os.MkdirAll(filepath.Dir(named), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(cgo, named); err != nil {
		t.Fatal(err)
	}
	shims := []string{cgo, named}
	if dynamic(t, selfShimPath(t)) {
		shims = append(shims, selfShim)
	}
	for i, shim := range shims {
		name := []string{"cgo-moved", "cgo-named-stormdock-shim", "self"}[i]
		t.Run(name, func(t *testing.T) {
			if shim != selfShim && !dynamic(t, shim) {
				t.Fatalf("%s is linked statically: it shows nothing of the dynamic loader", shim)
			}
			marker := filepath.Join(dir, "marker-"+name)
			if err := os.WriteFile(marker, nil, 0o666); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(marker, 0o666); err != nil { // past the umask
				t.Fatal(err)
			}
			d := newDriverWith(t, shim)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			spec := harness().Spec(t, "preload-"+name, "unused")
			spec.Command = []string{"/bin/sh", "-c", "sleep 0"}
			spec.User = &isolation.User{UID: 65534, GID: 65534}
			spec.Env = map[string]string{"LD_PRELOAD": lib, "STORMDOCK_TEST_MARKER": marker}
			w, err := d.Start(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			stopOnCleanup(t, d, spec.ID)
			if ex, err := d.Wait(ctx, spec.ID); err != nil || !ex.Success() {
				out, _ := os.ReadFile(w.LogPath)
				t.Fatalf("wait: %v, %v\n%s", ex, err, out)
			}
			b, err := os.ReadFile(marker)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			// The worker's sh and sleep load it, as theirs: the library works.
			if !slices.Contains(lines, "uid=65534 euid=65534") {
				t.Fatalf("the worker's own programs did not load the library (the test shows nothing): marker %q", b)
			}
			for _, l := range lines {
				if l != "uid=65534 euid=65534" {
					t.Errorf("the worker's LD_PRELOAD was loaded by a process running as %q (want only the worker's uid 65534): marker %q", l, b)
				}
			}
		})
	}
}

// buildCgoShim builds testdata/cgoshim, linked with cgo, into dir.
func buildCgoShim(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "cgoshim")
	cmd := exec.Command("go", "build", "-o", out, "./testdata/cgoshim")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./testdata/cgoshim: %v\n%s", err, b)
	}
	return out
}

// selfShimPath is the file of this test binary, the selfShim.
func selfShimPath(t *testing.T) string {
	p, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// dynamic reports whether the ELF binary at path is linked dynamically (has an interpreter).
func dynamic(t *testing.T, path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
}

// TestShimOfAnotherProtocol: a shim that ends without confirming the exec (one that does not
// know this protocol's magic, as an older stormdock-shim, which prints its usage and exits)
// fails the start with an error saying what to install, and leaves nothing behind: the
// driver never takes the shim's end for the worker's. Named stormdock-shim, it is first
// asked to place itself (v1), then started again and moved by the driver.
func TestShimOfAnotherProtocol(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	named := filepath.Join(dir, "stormdock-shim")
	if err := os.WriteFile(named, b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, shim := range []string{"/bin/true", named} {
		t.Run(filepath.Base(shim), func(t *testing.T) {
			d := newDriverWith(t, shim)
			spec := harness().Spec(t, "other-protocol-"+filepath.Base(shim), "unused")
			spec.Command = []string{"/bin/sleep", "100000"}
			_, err := d.Start(context.Background(), spec)
			if err == nil || !strings.Contains(err.Error(), "without running the program") || !strings.Contains(err.Error(), shim) {
				t.Fatalf("start with shim %s: %v; want an error naming the shim that ran nothing", shim, err)
			}
			t.Logf("start refused: %v", err)
			if harness().Exists(t, isolation.Worker{Spec: spec}) {
				t.Error("the refused start left its cgroup")
			}
			if ws, _ := d.List(context.Background()); len(ws) != 0 {
				t.Errorf("the refused start left workers: %v", ws)
			}
		})
	}
}
