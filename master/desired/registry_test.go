package desired

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
)

// TestTenantRegistryAuth: credentials are checked, stored under the tenant in a key of
// their own with only their auths (a credsStore and other keys dropped), never in the
// tenant record; refusals change nothing and show no secret; clear removes them.
func TestTenantRegistryAuth(t *testing.T) {
	ts := newTestStore(t)
	if err := CreateTenant(ts.ctx, ts.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "acme"}}); err != nil {
		t.Fatal(err)
	}
	tkey, _ := cluster.TenantKey("acme")
	before, _ := ts.admin.Get(ts.ctx, tkey)
	for _, c := range []struct {
		name, tenant, body string
		want               error
	}{
		{"not JSON", "acme", `{"auths": {"h": {"auth": "s3cret`, api.ErrBadInput},
		{"no auths", "acme", `{"credsStore": "desktop"}`, api.ErrBadInput},
		{"not base64", "acme", `{"auths": {"h": {"auth": "s3cret!!"}}}`, api.ErrBadInput},
		{"unknown tenant", "nobody", `{"auths": {"h": {"username": "u", "password": "s3cret"}}}`, api.ErrNotFound},
		{"bad name", "../jobs", `{"auths": {"h": {"username": "u", "password": "s3cret"}}}`, api.ErrBadInput},
	} {
		_, err := SetTenantRegistryAuth(ts.ctx, ts.admin, nil, c.tenant, []byte(c.body))
		if !errors.Is(err, c.want) || strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v; want %v in one line without the secret", c.name, err, c.want)
		}
	}
	if a, err := TenantRegistryAuth(ts.ctx, ts.admin, nil, "acme"); a != nil || err != nil {
		t.Fatalf("after refusals: %v, %v; want none", a, err)
	}
	hosts, err := SetTenantRegistryAuth(ts.ctx, ts.admin, nil, "acme",
		[]byte(`{"auths": {"https://127.0.0.1:5055/v1/": {"username": "u", "password": "s3cret"}}, "credsStore": "desktop", "HttpHeaders": {"X": "y"}}`))
	if err != nil || !slices.Equal(hosts, []string{"127.0.0.1:5055"}) {
		t.Fatalf("set: %v, %v", hosts, err)
	}
	key, _ := cluster.TenantRegistryAuthKey("acme")
	e, err := ts.admin.Get(ts.ctx, key)
	if err != nil || strings.Contains(string(e.Value), "credsStore") || strings.Contains(string(e.Value), "HttpHeaders") || !strings.Contains(string(e.Value), `"127.0.0.1:5055"`) {
		t.Fatalf("stored %s, %v; want only the auths, by host", e.Value, err)
	}
	if after, _ := ts.admin.Get(ts.ctx, tkey); string(after.Value) != string(before.Value) || strings.Contains(string(after.Value), "auth") {
		t.Fatalf("the tenant record changed: %s", after.Value)
	}
	a, err := TenantRegistryAuth(ts.ctx, ts.admin, nil, "acme")
	if c, ok, _ := a.For("127.0.0.1:5055"); err != nil || !ok || c.Username != "u" || c.Password != "s3cret" {
		t.Fatalf("read back: %v, %v", c, err)
	}
	if err := ClearTenantRegistryAuth(ts.ctx, ts.admin, "acme"); err != nil {
		t.Fatal(err)
	}
	if err := ClearTenantRegistryAuth(ts.ctx, ts.admin, "acme"); err != nil {
		t.Fatalf("clearing twice: %v", err)
	}
	if a, err := TenantRegistryAuth(ts.ctx, ts.admin, nil, "acme"); a != nil || err != nil {
		t.Fatalf("after clear: %v, %v", a, err)
	}
}

// TestShareImages: prefixes are normalized, listed sorted and once; unsharing one not
// listed, or a bad prefix, is refused and changes nothing.
func TestShareImages(t *testing.T) {
	ts := newTestStore(t)
	steps := []struct {
		prefix string
		share  bool
		want   []string
		err    error
	}{
		{"127.0.0.1:5055/base/", true, []string{"127.0.0.1:5055/base"}, nil},
		{"127.0.0.1:5055/base", true, []string{"127.0.0.1:5055/base"}, nil},
		{"127.0.0.1:5055/apps/", true, []string{"127.0.0.1:5055/apps", "127.0.0.1:5055/base"}, nil},
		{"base/", true, nil, api.ErrBadInput},
		{"127.0.0.1:5055/other/", false, nil, api.ErrNotFound},
		{"127.0.0.1:5055/base/", false, []string{"127.0.0.1:5055/apps"}, nil},
	}
	for _, s := range steps {
		got, err := ShareImages(ts.ctx, ts.admin, s.prefix, s.share)
		if s.err != nil {
			if !errors.Is(err, s.err) {
				t.Errorf("share(%q, %v): %v; want %v", s.prefix, s.share, err, s.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, s.want) {
			t.Errorf("share(%q, %v) = %v, %v; want %v", s.prefix, s.share, got, err, s.want)
		}
	}
	if got, err := SharedImages(ts.ctx, ts.admin); err != nil || !slices.Equal(got, []string{"127.0.0.1:5055/apps"}) {
		t.Errorf("SharedImages = %v, %v", got, err)
	}
}
