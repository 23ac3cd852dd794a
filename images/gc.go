package images

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
)

// Defaults of GCConfig.
const (
	DefaultGCUnused   = 10 * time.Minute
	DefaultGCInterval = time.Minute
)

// GCConfig says which stormdock images an agent's collector removes.
type GCConfig struct {
	// Keep is how many unused images stay; beyond it the least recently used go. 0 sets no
	// count cap.
	Keep int
	// MaxBytes caps the total size of the stormdock images on the engine (in use or not);
	// beyond it the least recently used unused images go. 0 sets no size cap.
	MaxBytes int64
	// Unused is how long an image must have gone unused before it may be removed: an image
	// that was just pulled for a worker about to start, or that a restarted worker needs
	// again, stays. Default DefaultGCUnused.
	Unused time.Duration
	// Interval is the time between two collections. Default DefaultGCInterval.
	Interval time.Duration
	// Match restricts collection to images carrying these labels too.
	Match map[string]string
	// Wanted returns the image references the node's agent is about to run or was asked to
	// pre-pull: in use as much as an image a container runs.
	Wanted func() []string
}

// GC removes the stormdock images of one engine that no container uses once they exceed
// the caps, least recently used first. An image a container uses (running or stopped), one
// the agent wants, or one with no registry digest (built here and never pushed, so nothing
// could bring it back) is never removed.
type GC struct {
	m   *Manager
	cfg GCConfig
	now func() time.Time

	mu       sync.Mutex
	lastUsed map[string]time.Time // image id: last seen in use, or first seen
}

// NewGC returns a collector; it does nothing until Run or Collect.
func (m *Manager) NewGC(cfg GCConfig) *GC {
	if cfg.Unused <= 0 {
		cfg.Unused = DefaultGCUnused
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultGCInterval
	}
	return &GC{m: m, cfg: cfg, now: time.Now, lastUsed: map[string]time.Time{}}
}

// Enabled reports whether any cap is set.
func (cfg GCConfig) Enabled() bool { return cfg.Keep > 0 || cfg.MaxBytes > 0 }

// Run collects every Interval until ctx is done.
func (g *GC) Run(ctx context.Context) error {
	t := time.NewTicker(g.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := g.Collect(ctx); err != nil && ctx.Err() == nil {
			g.m.log.Warn("image garbage collection", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Collect runs one collection and returns the images it removed.
func (g *GC) Collect(ctx context.Context) ([]Image, error) {
	imgs, err := g.m.List(ctx, g.cfg.Match)
	if err != nil {
		return nil, err
	}
	ctrs, err := g.m.api.ContainerList(ctx, container.ListOptions{All: true})
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	used := map[string]bool{}
	for _, c := range ctrs {
		used[c.ImageID] = true
	}
	if g.cfg.Wanted != nil {
		for _, ref := range g.cfg.Wanted() {
			info, err := g.m.api.ImageInspect(ctx, ref)
			if err == nil {
				used[info.ID] = true
			} else if !errdefs.IsNotFound(err) {
				// Cannot tell what is wanted: remove nothing this round.
				return nil, fmt.Errorf("inspect wanted image %s: %w", ref, err)
			}
		}
	}
	now := g.now()
	g.mu.Lock()
	seen := map[string]bool{}
	var total int64
	var unused, candidates []Image
	for _, img := range imgs {
		seen[img.ID] = true
		total += img.Size
		last, ok := g.lastUsed[img.ID]
		if used[img.ID] || !ok {
			last = now
			g.lastUsed[img.ID] = now
		}
		if used[img.ID] {
			continue
		}
		unused = append(unused, img)
		if len(img.Digests) > 0 && now.Sub(last) >= g.cfg.Unused {
			candidates = append(candidates, img)
		}
	}
	for id := range g.lastUsed {
		if !seen[id] {
			delete(g.lastUsed, id)
		}
	}
	lastUsed := func(img Image) time.Time { return g.lastUsed[img.ID] }
	slices.SortFunc(candidates, func(a, b Image) int {
		if c := lastUsed(a).Compare(lastUsed(b)); c != 0 {
			return c
		}
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
	})
	g.mu.Unlock()

	var removed []Image
	count := len(unused)
	for _, img := range candidates {
		overCount := g.cfg.Keep > 0 && count > g.cfg.Keep
		overSize := g.cfg.MaxBytes > 0 && total > g.cfg.MaxBytes
		if !overCount && !overSize {
			break
		}
		if err := g.remove(ctx, img); err != nil {
			g.m.log.Warn("image gc: keep image", "id", shortID(img.ID), "err", err)
			continue
		}
		g.m.log.Info("image gc: removed", "id", shortID(img.ID), "tags", img.Tags, "size", img.Size)
		removed = append(removed, img)
		count--
		total -= img.Size
	}
	return removed, nil
}

// remove untags the image and then removes it by id, never forced: the engine refuses to
// remove an image a container created since the listing uses.
func (g *GC) remove(ctx context.Context, img Image) error {
	for _, ref := range img.Tags {
		if _, err := g.m.api.ImageRemove(ctx, ref, image.RemoveOptions{PruneChildren: true}); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	if _, err := g.m.api.ImageRemove(ctx, img.ID, image.RemoveOptions{PruneChildren: true}); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	g.mu.Lock()
	delete(g.lastUsed, img.ID)
	g.mu.Unlock()
	return nil
}

func shortID(id string) string {
	if len(id) > 19 {
		return id[7:19]
	}
	return id
}
