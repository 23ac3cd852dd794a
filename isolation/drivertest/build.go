package drivertest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildStatic builds the Go package at pkg as a static binary named name in a new temporary
// directory and returns its path and the directory (for the caller to remove): the test
// workers the drivers run, which a FROM scratch image can hold too.
func BuildStatic(pkg, name string) (path, dir string, err error) {
	dir, err = os.MkdirTemp("", name)
	if err != nil {
		return "", "", err
	}
	path = filepath.Join(dir, name)
	build := exec.Command("go", "build", "-o", path, pkg)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", "", fmt.Errorf("build %s: %v\n%s", pkg, err, out)
	}
	return path, dir, nil
}
