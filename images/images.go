package images

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
)

const (
	// LabelManaged marks images stormdock built; List and Prune touch only these.
	LabelManaged = "io.stormdock.image"
	// LabelBinary records the sha256 of the embedded stormdock binary.
	LabelBinary = "io.stormdock.binary.sha256"
	// LabelShim records the sha256 of the embedded stormdock-shim, when the image has one.
	LabelShim = "io.stormdock.shim.sha256"

	// DefaultTag is the tag of a build that names none.
	DefaultTag = "stormdock/worker:latest"
	// StormdockPath is where the stormdock binary sits in an image.
	StormdockPath = "/stormdock"
	// ShimPath is where stormdock-shim sits in an image: beside the stormdock binary, where
	// an agent running from the image (cluster create) finds it for its process workers.
	ShimPath = "/stormdock-shim"
	// JobPath is where a job's own binary sits in an image, when one is given.
	JobPath = "/job"
)

// API is the part of the Docker client the package uses; *client.Client implements it.
type API interface {
	ImageBuild(ctx context.Context, buildContext io.Reader, options build.ImageBuildOptions) (build.ImageBuildResponse, error)
	ImageList(ctx context.Context, options image.ListOptions) ([]image.Summary, error)
	ImageRemove(ctx context.Context, imageID string, options image.RemoveOptions) ([]image.DeleteResponse, error)
	ContainerList(ctx context.Context, options container.ListOptions) ([]container.Summary, error)
	ImagePush(ctx context.Context, ref string, options image.PushOptions) (io.ReadCloser, error)
	ImagePull(ctx context.Context, ref string, options image.PullOptions) (io.ReadCloser, error)
	ImageInspect(ctx context.Context, ref string, opts ...client.ImageInspectOption) (image.InspectResponse, error)
}

// Manager builds, pushes, pulls and garbage-collects stormdock images on one Docker engine.
type Manager struct {
	api  API
	log  *slog.Logger
	auth *Auth
}

// Option configures a Manager.
type Option func(*Manager)

// WithAuth gives the registry credentials pushes and pulls use.
func WithAuth(a *Auth) Option { return func(m *Manager) { m.auth = a } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option {
	return func(m *Manager) { m.log = l.With("component", "images") }
}

// New returns a Manager using api (normally a *client.Client with API version negotiation).
func New(api API, opts ...Option) *Manager {
	m := &Manager{api: api, log: slog.Default().With("component", "images")}
	for _, o := range opts {
		o(m)
	}
	return m
}

// Image is a stormdock image on the engine.
type Image struct {
	ID   string
	Tags []string
	// Digests are the registry digests the image is known by (NAME@sha256:...): set once it
	// was pushed or pulled, empty for an image only ever built here.
	Digests []string
	Created time.Time
	Size    int64
	Labels  map[string]string
}

func fromSummary(s image.Summary) Image {
	tags := slices.DeleteFunc(slices.Clone(s.RepoTags), func(t string) bool { return t == "<none>:<none>" })
	digests := slices.DeleteFunc(slices.Clone(s.RepoDigests), func(d string) bool { return d == "<none>@<none>" })
	return Image{ID: s.ID, Tags: tags, Digests: digests, Created: time.Unix(s.Created, 0), Size: s.Size, Labels: s.Labels}
}

// List returns the stormdock images, optionally only those that also carry every label in
// match, newest first.
func (m *Manager) List(ctx context.Context, match map[string]string) ([]Image, error) {
	f := filters.NewArgs(filters.Arg("label", LabelManaged+"=true"))
	for _, k := range slices.Sorted(maps.Keys(match)) {
		f.Add("label", k+"="+match[k])
	}
	sums, err := m.api.ImageList(ctx, image.ListOptions{Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	out := make([]Image, 0, len(sums))
	for _, s := range sums {
		out = append(out, fromSummary(s))
	}
	slices.SortFunc(out, func(a, b Image) int { return b.Created.Compare(a.Created) })
	return out, nil
}

// Remove deletes an image by tag or id. Removing a tag of an image with other tags only
// untags it, as docker rmi does; an image in use by a container is refused.
func (m *Manager) Remove(ctx context.Context, ref string) error {
	if _, err := m.api.ImageRemove(ctx, ref, image.RemoveOptions{PruneChildren: true}); err != nil {
		return fmt.Errorf("remove image %s: %w", ref, err)
	}
	return nil
}

// Prune removes the stormdock images (those carrying every label in match, too) that no
// container, running or stopped, uses. It returns what it removed.
func (m *Manager) Prune(ctx context.Context, match map[string]string) ([]Image, error) {
	imgs, err := m.List(ctx, match)
	if err != nil {
		return nil, err
	}
	ctrs, err := m.api.ContainerList(ctx, container.ListOptions{All: true})
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	used := map[string]bool{}
	for _, c := range ctrs {
		used[c.ImageID] = true
	}
	var removed []Image
	for _, img := range imgs {
		if used[img.ID] {
			continue
		}
		// Untag one tag at a time rather than force-removing the id: a force would also
		// untag an image that a container created since the listing uses.
		refs := img.Tags
		if len(refs) == 0 {
			refs = []string{img.ID}
		}
		var rerr error
		for _, ref := range refs {
			if _, err := m.api.ImageRemove(ctx, ref, image.RemoveOptions{PruneChildren: true}); err != nil {
				rerr = err
				break
			}
		}
		if rerr != nil {
			m.log.Warn("prune: keep image", "id", img.ID, "err", rerr)
			continue
		}
		removed = append(removed, img)
	}
	return removed, nil
}
