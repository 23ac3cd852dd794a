package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/opencontainers/go-digest"
)

// Errors of registry operations, which callers branch on. The messages name the registry.
var (
	// ErrUnreachable: the registry did not answer (refused, no route, no such host, timeout).
	ErrUnreachable = errors.New("registry unreachable")
	// ErrUnauthorized: the registry wants credentials that were not given or not accepted.
	ErrUnauthorized = errors.New("registry refused the credentials")
	// ErrUnknown: the registry answered that the repository or tag does not exist.
	ErrUnknown = errors.New("image unknown to the registry")
	// ErrNoRegistry: the reference names no registry (stormdock/worker:1), so there is
	// nothing to resolve it against.
	ErrNoRegistry = errors.New("image names no registry")
)

// manifestTypes are the manifests a registry may serve for a tag, top level first: asking for
// every one keeps the registry from converting (a distribution registry answers a bare
// request with a schema 1 manifest, whose digest no engine pulls by).
var manifestTypes = []string{
	"application/vnd.oci.image.index.v1+json",
	"application/vnd.docker.distribution.manifest.list.v2+json",
	"application/vnd.oci.image.manifest.v1+json",
	"application/vnd.docker.distribution.manifest.v2+json",
}

// Resolver turns image tags into digests through the registry's HTTP API (v2), with the
// credentials of an Auth file. Loopback registries are spoken to over plain HTTP, as dockerd
// does by default; every other registry over HTTPS.
type Resolver struct {
	// Auth gives credentials per registry; nil means anonymous.
	Auth *Auth
	// Client is the HTTP client; nil means one with a 10s timeout.
	Client *http.Client
}

// Resolve returns the digest (sha256:...) the registry serves for ref's tag now. A reference
// that carries a digest already resolves to it without a request.
func (r *Resolver) Resolve(ctx context.Context, ref string) (string, error) {
	return r.resolve(ctx, ref, r.Auth)
}

// ResolveAccess resolves ref as Resolve does, with the credentials acc says: the resolver's
// own (Auth) for a shared image, the tenant's otherwise.
// A reference by digest is checked too (CheckAccess): a digest another tenant's job made
// known is no way into its image.
func (r *Resolver) ResolveAccess(ctx context.Context, ref string, acc Access) (string, error) {
	if p, err := ParseRef(ref); err == nil && p.Digest != "" && p.Explicit {
		if err := r.CheckAccess(ctx, ref, acc); err != nil {
			return "", err
		}
		return p.Digest, nil
	}
	d, err := r.resolve(ctx, ref, acc.auth(r.Auth))
	return d, acc.explain(ref, err)
}

// CheckAccess asks the registry whether acc's credentials may read ref's manifest (a HEAD,
// by tag or by digest, so a digest is checked too): how an agent tells that a tenant may
// run an image the node already has, which another tenant's pull left there.
func (r *Resolver) CheckAccess(ctx context.Context, ref string, acc Access) error {
	p, err := ParseRef(ref)
	if err != nil {
		return err
	}
	if !p.Explicit {
		return nil
	}
	what := p.Tag
	if p.Digest != "" {
		what = p.Digest
	}
	scheme := "https"
	if Loopback(p.Domain) {
		scheme = "http"
	}
	u := fmt.Sprintf("%s://%s/v2/%s/manifests/%s", scheme, p.Domain, p.Path, url.PathEscape(what))
	resp, err := r.do(ctx, http.MethodHead, u, p, acc.auth(r.Auth))
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			err = statusErr(p, ref, resp.StatusCode, nil)
		}
	}
	return acc.explain(ref, err)
}

func (r *Resolver) resolve(ctx context.Context, ref string, auth *Auth) (string, error) {
	p, err := ParseRef(ref)
	if err != nil {
		return "", err
	}
	if p.Digest != "" {
		return p.Digest, nil
	}
	if !p.Explicit {
		return "", fmt.Errorf("%w: %s: name the registry (HOST:PORT/%s) to have it pinned", ErrNoRegistry, ref, p.Path)
	}
	scheme := "https"
	if Loopback(p.Domain) {
		scheme = "http"
	}
	u := fmt.Sprintf("%s://%s/v2/%s/manifests/%s", scheme, p.Domain, p.Path, url.PathEscape(p.Tag))
	resp, err := r.do(ctx, http.MethodHead, u, p, auth)
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		if d, err := digest.Parse(resp.Header.Get("Docker-Content-Digest")); err == nil {
			return d.String(), nil
		}
	}
	// No digest header, or an error, whose explanation is only in a body: ask again with GET.
	resp, err = r.do(ctx, http.MethodGet, u, p, auth)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return "", fmt.Errorf("%w: registry %s: read manifest of %s: %v", ErrUnreachable, p.Domain, ref, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", statusErr(p, ref, resp.StatusCode, body)
	}
	if d, err := digest.Parse(resp.Header.Get("Docker-Content-Digest")); err == nil {
		return d.String(), nil
	}
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// do sends one request, answering a Basic or Bearer challenge with the credential for the
// registry in auth.
func (r *Resolver) do(ctx context.Context, method, u string, p Ref, auth *Auth) (*http.Response, error) {
	cl := r.Client
	if cl == nil {
		cl = &http.Client{Timeout: 10 * time.Second}
	}
	send := func(authz string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, method, u, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Accept", strings.Join(manifestTypes, ", "))
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		resp, err := cl.Do(req)
		if err != nil {
			return nil, netErr(p.Domain, err)
		}
		return resp, nil
	}
	resp, err := send("")
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		return resp, err
	}
	challenge := resp.Header.Get("WWW-Authenticate")
	resp.Body.Close()
	cred, ok, err := auth.For(p.Domain)
	if err != nil {
		return nil, err
	}
	scheme, params := parseChallenge(challenge)
	var authz string
	switch {
	case scheme == "basic" && !ok:
		return nil, fmt.Errorf("%w: registry %s wants credentials: give --registry-auth FILE with an entry for %s (Docker's config.json format)", ErrUnauthorized, p.Domain, p.Domain)
	case scheme == "basic":
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		req.SetBasicAuth(cred.Username, cred.Password)
		authz = req.Header.Get("Authorization")
	case scheme == "bearer":
		tok, err := r.token(ctx, cl, p, params, cred, ok)
		if err != nil {
			return nil, err
		}
		authz = "Bearer " + tok
	default:
		return nil, fmt.Errorf("%w: registry %s answers 401 with a challenge stormdock does not speak (%q)", ErrUnauthorized, p.Domain, scheme)
	}
	resp, err = send(authz)
	if err == nil && resp.StatusCode == http.StatusUnauthorized {
		resp.Body.Close()
		return nil, fmt.Errorf("%w: registry %s did not accept the credential for %s from %s", ErrUnauthorized, p.Domain, cred.Username, auth.Path())
	}
	return resp, err
}

