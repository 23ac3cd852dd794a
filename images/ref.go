package images

import (
	"errors"
	"fmt"
	"strings"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
)

// ErrBadReference: an image reference does not parse.
var ErrBadReference = errors.New("invalid image reference")

// Ref is a parsed image reference.
type Ref struct {
	// Domain is the registry host[:port] ("docker.io" when the reference names none).
	Domain string
	// Path is the repository within the registry (bars/w; library/x for docker.io short names).
	Path string
	// Tag is the tag, "latest" when neither tag nor digest is given.
	Tag string
	// Digest is set for a reference by digest (name@sha256:...).
	Digest string
	// Explicit reports that the reference names its registry (its first component has a '.'
	// or a ':', or is localhost), as 127.0.0.1:5055/bars/w:1 does and stormdock/worker does
	// not.
	Explicit bool

	named reference.Named
}

// ParseRef parses an image reference as docker does.
func ParseRef(s string) (Ref, error) {
	named, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return Ref{}, fmt.Errorf("%w %q: %v", ErrBadReference, s, err)
	}
	r := Ref{Domain: reference.Domain(named), Path: reference.Path(named), named: named}
	if first, _, ok := strings.Cut(s, "/"); ok {
		r.Explicit = strings.ContainsAny(first, ".:") || first == "localhost"
	}
	if d, ok := named.(reference.Digested); ok {
		r.Digest = d.Digest().String()
	}
	if t, ok := named.(reference.Tagged); ok {
		r.Tag = t.Tag()
	} else if r.Digest == "" {
		r.Tag = "latest"
	}
	return r, nil
}

// Name is the repository with its registry as written (127.0.0.1:5055/bars/w), without tag
// or digest.
func (r Ref) Name() string { return reference.FamiliarName(r.named) }

// String is the reference in docker's familiar form.
func (r Ref) String() string { return reference.FamiliarString(r.named) }

// WithDigest is the repository pinned to dgst: name@sha256:....
func (r Ref) WithDigest(dgst string) (string, error) {
	d, err := digest.Parse(dgst)
	if err != nil {
		return "", fmt.Errorf("%w: digest %q: %v", ErrBadReference, dgst, err)
	}
	c, err := reference.WithDigest(reference.TrimNamed(r.named), d)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadReference, err)
	}
	return reference.FamiliarString(c), nil
}

// Loopback reports whether a registry host is on this machine's loopback, where dockerd
// talks plain HTTP without any setting (127.0.0.0/8 is an insecure registry by default).
func Loopback(domain string) bool {
	host := domain
	if h, _, ok := strings.Cut(strings.TrimPrefix(domain, "["), "]"); ok && strings.HasPrefix(domain, "[") {
		host = h
	} else if i := strings.LastIndexByte(domain, ':'); i >= 0 {
		host = domain[:i]
	}
	return host == "localhost" || host == "::1" || strings.HasPrefix(host, "127.")
}
