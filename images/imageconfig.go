package images

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"runtime"

	"github.com/opencontainers/go-digest"
)

// ImageCommand is an image's own command, from its configuration: what a container of it runs
// when nothing else is named.
type ImageCommand struct {
	Entrypoint []string
	Cmd        []string
}

// Empty reports an image that names no program to run at all.
func (c ImageCommand) Empty() bool { return len(c.Entrypoint) == 0 && len(c.Cmd) == 0 }

// ErrNoPlatform: an image index holds no image for the platform asked for.
var ErrNoPlatform = errors.New("image has no manifest for this platform")

// maxConfigBytes bounds a manifest or image configuration read from a registry.
const maxConfigBytes = 4 << 20

// CommandOf reads the entrypoint and cmd of ref (by tag or digest) from its registry, with
// the credentials acc says: its manifest (for an index, the linux image of the master's
// architecture), then its configuration blob, each checked against its digest.
func (r *Resolver) CommandOf(ctx context.Context, ref string, acc Access) (ImageCommand, error) {
	p, err := ParseRef(ref)
	if err != nil {
		return ImageCommand{}, err
	}
	if !p.Explicit {
		return ImageCommand{}, fmt.Errorf("%w: %s", ErrNoRegistry, ref)
	}
	auth := acc.auth(r.Auth)
	what := p.Tag
	if p.Digest != "" {
		what = p.Digest
	}
	var m struct {
		MediaType string `json:"mediaType"`
		Config    struct {
			Digest string `json:"digest"`
		} `json:"config"`
		Manifests []struct {
			Digest   string `json:"digest"`
			Platform struct {
				OS           string `json:"os"`
				Architecture string `json:"architecture"`
			} `json:"platform"`
		} `json:"manifests"`
	}
	for range 2 { // an index, then the manifest it names
		body, err := r.fetch(ctx, p, "manifests", what, auth)
		if err != nil {
			return ImageCommand{}, acc.explain(ref, err)
		}
		m.Manifests = nil
		if err := json.Unmarshal(body, &m); err != nil {
			return ImageCommand{}, fmt.Errorf("registry %s: manifest of %s: %w", p.Domain, ref, err)
		}
		if len(m.Manifests) == 0 {
			break
		}
		what = ""
		for _, d := range m.Manifests {
			if d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH {
				what = d.Digest
				break
			}
		}
		if what == "" {
			return ImageCommand{}, fmt.Errorf("%w: %s has no linux/%s image", ErrNoPlatform, ref, runtime.GOARCH)
		}
	}
	if m.Config.Digest == "" {
		return ImageCommand{}, fmt.Errorf("registry %s: manifest of %s names no configuration (media type %q)", p.Domain, ref, m.MediaType)
	}
	body, err := r.fetch(ctx, p, "blobs", m.Config.Digest, auth)
	if err != nil {
		return ImageCommand{}, acc.explain(ref, err)
	}
	var cfg struct {
		Config ImageCommand `json:"config"`
	}
	if err := json.Unmarshal(body, &cfg); err != nil {
		return ImageCommand{}, fmt.Errorf("registry %s: configuration of %s: %w", p.Domain, ref, err)
	}
	return cfg.Config, nil
}

// fetch GETs /v2/PATH/KIND/WHAT (a manifest or a blob) and, when WHAT is a digest, checks
// the body against it.
func (r *Resolver) fetch(ctx context.Context, p Ref, kind, what string, auth *Auth) ([]byte, error) {
	scheme := "https"
	if Loopback(p.Domain) {
		scheme = "http"
	}
	u := fmt.Sprintf("%s://%s/v2/%s/%s/%s", scheme, p.Domain, p.Path, kind, url.PathEscape(what))
	resp, err := r.do(ctx, http.MethodGet, u, p, auth)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: registry %s: read %s %s: %v", ErrUnreachable, p.Domain, kind, what, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, statusErr(p, p.Domain+"/"+p.Path+" "+what, resp.StatusCode, body)
	}
	if len(body) > maxConfigBytes {
		return nil, fmt.Errorf("registry %s: %s %s is larger than %d bytes", p.Domain, kind, what, maxConfigBytes)
	}
	if d, err := digest.Parse(what); err == nil {
		if d.Algorithm().FromBytes(body) != d {
			return nil, fmt.Errorf("registry %s: %s %s: the bytes served do not match their digest", p.Domain, kind, what)
		}
	}
	return body, nil
}
