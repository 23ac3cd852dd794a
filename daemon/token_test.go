package daemon

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

func TestEnsureAdminToken(t *testing.T) {
	ctx := context.Background()
	s, err := coord.Open(ctx, "mem://"+t.Name(), coord.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dir := t.TempDir()
	path, err := EnsureAdminToken(ctx, s, dir)
	if err != nil || path == "" {
		t.Fatalf("first start: %q, %v", path, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode: %v, %v", fi, err)
	}
	b, _ := os.ReadFile(path)
	e, err := s.Get(ctx, cluster.AdminTokenKey)
	if err != nil || string(e.Value) != api.HashToken(strings.TrimSpace(string(b))) {
		t.Fatalf("stored hash does not match the file: %v", err)
	}
	if again, err := EnsureAdminToken(ctx, s, dir); err != nil || again != path {
		t.Fatalf("second start: %q, %v", again, err)
	}
	// Another master's data directory: the token is not its to show.
	if other, err := EnsureAdminToken(ctx, s, t.TempDir()); err != nil || other != "" {
		t.Fatalf("another data directory: %q, %v", other, err)
	}
}
