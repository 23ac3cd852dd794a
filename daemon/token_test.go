package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// The admin token and the scrape token are made alike: the file (0600) holds the token whose
// hash the store has, a second start keeps it, another data directory gets none.
func TestEnsureTokens(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ensure func(context.Context, coord.KV, string) (string, error)
		key    string
		file   string
	}{
		{"admin", EnsureAdminToken, cluster.AdminTokenKey, api.AdminTokenFile},
		{"metrics", EnsureMetricsToken, cluster.MetricsTokenKey, api.MetricsTokenFile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, err := coord.Open(ctx, "mem://tokens-"+tc.name, coord.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			dir := t.TempDir()
			path, err := tc.ensure(ctx, s, dir)
			if err != nil || path != filepath.Join(dir, tc.file) {
				t.Fatalf("first start: %q, %v", path, err)
			}
			fi, err := os.Stat(path)
			if err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("token file mode: %v, %v", fi, err)
			}
			b, _ := os.ReadFile(path)
			e, err := s.Get(ctx, tc.key)
			if err != nil || string(e.Value) != api.HashToken(strings.TrimSpace(string(b))) {
				t.Fatalf("stored hash does not match the file: %v", err)
			}
			if strings.Contains(string(e.Value), strings.TrimSpace(string(b))) {
				t.Fatal("the store holds the token itself")
			}
			if again, err := tc.ensure(ctx, s, dir); err != nil || again != path {
				t.Fatalf("second start: %q, %v", again, err)
			}
			// Another master's data directory: the token is not its to show.
			if other, err := tc.ensure(ctx, s, t.TempDir()); err != nil || other != "" {
				t.Fatalf("another data directory: %q, %v", other, err)
			}
		})
	}
	// Two tokens, not one: the scrape token must not be the admin token.
	ctx := context.Background()
	s, err := coord.Open(ctx, "mem://tokens-both", coord.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dir := t.TempDir()
	a, aerr := EnsureAdminToken(ctx, s, dir)
	m, merr := EnsureMetricsToken(ctx, s, dir)
	ab, _ := os.ReadFile(a)
	mb, _ := os.ReadFile(m)
	if aerr != nil || merr != nil || len(ab) == 0 || string(ab) == string(mb) {
		t.Fatalf("admin %q (%v), scrape %q (%v)", ab, aerr, mb, merr)
	}
}

// Masters sharing a data directory start at the same moment: one token is made, and the file
// holds the token whose hash the store has.
func TestEnsureAdminTokenRace(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for i := range 20 {
		s, err := coord.Open(ctx, fmt.Sprintf("mem://race-%d", i), coord.Options{})
		if err != nil {
			t.Fatal(err)
		}
		sub := filepath.Join(dir, fmt.Sprint(i))
		var wg sync.WaitGroup
		paths := make([]string, 4)
		for j := range paths {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p, err := EnsureAdminToken(ctx, s, sub)
				if err != nil {
					t.Error(err)
				}
				paths[j] = p
			}()
		}
		wg.Wait()
		b, err := os.ReadFile(filepath.Join(sub, api.AdminTokenFile))
		e, gerr := s.Get(ctx, cluster.AdminTokenKey)
		if err != nil || gerr != nil || string(e.Value) != api.HashToken(strings.TrimSpace(string(b))) {
			t.Fatalf("round %d: token file %q (%v) does not match the stored hash (%v)", i, b, err, gerr)
		}
		if left, _ := filepath.Glob(filepath.Join(sub, ".admin.token-*")); len(left) > 0 {
			t.Errorf("round %d: temporary files left: %v", i, left)
		}
		s.Close()
	}
}
