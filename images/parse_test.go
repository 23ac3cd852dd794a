package images

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseRef(t *testing.T) {
	for _, tc := range []struct {
		in                       string
		domain, path, tag, name  string
		explicit, loopback, fail bool
	}{
		{in: "127.0.0.1:5055/bars/w:1", domain: "127.0.0.1:5055", path: "bars/w", tag: "1", name: "127.0.0.1:5055/bars/w", explicit: true, loopback: true},
		{in: "localhost:5000/w", domain: "localhost:5000", path: "w", tag: "latest", name: "localhost:5000/w", explicit: true, loopback: true},
		{in: "registry.example.com/team/w:2", domain: "registry.example.com", path: "team/w", tag: "2", name: "registry.example.com/team/w", explicit: true},
		{in: "stormdock/worker:latest", domain: "docker.io", path: "stormdock/worker", tag: "latest", name: "stormdock/worker"},
		{in: "busybox", domain: "docker.io", path: "library/busybox", tag: "latest", name: "busybox"},
		{in: "127.0.0.1:5055/Bars/w:1", fail: true},
		{in: "", fail: true},
	} {
		r, err := ParseRef(tc.in)
		if tc.fail {
			if !errors.Is(err, ErrBadReference) {
				t.Errorf("ParseRef(%q) = %+v, %v; want ErrBadReference", tc.in, r, err)
			}
			continue
		}
		if err != nil || r.Domain != tc.domain || r.Path != tc.path || r.Tag != tc.tag || r.Explicit != tc.explicit ||
			r.Name() != tc.name || Loopback(r.Domain) != tc.loopback {
			t.Errorf("ParseRef(%q) = %+v name %q loopback %v, %v", tc.in, r, r.Name(), Loopback(r.Domain), err)
		}
	}
	r, _ := ParseRef("127.0.0.1:5055/bars/w:1")
	const d = "sha256:404e95e57818e7240f752efa728f36d4ae02addf4829f4859cc736d62be1bed7"
	if got, err := r.WithDigest(d); err != nil || got != "127.0.0.1:5055/bars/w@"+d {
		t.Errorf("WithDigest = %q, %v", got, err)
	}
	if _, err := r.WithDigest("sha256:abc"); !errors.Is(err, ErrBadReference) {
		t.Errorf("WithDigest of a short digest: %v", err)
	}
	if p, _ := ParseRef("127.0.0.1:5055/bars/w@" + d); p.Digest != d || p.Tag != "" {
		t.Errorf("a digest reference parsed as %+v", p)
	}
}

func TestParseChallenge(t *testing.T) {
	s, p := parseChallenge(`Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:bars/w:pull"`)
	if s != "bearer" || p["realm"] != "https://auth.example.com/token" || p["service"] != "registry.example.com" || p["scope"] != "repository:bars/w:pull" {
		t.Errorf("bearer challenge: %q %v", s, p)
	}
	if s, p := parseChallenge(`Basic realm="stormdock-test"`); s != "basic" || p["realm"] != "stormdock-test" {
		t.Errorf("basic challenge: %q %v", s, p)
	}
	if s, _ := parseChallenge(""); s != "" {
		t.Errorf("empty challenge: %q", s)
	}
}

