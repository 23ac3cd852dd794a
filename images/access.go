package images

import (
	"errors"
	"fmt"
	"strings"
)

// Access is whose registry credentials fetch one tenant's image. An image under a prefix the
// admin shared is fetched with the node's (or the master's) own credentials; every other
// image with the tenant's alone (anonymously when the tenant has none), so that no tenant
// reaches a private image through credentials someone else gave.
type Access struct {
	// Tenant owns the job the image is for; it is named in errors.
	Tenant string
	// Shared: the image is under a shared prefix, fetched with the node's own credentials.
	Shared bool
	// Auth is the tenant's credentials (nil: none). Unused for a shared image.
	Auth *Auth
}

// auth is the credentials to send: own for a shared image, the tenant's otherwise.
func (a Access) auth(own *Auth) *Auth {
	if a.Shared {
		return own
	}
	return a.Auth
}

// ErrNoAccess: a tenant's image is neither readable with the tenant's own credentials nor
// under a shared prefix. It wraps ErrUnauthorized too.
var ErrNoAccess = errors.New("image not accessible to the tenant")

// explain turns a refusal of a tenant's credentials into one line naming the image and what
// to do; other errors pass unchanged. The registry's own text is left out: it would advise
// flags (--registry-auth) that are the node's, not the tenant's.
func (a Access) explain(ref string, err error) error {
	if err == nil || a.Shared || !errors.Is(err, ErrUnauthorized) {
		return err
	}
	host := ""
	if p, perr := ParseRef(ref); perr == nil {
		host = p.Domain
	}
	t := a.Tenant
	if t == "" {
		t = "T"
	}
	why := fmt.Sprintf("tenant %s has no credentials for registry %s", t, host)
	if _, ok, _ := a.Auth.For(host); ok {
		why = fmt.Sprintf("registry %s refused tenant %s's credentials", host, t)
	}
	return &accessError{msg: fmt.Sprintf("image %s: %s: give the tenant registry credentials with `stormdock tenant registry-auth %s FILE`, or ask the admin to share it (`stormdock image share PREFIX`)",
		ref, why, t)}
}

// accessError is a tenant's refusal: ErrNoAccess and ErrUnauthorized, without their texts.
type accessError struct{ msg string }

func (e *accessError) Error() string { return e.msg }

func (e *accessError) Is(target error) bool {
	return target == ErrNoAccess || target == ErrUnauthorized
}

// Explain is explain for callers outside the package (an engine pull's refusal).
func (a Access) Explain(ref string, err error) error { return a.explain(ref, err) }

// CheckPrefix checks a shared-image prefix (REGISTRY[/PATH[/]]: 127.0.0.1:5055/base/) and
// returns it normalized: lower-case registry, no trailing slash. A prefix matches whole path
// components only: 127.0.0.1:5055/base matches 127.0.0.1:5055/base/w, not .../basement.
func CheckPrefix(s string) (string, error) {
	orig := s
	s = strings.TrimSuffix(strings.TrimSpace(s), "/")
	if s == "" {
		return "", fmt.Errorf("%w: empty prefix: give REGISTRY/PATH/, like 127.0.0.1:5055/base/", ErrBadReference)
	}
	p, err := ParseRef(s)
	if err != nil {
		if !strings.Contains(s, "/") {
			// A registry alone ("127.0.0.1:5055"): check it as a repository of it.
			if q, qerr := ParseRef(s + "/x"); qerr == nil && q.Explicit {
				return q.Domain, nil
			}
		}
		return "", fmt.Errorf("%w: prefix %q: want REGISTRY/PATH/, like 127.0.0.1:5055/base/", ErrBadReference, orig)
	}
	if !p.Explicit {
		if q, qerr := ParseRef(s + "/x"); qerr == nil && q.Explicit && !strings.Contains(s, "/") {
			return q.Domain, nil
		}
		return "", fmt.Errorf("%w: prefix %q names no registry: write it as REGISTRY/PATH/ (docker.io/library/ for Docker Hub's official images)", ErrBadReference, orig)
	}
	if p.Digest != "" || strings.Contains(s[strings.LastIndex(s, "/")+1:], ":") {
		return "", fmt.Errorf("%w: prefix %q carries a tag or digest: give a repository path, like 127.0.0.1:5055/base/", ErrBadReference, orig)
	}
	// The path as written: docker.io/library would otherwise read as docker.io/library/library.
	_, path, _ := strings.Cut(s, "/")
	return p.Domain + "/" + path, nil
}

// SharedUnder reports whether ref's repository is under one of the (normalized) prefixes, on
// path component boundaries. A reference that does not parse, or names no registry, is under
// none.
func SharedUnder(prefixes []string, ref string) bool {
	p, err := ParseRef(ref)
	if err != nil || !p.Explicit {
		return false
	}
	repo := p.Domain + "/" + p.Path
	for _, pre := range prefixes {
		pre = strings.TrimSuffix(pre, "/")
		if pre != "" && (repo == pre || strings.HasPrefix(repo, pre+"/")) {
			return true
		}
	}
	return false
}
