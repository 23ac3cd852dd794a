package images

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
)

// ErrNotStatic: a binary links dynamically, so it cannot run in a FROM scratch image, which
// has no dynamic loader and no libc.
var ErrNotStatic = errors.New("binary is not statically linked")

// CheckStatic reports whether path is a static ELF executable.
func CheckStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s is not an ELF executable: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%w: %s needs a dynamic loader", ErrNotStatic, path)
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		return fmt.Errorf("%w: %s needs %v", ErrNotStatic, path, libs)
	}
	return nil
}

// DefaultBinary is the stormdock binary to put into images when none is named: the running
// executable, if it is static. A stormdock built with CGO_ENABLED=0 (the release build) is; a
// `go run` or race-enabled build is not, and then the caller must name one.
func DefaultBinary() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the running binary: %w", err)
	}
	if err := CheckStatic(exe); err != nil {
		return "", fmt.Errorf("cannot embed the running binary: %w: build a static one (CGO_ENABLED=0 go build -o stormdock ./cmd/stormdock) and pass its path", err)
	}
	return exe, nil
}
