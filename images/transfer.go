package images

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/pkg/jsonmessage"
)

// Progress says where the engine's progress of a push or pull goes. A nil Out shows none.
type Progress struct {
	Out io.Writer
	// Terminal draws docker's progress bars (Out is a terminal whose descriptor is FD);
	// otherwise one line per step is written and the byte counts are left out.
	Terminal bool
	FD       uintptr
}

// Push pushes ref (REGISTRY/NAME:TAG) through the engine with the credential for its
// registry and returns the digest the registry stored it under. Errors are one line that
// names the registry and wrap ErrUnreachable, ErrUnauthorized or ErrUnknown where they fit.
func (m *Manager) Push(ctx context.Context, ref string, pr Progress) (string, error) {
	p, err := ParseRef(ref)
	if err != nil {
		return "", err
	}
	if p.Digest != "" {
		return "", fmt.Errorf("%w: %s: push a tag, not a digest", ErrBadReference, ref)
	}
	auth, err := engineAuth(m.auth, p.Domain)
	if err != nil {
		return "", err
	}
	rc, err := m.api.ImagePush(ctx, ref, image.PushOptions{RegistryAuth: auth})
	if err != nil {
		if errdefs.IsNotFound(err) {
			return "", fmt.Errorf("push %s: no such image on this engine: build it with `stormdock image build --tag %s`", ref, ref)
		}
		return "", engineErr("push", p, ref, err)
	}
	var dgst string
	err = readStream(rc, pr, func(jm jsonmessage.JSONMessage) {
		var aux struct {
			Digest string `json:"Digest"`
		}
		if jm.Aux != nil && json.Unmarshal(*jm.Aux, &aux) == nil && aux.Digest != "" {
			dgst = aux.Digest
		}
	})
	if err != nil {
		return "", engineErr("push", p, ref, err)
	}
	if dgst == "" {
		return "", fmt.Errorf("push %s: the engine reported no digest", ref)
	}
	m.log.Info("image pushed", "ref", ref, "digest", dgst)
	return dgst, nil
}

// Pull pulls ref through the engine with the credential for its registry. Errors are as
// Push's.
func (m *Manager) Pull(ctx context.Context, ref string, pr Progress) error {
	return m.pull(ctx, ref, m.auth, pr)
}

// PullAccess pulls ref with the credentials acc says: the manager's own for a shared image,
// the tenant's (or none) otherwise. A refusal names the image and what the tenant can do.
// A pull is no check of the tenant's access to an image the engine has: by digest, the
// engine does not ask the registry at all (TestTenantAccess); Resolver.CheckAccess is.
func (m *Manager) PullAccess(ctx context.Context, ref string, acc Access, pr Progress) error {
	return acc.explain(ref, m.pull(ctx, ref, acc.auth(m.auth), pr))
}

func (m *Manager) pull(ctx context.Context, ref string, a *Auth, pr Progress) error {
	p, err := ParseRef(ref)
	if err != nil {
		return err
	}
	auth, err := engineAuth(a, p.Domain)
	if err != nil {
		return err
	}
	rc, err := m.api.ImagePull(ctx, ref, image.PullOptions{RegistryAuth: auth})
	if err == nil {
		err = readStream(rc, pr, nil)
	}
	if err != nil {
		return engineErr("pull", p, ref, err)
	}
	m.log.Info("image pulled", "ref", ref)
	return nil
}

// Has reports whether ref is on the engine under that name: a tag it carries, or a digest
// it was pulled or pushed by. The engine also finds an image by a prefix of its ID (a short
// name like "cb48" reads as one); that is not the image the name stands for, and it would
// let a tenant run an image that another tenant's pull left on the node by guessing a few
// hex digits, so it is reported missing (a pull of the name then fails, or fetches what the
// name really is).
func (m *Manager) Has(ctx context.Context, ref string) (bool, error) {
	info, err := m.api.ImageInspect(ctx, ref)
	switch {
	case err == nil:
		return namedAs(ref, info.RepoTags, info.RepoDigests), nil
	case errdefs.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("inspect image %s: %w", ref, err)
}

// namedAs reports whether ref is one of an image's tags or digests.
func namedAs(ref string, tags, digests []string) bool {
	want, err := ParseRef(ref)
	if err != nil {
		return false
	}
	names := tags
	if want.Digest != "" {
		names = digests
	}
	for _, n := range names {
		got, err := ParseRef(n)
		if err == nil && got.Domain == want.Domain && got.Path == want.Path && got.Tag == want.Tag && got.Digest == want.Digest {
			return true
		}
	}
	return false
}

// readStream reads a push or pull stream to its end, always draining and closing it, shows
// progress and returns the stream's error.
func readStream(rc io.ReadCloser, pr Progress, aux func(jsonmessage.JSONMessage)) error {
	defer rc.Close()
	defer io.Copy(io.Discard, rc) //nolint:errcheck // draining only
	out := pr.Out
	if out == nil {
		out = io.Discard
	}
	return jsonmessage.DisplayJSONMessagesStream(rc, out, pr.FD, pr.Terminal && pr.Out != nil, aux)
}

// engineErr turns the engine's account of a failed push or pull into one line that names the
// registry and says what to do.
func engineErr(op string, p Ref, ref string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s %s: %w", op, ref, err)
	}
	msg := strings.Join(strings.Fields(strings.TrimPrefix(err.Error(), "Error response from daemon: ")), " ")
	low := strings.ToLower(msg)
	reg := "registry " + p.Domain
	switch {
	case strings.Contains(low, "does not exist locally"):
		return fmt.Errorf("%s %s: no such image on this engine: build it with `stormdock image build --tag %s`", op, ref, ref)
	case strings.Contains(low, "connection refused"):
		return fmt.Errorf("%w: %s %s: %s refused the connection: is it running? (%s)", ErrUnreachable, op, ref, reg, msg)
	case strings.Contains(low, "no such host"), strings.Contains(low, "no route to host"),
		strings.Contains(low, "i/o timeout"), strings.Contains(low, "network is unreachable"),
		strings.Contains(low, "connection reset"), strings.Contains(low, "unexpected eof"), strings.HasSuffix(low, ": eof"),
		strings.Contains(low, "server gave http response to https client"):
		return fmt.Errorf("%w: %s %s: %s is unreachable (%s)", ErrUnreachable, op, ref, reg, msg)
	case strings.Contains(low, "unauthorized"), strings.Contains(low, "authentication required"),
		strings.Contains(low, "no basic auth credentials"), strings.Contains(low, "access denied"),
		strings.Contains(low, "denied:"):
		return fmt.Errorf("%w: %s %s: %s refused the credentials (%s): give --registry-auth FILE with an entry for %s (Docker's config.json format)",
			ErrUnauthorized, op, ref, reg, msg, p.Domain)
	case strings.Contains(low, "manifest unknown"), strings.Contains(low, "not found"), strings.Contains(low, "name unknown"):
		return fmt.Errorf("%w: %s %s: %s answers: %s", ErrUnknown, op, ref, reg, msg)
	}
	return fmt.Errorf("%s %s: %s: %s", op, ref, reg, msg)
}
