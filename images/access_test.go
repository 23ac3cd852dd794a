package images

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

func TestCheckPrefixAndSharedUnder(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{in: "127.0.0.1:5055/base/", want: "127.0.0.1:5055/base"},
		{in: "127.0.0.1:5055/base", want: "127.0.0.1:5055/base"},
		{in: "127.0.0.1:5055", want: "127.0.0.1:5055"},
		{in: "127.0.0.1:5055/", want: "127.0.0.1:5055"},
		{in: "registry.example.com/team/a/", want: "registry.example.com/team/a"},
		{in: "docker.io/library/", want: "docker.io/library"},
		{in: "", err: "empty prefix"},
		{in: "base/", err: "names no registry"},
		{in: "127.0.0.1:5055/base:1", err: "tag or digest"},
		{in: "127.0.0.1:5055/Base", err: "want REGISTRY/PATH/"},
	} {
		got, err := CheckPrefix(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrBadReference) {
				t.Errorf("CheckPrefix(%q) = %q, %v; want an error saying %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("CheckPrefix(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	prefixes := []string{"127.0.0.1:5055/base", "reg.example.com"}
	for _, tc := range []struct {
		ref  string
		want bool
	}{
		{"127.0.0.1:5055/base/w:1", true},
		{"127.0.0.1:5055/base/team/w@sha256:" + strings.Repeat("a", 64), true},
		{"127.0.0.1:5055/base:1", true},
		{"127.0.0.1:5055/basement/w:1", false},
		{"127.0.0.1:5055/other/base/w:1", false},
		{"127.0.0.1:5056/base/w:1", false},
		{"reg.example.com/anything/w", true},
		{"reg.example.com.evil.io/anything/w", false},
		{"base/w:1", false},
		{"not a ref", false},
	} {
		if got := SharedUnder(prefixes, tc.ref); got != tc.want {
			t.Errorf("SharedUnder(%v, %q) = %v; want %v", prefixes, tc.ref, got, tc.want)
		}
	}
}

func TestParseAuthMarshal(t *testing.T) {
	for _, tc := range []struct {
		name, in, err string
	}{
		{name: "basic", in: `{"auths":{"https://127.0.0.1:5055/v2/":{"auth":"dTpzM2NyZXQ="}},"credsStore":"desktop"}`},
		{name: "fields", in: `{"auths":{"127.0.0.1:5055":{"username":"u","password":"s3cret"}}}`},
		{name: "not JSON", in: `{"auths":`, err: "not JSON"},
		{name: "no auths", in: `{}`, err: "no registry"},
		{name: "bad base64", in: `{"auths":{"h":{"auth":"s3cret!!"}}}`, err: "not base64"},
		{name: "no credential", in: `{"auths":{"h":{}}}`, err: "has no credential"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := ParseAuth([]byte(tc.in), "tenant t's registry credentials")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "s3cret") {
					t.Fatalf("ParseAuth = %v; want an error saying %q and no secret", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if h := a.Hosts(); len(h) != 1 || h[0] != "127.0.0.1:5055" {
				t.Fatalf("Hosts = %v", h)
			}
			b, err := ParseAuth(a.Marshal(), "again")
			if err != nil {
				t.Fatal(err)
			}
			c1, _, _ := a.For("127.0.0.1:5055")
			c2, _, _ := b.For("127.0.0.1:5055")
			if c1 != c2 || c1.Password != "s3cret" {
				t.Fatalf("round trip: %#v vs %#v", c1, c2)
			}
		})
	}
}

// TestTenantAccess, against an htpasswd registry and the engine: once one tenant's
// credentials pulled an image onto the engine, a pull of it by digest with no credentials or
// wrong ones succeeds, since the engine does not ask the registry for a digest it has (by tag
// it does, and is refused). So a pull does not tell whether a tenant may run a cached image:
// CheckAccess (a manifest HEAD with the tenant's credentials) does, by tag and by digest. A
// shared image uses the manager's own credentials. Refusals name the image and what to do,
// never a password.
func TestTenantAccess(t *testing.T) {
	const user, pass = "acme", "s3cret-acme-9"
	srv := testenv.StartRegistry(t, map[string]string{user: pass})
	cli := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	labels := testLabels(t)
	removeOnCleanup(t, cli, labels)
	tag := srv.Addr + "/private/w:1"
	buildTagged(t, New(cli), tag, labels, "access")
	good, err := ParseAuth(authBytes(t, srv.Addr, user, pass), "tenant a's registry credentials")
	if err != nil {
		t.Fatal(err)
	}
	bad, _ := ParseAuth(authBytes(t, srv.Addr, user, "wrong-pw"), "tenant c's registry credentials")
	dgst, err := New(cli, WithAuth(good)).Push(ctx, tag, Progress{})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := ParseRef(tag)
	pinned, _ := p.WithDigest(dgst)
	node := New(cli) // a node without credentials of its own
	a := Access{Tenant: "a", Auth: good}
	if err := node.PullAccess(ctx, pinned, a, Progress{}); err != nil {
		t.Fatalf("tenant a pulls with its credentials: %v", err)
	}
	if ok, _ := node.Has(ctx, pinned); !ok {
		t.Fatal("not on the engine after the pull")
	}
	// The engine finds the image by a prefix of its ID too; Has does not, so no tenant runs
	// it by guessing hex digits.
	info, err := cli.ImageInspect(ctx, pinned)
	if err != nil {
		t.Fatal(err)
	}
	short := strings.TrimPrefix(info.ID, "sha256:")[:12]
	if _, err := cli.ImageInspect(ctx, short); err != nil {
		t.Fatalf("the engine does not find %s by its short ID %s (%v): the case Has guards against is gone", pinned, short, err)
	}
	for _, ref := range []string{short, short[:4]} {
		if ok, err := node.Has(ctx, ref); ok || err != nil {
			t.Errorf("Has(%s) = %v, %v; want false: the image is not named so", ref, ok, err)
		}
	}
	res := &Resolver{}
	if err := res.CheckAccess(ctx, pinned, a); err != nil {
		t.Fatalf("check for tenant a: %v", err)
	}
	if d, err := res.ResolveAccess(ctx, tag, a); err != nil || d != dgst {
		t.Fatalf("resolve for tenant a = %s, %v", d, err)
	}
	for _, acc := range []Access{{Tenant: "b"}, {Tenant: "c", Auth: bad}} {
		for _, ref := range []string{pinned, tag} {
			errs := map[string]error{"check": res.CheckAccess(ctx, ref, acc)}
			if ref == pinned {
				// The engine has the digest: it pulls without asking the registry.
				if err := node.PullAccess(ctx, ref, acc, Progress{}); err != nil {
					t.Errorf("cached by digest, the engine asked the registry after all (%v): the agent's CheckAccess is then only a second check", err)
				}
			} else {
				errs["pull"] = node.PullAccess(ctx, ref, acc, Progress{})
				_, errs["resolve"] = res.ResolveAccess(ctx, ref, acc) // a digest resolves to itself without a request
			}
			for what, err := range errs {
				if !errors.Is(err, ErrNoAccess) || !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), ref) ||
					!strings.Contains(err.Error(), "stormdock tenant registry-auth "+acc.Tenant+" FILE") || strings.Contains(err.Error(), "\n") ||
					strings.Contains(err.Error(), pass) || strings.Contains(err.Error(), "wrong-pw") {
					t.Errorf("%s of %s (cached) for tenant %s: %v; want a one-line refusal naming the image and what to do", what, ref, acc.Tenant, err)
				}
			}
		}
	}
	t.Logf("refusal: %v", res.CheckAccess(ctx, pinned, Access{Tenant: "b"}))
	// Shared: the node's own credentials, whatever the tenant has.
	nodeWithAuth := New(cli, WithAuth(good))
	if err := nodeWithAuth.PullAccess(ctx, pinned, Access{Tenant: "b", Shared: true}, Progress{}); err != nil {
		t.Fatalf("shared pull with the node's credentials: %v", err)
	}
	if err := (&Resolver{Auth: good}).CheckAccess(ctx, tag, Access{Tenant: "b", Shared: true}); err != nil {
		t.Fatalf("shared check with the node's credentials: %v", err)
	}
	// Not shared: the node's credentials are not used for tenant b.
	if err := nodeWithAuth.PullAccess(ctx, tag, Access{Tenant: "b"}, Progress{}); !errors.Is(err, ErrNoAccess) {
		t.Fatalf("unshared pull for tenant b on a node with credentials: %v; want ErrNoAccess", err)
	}
}

// authBytes is a config.json giving user:password for host.
func authBytes(t *testing.T, host, user, password string) []byte {
	t.Helper()
	a, err := LoadAuth(testenv.WriteAuthFile(t, host, user, password))
	if err != nil {
		t.Fatal(err)
	}
	return a.Marshal()
}
