package images

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/registry"
)

// ErrAuthFile: the registry credentials file cannot be used.
var ErrAuthFile = errors.New("registry auth file unusable")

// Credential is what a registry is logged in with. Its String and GoString never show the
// secret, so a credential that reaches a log line or an error by mistake leaks nothing.
type Credential struct {
	Username      string
	Password      string
	IdentityToken string
}

func (c Credential) String() string   { return "credential for " + c.Username + " (secret not shown)" }
func (c Credential) GoString() string { return c.String() }

// Auth holds registry credentials read from a file in Docker's config.json format:
//
//	{"auths": {"127.0.0.1:5055": {"auth": "base64(user:password)"}}}
//
// Entries may instead give "username" and "password", or an "identitytoken". Keys may carry a
// scheme and a path (https://index.docker.io/v1/ is docker.io). Credential helpers
// ("credsStore", "credHelpers") are not run. The file is read again when it changes, so
// credentials can be rotated without a restart.
type Auth struct {
	path string
	// static is set for credentials given as bytes (ParseAuth): there is no file to reread.
	static bool

	mu      sync.Mutex
	mod     time.Time
	size    int64
	entries map[string]Credential
}

// LoadAuth reads and checks a credentials file. Errors name the file and the entry, never
// a secret.
func LoadAuth(path string) (*Auth, error) {
	a := &Auth{path: path}
	if err := a.reload(); err != nil {
		return nil, err
	}
	return a, nil
}

// ParseAuth checks credentials given as bytes in Docker's config.json format (a tenant's,
// as the store keeps them). source names them in errors ("tenant acme's registry
// credentials"); errors never show a secret.
func ParseAuth(b []byte, source string) (*Auth, error) {
	entries, err := parseAuth(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrAuthFile, err)
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf(`%w: no registry in "auths": give at least one {"auths": {"HOST:PORT": {"auth": "base64 of user:password"}}}`, ErrAuthFile)
	}
	return &Auth{path: source, static: true, entries: entries}, nil
}

// Path is the file the credentials come from (or what ParseAuth was told they are).
func (a *Auth) Path() string {
	if a == nil {
		return ""
	}
	return a.path
}

// Hosts lists the registry hosts the credentials are for, sorted.
func (a *Auth) Hosts() []string {
	if a == nil {
		return nil
	}
	if err := a.reload(); err != nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Sorted(maps.Keys(a.entries))
}

// Marshal writes the credentials back in Docker's config.json format, with only what
// stormdock reads (auths, by normalized host): what the store keeps of a tenant's file.
func (a *Auth) Marshal() []byte {
	type entry struct {
		Auth          string `json:"auth,omitempty"`
		IdentityToken string `json:"identitytoken,omitempty"`
	}
	out := struct {
		Auths map[string]entry `json:"auths"`
	}{Auths: map[string]entry{}}
	if a != nil && a.reload() == nil {
		a.mu.Lock()
		for host, c := range a.entries {
			var e entry
			if c.Username != "" {
				e.Auth = base64.StdEncoding.EncodeToString([]byte(c.Username + ":" + c.Password))
			}
			e.IdentityToken = c.IdentityToken
			out.Auths[host] = e
		}
		a.mu.Unlock()
	}
	b, _ := json.Marshal(out)
	return b
}

// For returns the credential for a registry host ("127.0.0.1:5055", "docker.io").
func (a *Auth) For(domain string) (Credential, bool, error) {
	if a == nil {
		return Credential{}, false, nil
	}
	if err := a.reload(); err != nil {
		return Credential{}, false, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.entries[normalHost(domain)]
	return c, ok, nil
}

// reload reads the file when it changed since the last read.
func (a *Auth) reload() error {
	if a.static {
		return nil
	}
	fi, err := os.Stat(a.path)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrAuthFile, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.entries != nil && fi.ModTime().Equal(a.mod) && fi.Size() == a.size {
		return nil
	}
	b, err := os.ReadFile(a.path)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrAuthFile, err)
	}
	entries, err := parseAuth(b)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrAuthFile, a.path, err)
	}
	a.entries, a.mod, a.size = entries, fi.ModTime(), fi.Size()
	return nil
}

// parseAuth decodes config.json. Its errors describe the shape, never the values.
func parseAuth(b []byte) (map[string]Credential, error) {
	var f struct {
		Auths map[string]struct {
			Auth          string `json:"auth"`
			Username      string `json:"username"`
			Password      string `json:"password"`
			IdentityToken string `json:"identitytoken"`
		} `json:"auths"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("not JSON (syntax error at byte %d): write it in Docker's config.json format", se.Offset)
		}
		return nil, errors.New(`not in Docker's config.json format: want {"auths": {"HOST:PORT": {"auth": "base64 of user:password"}}}`)
	}
	out := map[string]Credential{}
	for key, e := range f.Auths {
		host := normalHost(key)
		c := Credential{Username: e.Username, Password: e.Password, IdentityToken: e.IdentityToken}
		if e.Auth != "" {
			raw, err := base64.StdEncoding.DecodeString(e.Auth)
			if err != nil {
				return nil, fmt.Errorf("auths[%q].auth is not base64", key)
			}
			user, pass, ok := strings.Cut(string(raw), ":")
			if !ok {
				return nil, fmt.Errorf("auths[%q].auth is not base64 of user:password", key)
			}
			c.Username, c.Password = user, pass
		}
		if c.Username == "" && c.IdentityToken == "" {
			return nil, fmt.Errorf("auths[%q] has no credential: give auth, username and password, or identitytoken", key)
		}
		out[host] = c
	}
	return out, nil
}

// normalHost reduces a config.json key or a reference's domain to host[:port].
func normalHost(s string) string {
	s = strings.TrimPrefix(strings.TrimPrefix(s, "https://"), "http://")
	s, _, _ = strings.Cut(s, "/")
	switch s {
	case "index.docker.io", "registry-1.docker.io":
		return "docker.io"
	}
	return s
}

// engineAuth is the X-Registry-Auth value for a pull or push from domain: the credential
// when the file has one, anonymous otherwise.
func engineAuth(a *Auth, domain string) (string, error) {
	c, _, err := a.For(domain)
	if err != nil {
		return "", err
	}
	return registry.EncodeAuthConfig(registry.AuthConfig{Username: c.Username, Password: c.Password,
		IdentityToken: c.IdentityToken, ServerAddress: domain})
}