// token fetches a bearer token from the challenge's realm, as the distribution token
// protocol says: GET realm?service=...&scope=..., with basic credentials when there are any.
func (r *Resolver) token(ctx context.Context, cl *http.Client, p Ref, params map[string]string, cred Credential, haveCred bool) (string, error) {
	realm := params["realm"]
	if realm == "" {
		return "", fmt.Errorf("%w: registry %s sent a bearer challenge without a realm", ErrUnauthorized, p.Domain)
	}
	q := url.Values{}
	if s := params["service"]; s != "" {
		q.Set("service", s)
	}
	scope := params["scope"]
	if scope == "" {
		scope = "repository:" + p.Path + ":pull"
	}
	q.Set("scope", scope)
	ru, err := url.Parse(realm)
	if err != nil {
		return "", fmt.Errorf("%w: registry %s: bad token realm %q", ErrUnauthorized, p.Domain, realm)
	}
	ru.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ru.String(), nil)
	if err != nil {
		return "", err
	}
	if haveCred && cred.Username != "" {
		req.SetBasicAuth(cred.Username, cred.Password)
	}
	resp, err := cl.Do(req)
	if err != nil {
		return "", netErr(ru.Host, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		if !haveCred {
			return "", fmt.Errorf("%w: registry %s: its token service answers %d: give --registry-auth FILE with an entry for %s", ErrUnauthorized, p.Domain, resp.StatusCode, p.Domain)
		}
		return "", fmt.Errorf("%w: registry %s: its token service answers %d to %s", ErrUnauthorized, p.Domain, resp.StatusCode, cred.Username)
	}
	var t struct {
		Token       string `json:"token"`
		AccessToken string `json:"access_token"`
	}
	if err := json.Unmarshal(body, &t); err != nil || t.Token+t.AccessToken == "" {
		return "", fmt.Errorf("%w: registry %s: its token service answered no token", ErrUnauthorized, p.Domain)
	}
	if t.Token != "" {
		return t.Token, nil
	}
	return t.AccessToken, nil
}

// parseChallenge splits a WWW-Authenticate value: Bearer realm="...",service="...".
func parseChallenge(h string) (string, map[string]string) {
	scheme, rest, _ := strings.Cut(strings.TrimSpace(h), " ")
	params := map[string]string{}
	for rest != "" {
		rest = strings.TrimLeft(rest, " ,")
		k, v, ok := strings.Cut(rest, "=")
		if !ok {
			break
		}
		k = strings.ToLower(strings.TrimSpace(k))
		if strings.HasPrefix(v, `"`) {
			end := strings.IndexByte(v[1:], '"')
			if end < 0 {
				params[k] = v[1:]
				break
			}
			params[k], rest = v[1:1+end], v[2+end:]
		} else {
			val, r, _ := strings.Cut(v, ",")
			params[k], rest = strings.TrimSpace(val), r
		}
	}
	return strings.ToLower(scheme), params
}

// statusErr explains a registry's error answer, with the codes of its error body.
func statusErr(p Ref, ref string, status int, body []byte) error {
	var e struct {
		Errors []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"errors"`
	}
	msg := http.StatusText(status)
	if json.Unmarshal(body, &e) == nil && len(e.Errors) > 0 {
		var parts []string
		for _, x := range e.Errors {
			parts = append(parts, strings.ToLower(strings.ReplaceAll(x.Code, "_", " "))+": "+x.Message)
		}
		msg = strings.Join(parts, "; ")
	}
	switch status {
	case http.StatusNotFound:
		return fmt.Errorf("%w: registry %s answers %s for %s: push it first (stormdock image push) or fix the tag", ErrUnknown, p.Domain, msg, ref)
	case http.StatusUnauthorized, http.StatusForbidden:
		return fmt.Errorf("%w: registry %s answers %s for %s", ErrUnauthorized, p.Domain, msg, ref)
	}
	return fmt.Errorf("registry %s answers %d (%s) for %s", p.Domain, status, msg, ref)
}

// netErr reports a request that got no answer, naming the registry.
func netErr(domain string, err error) error {
	var reason string
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		reason = "refused the connection: is it running?"
	case errors.As(err, &dnsErr):
		reason = "has no address: " + dnsErr.Err
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		reason = "did not answer in time"
	case errors.Is(err, context.Canceled):
		return err
	default:
		reason = "unreachable: " + err.Error()
	}
	return fmt.Errorf("%w: registry %s %s", ErrUnreachable, domain, reason)
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
