package master

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/keyring"
	"github.com/stormdock/stormdock/master/desired"
)

// Resolver turns an image tag into the digest its registry serves now (images.Resolver,
// through the registry's HTTP API), with the credentials acc says: the master's own
// (--registry-auth) for a shared image, the tenant's otherwise.
type Resolver interface {
	ResolveAccess(ctx context.Context, ref string, acc images.Access) (string, error)
	// CommandOf reads an image's own entrypoint and cmd from its registry.
	CommandOf(ctx context.Context, ref string, acc images.Access) (images.ImageCommand, error)
}

// ImageAccess says whose credentials fetch a tenant's image: the master's and the nodes' own
// when the image is under a prefix the admin shared, the tenant's (from the store) otherwise,
// never another tenant's.
func ImageAccess(ctx context.Context, s coord.KV, ring *keyring.Keyring, tenant, ref string) (images.Access, error) {
	acc := images.Access{Tenant: tenant}
	shared, err := desired.SharedImages(ctx, s)
	if err != nil {
		return acc, err
	}
	if images.SharedUnder(shared, ref) {
		acc.Shared = true
		return acc, nil
	}
	acc.Auth, err = desired.TenantRegistryAuth(ctx, s, ring, tenant)
	return acc, err
}

// Pinning: the master resolves a docker job's image tag to a digest when the job is
// submitted, through the registry's HTTP API, rather than letting the first agent's pull
// decide. So the digest is known before any worker starts; workers started at once on many
// nodes cannot see different images when the tag moves meanwhile; job status shows it at
// once; and a rollout can have the new generation's image pre-pulled before it stops a
// worker. It costs the master a route to the registry, and credentials: the tenant's own
// (`stormdock tenant registry-auth`), or the master's (--registry-auth) for images under a
// prefix the admin shared (`stormdock image share`), so that a tenant cannot pin another
// tenant's private image.
// A job is accepted when its image cannot be resolved yet (registry down, tag not pushed
// yet): its workers pull the tag, the reason is shown, and the leader tries again every
// PinRetry until the image is pinned.

// pinTimeout bounds the registry round trip of a submit.
const pinTimeout = 10 * time.Second

// DefaultPinRetry is how often the leader retries images it could not pin.
const DefaultPinRetry = 5 * time.Second

// pinImage resolves the image of spec for generation gen. It returns nil for a job that has
// no image to pin: not docker, or an image that names no registry (built on the nodes, or
// from Docker Hub by short name).
func pinImage(ctx context.Context, res Resolver, store coord.KV, ring *keyring.Keyring, spec *cluster.JobSpec, gen int64) *cluster.ImagePin {
	if res == nil || spec.IsolationMode() != cluster.IsolationDocker || spec.Image == "" {
		return nil
	}
	ref, err := images.ParseRef(spec.Image)
	if err != nil || !ref.Explicit {
		return nil
	}
	pin := &cluster.ImagePin{Generation: gen, Image: spec.Image}
	ctx, cancel := context.WithTimeout(ctx, pinTimeout)
	defer cancel()
	var dgst string
	acc, err := ImageAccess(ctx, store, ring, spec.Tenant, spec.Image)
	if err == nil {
		dgst, err = res.ResolveAccess(ctx, spec.Image, acc)
	}
	if err == nil {
		pin.Ref, err = ref.WithDigest(dgst)
	}
	if err != nil {
		pin.Error, pin.NoAccess = err.Error(), errors.Is(err, images.ErrNoAccess)
		return pin
	}
	pin.Digest, pin.Resolved = dgst, time.Now().UTC()
	return pin
}

// CheckImageCommand refuses (api.ErrBadInput) a docker job without a command whose image,
// as pinned, has neither an entrypoint nor a cmd: its workers would have nothing to run.
// When the master cannot tell (not pinned yet, the registry does not answer) the job is
// accepted, and the agents refuse the start with the same reason.
func (m *Master) CheckImageCommand(ctx context.Context, spec *cluster.JobSpec, pin *cluster.ImagePin) error {
	if spec.IsolationMode() != cluster.IsolationDocker || len(spec.Command) > 0 || pin == nil || pin.Ref == "" || m.cfg.Resolver == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, pinTimeout)
	defer cancel()
	ring, _ := m.Keyring()
	acc, err := ImageAccess(ctx, m.store, ring, spec.Tenant, spec.Image)
	if err != nil {
		return nil
	}
	own, err := m.cfg.Resolver.CommandOf(ctx, pin.Ref, acc)
	if err != nil {
		m.log.Info("cannot read the image's own command at submit; the agents will", "job", spec.Name, "image", pin.Ref, "err", err)
		return nil
	}
	if own.Empty() {
		return fmt.Errorf("%w: job %s: image %s has neither an entrypoint nor a cmd, and the job gives no command: give command: [...]", api.ErrBadInput, spec.Name, spec.Image)
	}
	return nil
}

// repin retries, while this master leads, the images of running jobs that are not pinned
// yet, every PinRetry, until ctx is done.
func (m *Master) repin(ctx context.Context) {
	t := time.NewTicker(m.cfg.PinRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fence, leader := m.term()
		if !leader {
			continue
		}
		kv := coord.Fenced(m.store, fence)
		snap := m.jobs.snapshot()
		for _, name := range slices.Sorted(maps.Keys(snap)) {
			var rec cluster.JobRecord
			if json.Unmarshal(snap[name].Value, &rec) != nil || !unpinned(rec) {
				continue
			}
			ring, _ := m.Keyring()
			pin := pinImage(ctx, m.cfg.Resolver, m.store, ring, &rec.Spec, rec.Generation)
			if pin == nil || (pin.Ref == "" && pin.Error == rec.Image.Error && pin.NoAccess == rec.Image.NoAccess) {
				continue
			}
			key, err := cluster.JobKey(name)
			if err != nil {
				continue // a name the store holds but no job may have: not ours to touch
			}
			_, err = coord.Update(ctx, kv, key, func(cur []byte, exists bool) ([]byte, error) {
				var now cluster.JobRecord
				if !exists || json.Unmarshal(cur, &now) != nil || !unpinned(now) || now.Generation != pin.Generation {
					return nil, errUnchanged
				}
				now.Image = pin
				return json.Marshal(now)
			})
			switch {
			case err == nil && pin.Ref != "":
				m.log.Info("image pinned", "job", name, "generation", pin.Generation, "ref", pin.Ref)
			case err == nil:
				m.log.Warn("image not pinned yet", "job", name, "image", pin.Image, "err", pin.Error)
			case !errors.Is(err, errUnchanged) && ctx.Err() == nil:
				m.log.Warn("record image pin", "job", name, "err", err)
			}
		}
	}
}

// errUnchanged ends an update that finds nothing to do any more.
var errUnchanged = errors.New("unchanged")

// unpinned reports a running job whose current generation's image is still to be pinned.
func unpinned(rec cluster.JobRecord) bool {
	return rec.State == cluster.JobRunning && rec.Image != nil && rec.Image.Ref == "" && rec.Image.Generation == rec.Generation
}