func TestParseAuth(t *testing.T) {
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, tc := range []struct {
		name, file, host, user, pass, err string
	}{
		{name: "auth", file: `{"auths":{"127.0.0.1:5055":{"auth":"` + b64("bars:pw:with:colons") + `"}}}`, host: "127.0.0.1:5055", user: "bars", pass: "pw:with:colons"},
		{name: "fields", file: `{"auths":{"https://index.docker.io/v1/":{"username":"u","password":"p"}},"credsStore":"desktop"}`, host: "docker.io", user: "u", pass: "p"},
		{name: "scheme", file: `{"auths":{"http://127.0.0.1:5055/v2/":{"auth":"` + b64("a:b") + `"}}}`, host: "127.0.0.1:5055", user: "a", pass: "b"},
		{name: "syntax", file: `{"auths":`, err: "not JSON (syntax error at byte"},
		{name: "shape", file: `{"auths":[1]}`, err: "Docker's config.json format"},
		{name: "base64", file: `{"auths":{"h":{"auth":"!!secret!!"}}}`, err: `auths["h"].auth is not base64`},
		{name: "no colon", file: `{"auths":{"h":{"auth":"` + b64("secretonly") + `"}}}`, err: "not base64 of user:password"},
		{name: "empty", file: `{"auths":{"h":{}}}`, err: "has no credential"},
	} {
		p := filepath.Join(t.TempDir(), "config.json")
		if err := os.WriteFile(p, []byte(tc.file), 0o600); err != nil {
			t.Fatal(err)
		}
		a, err := LoadAuth(p)
		if tc.err != "" {
			if !errors.Is(err, ErrAuthFile) || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "secret") {
				t.Errorf("%s: %v; want ErrAuthFile with %q and no secret", tc.name, err, tc.err)
			}
			continue
		}
		c, ok, err := a.For(tc.host)
		if err != nil || !ok || c.Username != tc.user || c.Password != tc.pass {
			t.Errorf("%s: For(%s) = %v %v %v", tc.name, tc.host, c, ok, err)
		}
		if strings.Contains(c.String(), tc.pass) || strings.Contains(strings.ReplaceAll(strings.ReplaceAll(c.GoString(), "(", ""), ")", ""), tc.pass) {
			t.Errorf("%s: a credential prints its password: %s", tc.name, c)
		}
	}
	// A rewritten file is read again.
	p := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(p, []byte(`{"auths":{"h:1":{"auth":"`+b64("a:1")+`"}}}`), 0o600)
	a, err := LoadAuth(p)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(p, []byte(`{"auths":{"h:1":{"auth":"`+b64("a:second")+`"}}}`), 0o600)
	if c, _, _ := a.For("h:1"); c.Password != "second" {
		t.Errorf("after a rewrite: %q", c.Password)
	}
}

func FuzzParseAuth(f *testing.F) {
	f.Add([]byte(`{"auths":{"127.0.0.1:5055":{"auth":"YmFyczpwdw=="}}}`))
	f.Add([]byte(`{"auths":{"h":{"username":"u","password":"p"}}}`))
	f.Add([]byte(`{"auths":{"h":{"auth":"!!"}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, err := parseAuth(b)
		if err != nil {
			return
		}
		for host, c := range entries {
			if c.Username == "" && c.IdentityToken == "" {
				t.Errorf("entry %q accepted without a credential", host)
			}
			if strings.Contains(host, "://") || strings.Contains(host, "/") {
				t.Errorf("host %q not normalized", host)
			}
		}
	})
}

// TestResolveBearer runs the token flow against a fake registry and token service (no
// registry with token auth can be installed here): the challenge's realm is asked for a
// token with the file's credential, and the manifest request carries it.
func TestResolveBearer(t *testing.T) {
	const dgst = "sha256:404e95e57818e7240f752efa728f36d4ae02addf4829f4859cc736d62be1bed7"
	tokens := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || u != "bars" || p != "pw" || r.URL.Query().Get("scope") != "repository:bars/w:pull" || r.URL.Query().Get("service") != "fake" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Write([]byte(`{"token":"tok-1"}`))
	}))
	defer tokens.Close()
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok-1" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="`+tokens.URL+`/token",service="fake",scope="repository:bars/w:pull"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if !strings.Contains(r.Header.Get("Accept"), "application/vnd.docker.distribution.manifest.v2+json") {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if r.URL.Path != "/v2/bars/w/manifests/1" {
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}`))
			return
		}
		w.Header().Set("Docker-Content-Digest", dgst)
	}))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	p := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(p, []byte(`{"auths":{"`+host+`":{"auth":"`+base64.StdEncoding.EncodeToString([]byte("bars:pw"))+`"}}}`), 0o600)
	a, err := LoadAuth(p)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if got, err := (&Resolver{Auth: a}).Resolve(ctx, host+"/bars/w:1"); err != nil || got != dgst {
		t.Fatalf("resolve through a bearer token = %q, %v", got, err)
	}
	if _, err := (&Resolver{}).Resolve(ctx, host+"/bars/w:1"); !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "--registry-auth") {
		t.Errorf("anonymous: %v; want ErrUnauthorized asking for --registry-auth", err)
	}
	if _, err := (&Resolver{}).Resolve(ctx, "stormdock/worker:1"); !errors.Is(err, ErrNoRegistry) {
		t.Errorf("a reference without registry: %v; want ErrNoRegistry", err)
	}
}
