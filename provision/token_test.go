package provision

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// TestInstallTokens: create gives the operator the admin token and the scrape token (files
// 0600 whose hashes the store holds), and undo takes both back.
func TestInstallTokens(t *testing.T) {
	ctx := context.Background()
	s, err := coord.Open(ctx, "mem://provision-tokens", coord.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tk := Tokens{Dir: t.TempDir()}
	admin, undo, err := tk.Install(ctx, s, "demo")
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := tk.ClusterDir("demo")
	for _, f := range []struct{ file, key string }{{api.AdminTokenFile, cluster.AdminTokenKey}, {api.MetricsTokenFile, cluster.MetricsTokenKey}} {
		path := filepath.Join(dir, f.file)
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, %v", f.file, fi, err)
		}
		b, _ := os.ReadFile(path)
		e, err := s.Get(ctx, f.key)
		if err != nil || string(e.Value) != api.HashToken(strings.TrimSpace(string(b))) {
			t.Fatalf("%s: the stored hash does not match the file: %v", f.file, err)
		}
		if f.file == api.MetricsTokenFile && strings.TrimSpace(string(b)) == admin {
			t.Fatal("the scrape token is the admin token")
		}
	}
	undo(ctx)
	for _, key := range []string{cluster.AdminTokenKey, cluster.MetricsTokenKey} {
		if _, err := s.Get(ctx, key); !errors.Is(err, coord.ErrNotFound) {
			t.Errorf("%s after undo: %v", key, err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.token")); len(left) > 0 {
		t.Errorf("token files after undo: %v", left)
	}
}
