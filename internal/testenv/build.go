package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// builds are the binaries this test process built, by package and flags, in one directory
// that outlives the tests and that RemoveBuilds removes.
var builds struct {
	mu   sync.Mutex
	dir  string
	done map[string]built
}

type built struct {
	path string
	err  error
}

// BuildBinary builds the Go package pkg of this module, named by its path from the module
// root ("./cmd/stormdock", "./isolation/testdata/hog"), as a static binary (CGO_ENABLED=0),
// which a FROM scratch image can hold too. It builds once per test binary for pkg and flags
// (extra `go build` flags) and returns the binary's path; a failed build fails the test. The
// package's TestMain removes the binaries with RemoveBuilds.
//
// ./cmd/stormdock is built as it is installed: with stormdock-shim (./cmd/stormdock-shim)
// beside it, where its process driver and agents look for it.
func BuildBinary(t testing.TB, pkg string, flags ...string) string {
	t.Helper()
	p, err := Build(pkg, flags...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Build is BuildBinary for TestMain, which has no testing.TB: it returns the build's error.
//
// Where no Go toolchain runs (the cgroup v2 virtual machine of scripts/vmtest), the binaries
// are built beforehand and PrebuiltEnv names the directory that holds them, each at its
// package path: DIR/cmd/stormdock for "./cmd/stormdock". Build then returns that path and
// never runs go.
func Build(pkg string, flags ...string) (string, error) {
	key := strings.Join(append([]string{pkg}, flags...), "\x00")
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if b, ok := builds.done[key]; ok {
		return b.path, b.err
	}
	var p string
	var err error
	if dir := os.Getenv(PrebuiltEnv); dir != "" {
		p, err = prebuilt(dir, pkg, flags)
	} else {
		p, err = build(pkg, flags)
	}
	if builds.done == nil {
		builds.done = map[string]built{}
	}
	builds.done[key] = built{p, err}
	return p, err
}

// PrebuiltEnv names the directory of binaries built beforehand (see Build).
const PrebuiltEnv = "STORMDOCK_TEST_BINARIES"

// prebuilt finds pkg's binary under dir. Only plain builds can be prebuilt: flags would
// make a different binary.
func prebuilt(dir, pkg string, flags []string) (string, error) {
	rel := path.Clean(strings.TrimPrefix(pkg, "./"))
	if len(flags) > 0 {
		return "", fmt.Errorf("testenv: %s=%s: %s is wanted with build flags %q, which a prebuilt binary cannot have", PrebuiltEnv, dir, pkg, flags)
	}
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("testenv: %s=%s holds no executable %s: build it there (CGO_ENABLED=0 go build -o %s %s)", PrebuiltEnv, dir, rel, p, pkg)
	}
	return p, nil
}

// build runs go build for pkg into a directory of its own under builds.dir; the caller holds
// builds.mu.
func build(pkg string, flags []string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	if builds.dir == "" {
		if builds.dir, err = os.MkdirTemp("", "stormdock-testbin-"); err != nil {
			return "", fmt.Errorf("testenv: %w", err)
		}
		// Workers run as nobody: built programs are everyone's to run, as installed ones are.
		if err := os.Chmod(builds.dir, 0o755); err != nil {
			return "", fmt.Errorf("testenv: %w", err)
		}
	}
	dir := filepath.Join(builds.dir, strconv.Itoa(len(builds.done)))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	out := filepath.Join(dir, path.Base(pkg))
	pkgs := []string{pkg}
	if path.Clean(strings.TrimPrefix(pkg, "./")) == "cmd/stormdock" {
		pkgs = append(pkgs, "./cmd/stormdock-shim")
	}
	// With -o naming a directory, go build writes each package's binary into it.
	args := append(append([]string{"build", "-o", dir + "/"}, flags...), pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("testenv: go %s (in %s): %v\n%s", strings.Join(args, " "), root, err, b)
	}
	return out, nil
}

// moduleRoot is the nearest directory at or above the working directory that holds a go.mod,
// found once: go test starts a test binary in its package's directory.
var moduleRoot = sync.OnceValues(func() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("testenv: no go.mod at or above the working directory")
		}
		dir = up
	}
})

// RemoveBuilds removes every binary this process built (never prebuilt ones). TestMain calls
// it after m.Run.
func RemoveBuilds() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir != "" {
		os.RemoveAll(builds.dir)
	}
	builds.dir, builds.done = "", nil
}
