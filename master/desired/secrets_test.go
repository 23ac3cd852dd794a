package desired

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/keyring"
)

// testRing is a keyring file of one key in a temporary directory.
func testRing(t *testing.T) (*keyring.Keyring, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secrets.key")
	if _, err := keyring.Generate(p); err != nil {
		t.Fatal(err)
	}
	k, err := keyring.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return k, p
}

// storeHolds reports whether any value below dir holds b.
func storeHolds(t *testing.T, ts *testStore, dir string, b []byte) []string {
	t.Helper()
	var found []string
	var walk func(string)
	walk = func(k string) {
		if e, err := ts.admin.Get(ts.ctx, k); err == nil && bytes.Contains(e.Value, b) {
			found = append(found, k)
		}
		kids, _ := ts.admin.Children(ts.ctx, k)
		for _, c := range kids {
			walk(strings.TrimSuffix(k, "/") + "/" + c)
		}
	}
	walk(dir)
	return found
}

// TestSecretSetListDelete: a secret is kept sealed, listed without its value, set again as
// a new version (an equal value makes none) and deleted; every refusal is one line, shows
// no value and stores nothing.
func TestSecretSetListDelete(t *testing.T) {
	ts := newTestStore(t)
	ring, _ := testRing(t)
	for _, n := range []string{"acme", "other"} {
		if err := CreateTenant(ts.ctx, ts.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	value := []byte("s3cret-db-password")
	for _, c := range []struct {
		name, tenant, secret string
		value                []byte
		ring                 *keyring.Keyring
		want                 error
	}{
		{"no keyring", "acme", "db", value, nil, api.ErrConflict},
		{"bad name", "acme", "../db", value, ring, api.ErrBadInput},
		{"dot name", "acme", ".db", value, ring, api.ErrBadInput},
		{"bad tenant", "../jobs", "db", value, ring, api.ErrBadInput},
		{"unknown tenant", "nobody", "db", value, ring, api.ErrNotFound},
		{"empty", "acme", "db", nil, ring, api.ErrBadInput},
		{"too large", "acme", "db", append(bytes.Repeat([]byte("x"), cluster.MaxSecretBytes), value...), ring, api.ErrTooLarge},
	} {
		_, _, err := SetSecret(ts.ctx, ts.admin, c.ring, c.tenant, c.secret, c.value, "admin")
		if !errors.Is(err, c.want) || strings.Contains(err.Error(), string(value)) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v; want %v in one line without the value", c.name, err, c.want)
		}
	}
	if got := storeHolds(t, ts, "/", []byte("db")); len(got) > 0 {
		t.Fatalf("refusals stored %v", got)
	}

	meta, changed, err := SetSecret(ts.ctx, ts.admin, ring, "acme", "db", value, "tenant/acme")
	if err != nil || !changed || meta.Version != 1 || meta.Size != len(value) || meta.UpdatedBy != "tenant/acme" {
		t.Fatalf("set: %+v %v %v", meta, changed, err)
	}
	if got := storeHolds(t, ts, "/", value); len(got) > 0 {
		t.Fatalf("the value is in clear at %v", got)
	}
	if v, version, err := OpenSecret(ts.ctx, ts.admin, ring, "acme", "db"); err != nil || !bytes.Equal(v, value) || version != 1 {
		t.Fatalf("open: %q %d %v", v, version, err)
	}
	// The same value again: no new version (no worker gets a SIGHUP for nothing).
	if meta, changed, err := SetSecret(ts.ctx, ts.admin, ring, "acme", "db", value, "admin"); err != nil || changed || meta.Version != 1 {
		t.Fatalf("same value: %+v %v %v", meta, changed, err)
	}
	if meta, changed, err := SetSecret(ts.ctx, ts.admin, ring, "acme", "db", []byte("rotated"), "admin"); err != nil || !changed || meta.Version != 2 {
		t.Fatalf("rotate: %+v %v %v", meta, changed, err)
	}
	if v, version, _ := OpenSecret(ts.ctx, ts.admin, ring, "acme", "db"); string(v) != "rotated" || version != 2 {
		t.Fatalf("after rotation: %q %d", v, version)
	}
	list, err := ListSecrets(ts.ctx, ts.admin, "acme")
	if err != nil || len(list) != 1 || list[0].Name != "db" || list[0].Version != 2 || list[0].Size != len("rotated") {
		t.Fatalf("list: %+v %v", list, err)
	}
	if other, err := ListSecrets(ts.ctx, ts.admin, "other"); err != nil || len(other) != 0 {
		t.Fatalf("another tenant's list: %+v %v", other, err)
	}
	// A sealed value moved to another tenant's or name's key does not open there.
	src, _ := cluster.SecretKey("acme", "db")
	e, _ := ts.admin.Get(ts.ctx, src)
	for _, to := range [][2]string{{"other", "db"}, {"acme", "api"}} {
		if _, _, err := SetSecret(ts.ctx, ts.admin, ring, to[0], to[1], []byte("x"), "admin"); err != nil {
			t.Fatal(err)
		}
		k, _ := cluster.SecretKey(to[0], to[1])
		if _, err := ts.admin.Put(ts.ctx, k, e.Value, coord.AnyVersion); err != nil {
			t.Fatal(err)
		}
		if v, _, err := OpenSecret(ts.ctx, ts.admin, ring, to[0], to[1]); err == nil || v != nil {
			t.Errorf("acme's sealed db moved to %s/%s opened: %q", to[0], to[1], v)
		}
	}

	if err := DeleteSecret(ts.ctx, ts.admin, "acme", "nope"); !errors.Is(err, api.ErrNotFound) || !strings.Contains(err.Error(), "stormdock secret list acme") {
		t.Errorf("delete unknown: %v", err)
	}
	if err := DeleteSecret(ts.ctx, ts.admin, "acme", "db"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := OpenSecret(ts.ctx, ts.admin, ring, "acme", "db"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("open after delete: %v", err)
	}
	if list, _ := ListSecrets(ts.ctx, ts.admin, "acme"); len(list) != 1 || list[0].Name != "api" {
		t.Errorf("list after delete: %+v", list)
	}
}

// TestSecretsNamedBySpec: a job names only secrets its own tenant has, at submit, update and
// rollback, nothing stored on a refusal; a secret a job names is not deleted under it.
func TestSecretsNamedBySpec(t *testing.T) {
	ts := newTestStore(t)
	ring, _ := testRing(t)
	for _, n := range []string{"search", "other"} {
		if err := CreateTenant(ts.ctx, ts.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := SetSecret(ts.ctx, ts.admin, ring, "other", "theirs", []byte("v"), "admin"); err != nil {
		t.Fatal(err)
	}
	spec := testSpec("wc", 1)
	spec.Secrets = []string{"db"}
	if _, err := SubmitJob(ts.ctx, ts.admin, spec); !errors.Is(err, api.ErrBadInput) || !strings.Contains(err.Error(), "tenant search has no secret db") {
		t.Fatalf("submit naming a missing secret: %v", err)
	}
	spec.Secrets = []string{"theirs"}
	if _, err := SubmitJob(ts.ctx, ts.admin, spec); !errors.Is(err, api.ErrBadInput) || !strings.Contains(err.Error(), "a job names only its own tenant's secrets") {
		t.Fatalf("submit naming another tenant's secret: %v", err)
	}
	if _, _, err := ReadJob(ts.ctx, ts.admin, "wc"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("a refused submit stored the job: %v", err)
	}
	if _, _, err := SetSecret(ts.ctx, ts.admin, ring, "search", "db", []byte("v1"), "admin"); err != nil {
		t.Fatal(err)
	}
	spec.Secrets = []string{"db"}
	if _, err := SubmitJob(ts.ctx, ts.admin, spec); err != nil {
		t.Fatal(err)
	}
	if err := DeleteSecret(ts.ctx, ts.admin, "search", "db"); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "named by job wc") {
		t.Fatalf("delete of a secret a job names: %v", err)
	}
	// An update that names a missing secret changes nothing; one that drops it frees it.
	next := *spec
	next.Secrets = []string{"db", "api"}
	if _, _, err := UpdateJob(ts.ctx, ts.admin, "wc", Change{Spec: &next}); !errors.Is(err, api.ErrBadInput) {
		t.Fatalf("update naming a missing secret: %v", err)
	}
	if rec, _, _ := ReadJob(ts.ctx, ts.admin, "wc"); rec.Generation != 1 {
		t.Fatalf("a refused update made generation %d", rec.Generation)
	}
	next.Secrets = nil
	if _, _, err := UpdateJob(ts.ctx, ts.admin, "wc", Change{Spec: &next}); err != nil {
		t.Fatal(err)
	}
	if err := DeleteSecret(ts.ctx, ts.admin, "search", "db"); err != nil {
		t.Fatalf("delete once no job names it: %v", err)
	}
	// Back to generation 1, which named it: refused while the secret is gone.
	if _, _, err := RollbackJob(ts.ctx, ts.admin, "wc", Change{}); !errors.Is(err, api.ErrBadInput) || !strings.Contains(err.Error(), "no secret db") {
		t.Fatalf("rollback to a generation naming a deleted secret: %v", err)
	}
}

// TestSecretDeleteRacesSubmit: a delete and a submit naming the same secret at once never
// leave a job naming a secret that is gone.
func TestSecretDeleteRacesSubmit(t *testing.T) {
	ts := newTestStore(t)
	ring, _ := testRing(t)
	if err := CreateTenant(ts.ctx, ts.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, _, err := SetSecret(ts.ctx, ts.admin, ring, "search", "db", []byte(fmt.Sprint(i)), "admin"); err != nil {
			t.Fatal(err)
		}
		spec := testSpec(fmt.Sprintf("wc-%d", i), 1)
		spec.Secrets = []string{"db"}
		a, b := ts.connect(-1), ts.connect(-1)
		var wg sync.WaitGroup
		var subErr, delErr error
		wg.Add(2)
		go func() { defer wg.Done(); _, subErr = SubmitJob(ts.ctx, a, spec) }()
		go func() { defer wg.Done(); delErr = DeleteSecret(ts.ctx, b, "search", "db") }()
		wg.Wait()
		_, _, gone := OpenSecret(ts.ctx, ts.admin, ring, "search", "db")
		_, _, jobErr := ReadJob(ts.ctx, ts.admin, spec.Name)
		if jobErr == nil && gone != nil {
			t.Fatalf("round %d: job %s names db, which is gone (submit %v, delete %v)", i, spec.Name, subErr, delErr)
		}
		if jobErr == nil {
			// Free the secret for the next round.
			spec.Secrets = nil
			if _, _, err := UpdateJob(ts.ctx, ts.admin, spec.Name, Change{Spec: spec}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestRewrapSecrets: after a new key heads the keyring, rewrap seals every value with it
// (same versions), and the old key can then leave the keyring.
func TestRewrapSecrets(t *testing.T) {
	ts := newTestStore(t)
	ring, path := testRing(t)
	if err := CreateTenant(ts.ctx, ts.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "acme"}}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b"} {
		if _, _, err := SetSecret(ts.ctx, ts.admin, ring, "acme", n, []byte("value-"+n), "admin"); err != nil {
			t.Fatal(err)
		}
	}
	old := ring.Active()
	if _, err := keyring.Generate(path); err != nil {
		t.Fatal(err)
	}
	both, err := keyring.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	n, cur, err := RewrapSecrets(ts.ctx, ts.admin, both)
	if err != nil || n != 2 || cur != 0 {
		t.Fatalf("rewrap: %d %d %v", n, cur, err)
	}
	if n, cur, _ := RewrapSecrets(ts.ctx, ts.admin, both); n != 0 || cur != 2 {
		t.Fatalf("rewrap again: %d %d", n, cur)
	}
	// Drop the old key from the file: everything still opens, at the same version.
	b, _ := os.ReadFile(path)
	var kept []string
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, old+" ") {
			kept = append(kept, line)
		}
	}
	if err := os.WriteFile(path, []byte(strings.Join(kept, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	newOnly, err := keyring.Load(path)
	if err != nil || len(newOnly.IDs()) != 1 {
		t.Fatal(newOnly, err)
	}
	for _, name := range []string{"a", "b"} {
		if v, version, err := OpenSecret(ts.ctx, ts.admin, newOnly, "acme", name); err != nil || string(v) != "value-"+name || version != 1 {
			t.Errorf("%s with the new key alone: %q %d %v", name, v, version, err)
		}
	}
	if _, _, err := OpenSecret(ts.ctx, ts.admin, ring, "acme", "a"); !errors.Is(err, keyring.ErrUnknownKey) {
		t.Errorf("the old keyring after rewrap: %v, want an unknown key", err)
	}
}
