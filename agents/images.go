package agents

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/ctxtime"
)

// Images fetches docker workers' images onto the node (package images, through the engine).
// Whose registry credentials it uses, acc says: the node's own (--registry-auth, kept behind
// it) for an image under a prefix the admin shared, the worker's tenant's otherwise (from the
// store), never another tenant's. Credentials are never logged.
type Images interface {
	// Has reports whether ref is on the node.
	Has(ctx context.Context, ref string) (bool, error)
	// Pull fetches ref with acc's credentials; its error names the registry and says why.
	Pull(ctx context.Context, ref string, acc images.Access) error
	// Check asks the registry whether acc's credentials may read ref's manifest. An image
	// on the node may have been pulled for another tenant, and the engine pulls a digest it
	// has without asking the registry: so a tenant's worker starts on a cached image only
	// after this check.
	Check(ctx context.Context, ref string, acc images.Access) error
}

// checkTTL is how long a tenant's successful access check of an image is trusted: a worker
// that restarts within it starts without a registry round trip. Credentials taken away, or
// changed, take effect after it at most (changed ones at once: they are part of the key).
const checkTTL = time.Minute

// imageAccess reads from the store whose credentials fetch tenant's image ref: the node's
// own when ref is under a shared prefix, the tenant's otherwise (nil when it has none). When
// the store does not answer, what it last said is used (a worker restarting during a store
// outage still starts), and only when it never answered is the start refused.
func (a *Agent) imageAccess(ctx context.Context, tenant, ref string) (images.Access, error) {
	acc := images.Access{Tenant: tenant}
	shared, err := a.storeValue(ctx, cluster.SharedImagesKey)
	if err != nil {
		return acc, fmt.Errorf("read shared images: %w", err)
	}
	if shared != nil {
		var si cluster.SharedImages
		if err := json.Unmarshal(shared, &si); err != nil {
			return acc, fmt.Errorf("read shared images: %w", err)
		}
		if images.SharedUnder(si.Prefixes, ref) {
			acc.Shared = true
			return acc, nil
		}
	}
	if tenant == "" {
		return acc, nil
	}
	key, err := cluster.TenantRegistryAuthKey(tenant)
	if err != nil {
		return acc, err
	}
	val, err := a.storeValue(ctx, key)
	if err != nil {
		return acc, fmt.Errorf("read tenant %s's registry credentials: %w", tenant, err)
	}
	if val == nil {
		return acc, nil
	}
	if _, ok := cluster.ParseSealedRegistryAuth(val); ok {
		// Sealed with the masters' keyring: the leading master opens them for this node.
		acc.Auth, err = a.tenantRegistryAuth(ctx, tenant, val)
		return acc, err
	}
	if acc.Auth, err = images.ParseAuth(val, "tenant "+tenant+"'s registry credentials"); err != nil {
		return acc, fmt.Errorf("read tenant %s's registry credentials: %w", tenant, err)
	}
	return acc, nil
}

// storeValue reads key (nil when it does not exist), or, when the store does not answer,
// the value it last read there.
func (a *Agent) storeValue(ctx context.Context, key string) ([]byte, error) {
	e, err := a.store.Get(ctx, key)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lastAccess == nil {
		a.lastAccess = map[string][]byte{}
	}
	switch {
	case err == nil:
		a.lastAccess[key] = e.Value
		return e.Value, nil
	case errors.Is(err, coord.ErrNotFound):
		a.lastAccess[key] = nil
		return nil, nil
	}
	if v, ok := a.lastAccess[key]; ok {
		return v, nil
	}
	return nil, err
}

// checked reports whether tenant passed an access check of ref with these credentials within
// checkTTL; ok records a check that passed.
func (a *Agent) checked(tenant, ref string, acc images.Access, ok bool) bool {
	sum := sha256.Sum256(acc.Auth.Marshal())
	key := tenant + "\x00" + ref + "\x00" + hex.EncodeToString(sum[:])
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	if ok {
		if a.accessChecks == nil {
			a.accessChecks = map[string]time.Time{}
		}
		for k, at := range a.accessChecks {
			if now.Sub(at) > checkTTL {
				delete(a.accessChecks, k)
			}
		}
		a.accessChecks[key] = now
		return true
	}
	at, found := a.accessChecks[key]
	return found && now.Sub(at) <= checkTTL
}

// imageRef is the image a docker worker runs: pinned by digest when the master pinned it.
func imageRef(wa cluster.WorkerAssignment) string {
	if wa.Pinned != "" {
		return wa.Pinned
	}
	return wa.Image
}

// imageMetrics count the agent's pulls.
type imageMetrics struct {
	pulls    *prometheus.CounterVec // result: ok, failed
	duration prometheus.Histogram
}

func newImageMetrics(reg prometheus.Registerer) (*imageMetrics, error) {
	m := &imageMetrics{
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "stormdock", Subsystem: "agent", Name: "image_pulls_total",
			Help: "Image pulls by result (ok, failed), for workers and pre-pulls.",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "stormdock", Subsystem: "agent", Name: "image_pull_duration_seconds",
			Help:    "Time of successful image pulls.",
			Buckets: prometheus.ExponentialBuckets(0.1, 2, 12),
		}),
	}
	m.pulls.WithLabelValues("ok")
	m.pulls.WithLabelValues("failed")
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.pulls, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("agent: register metrics: %w", err)
		}
	}
	return m, nil
}

// pull fetches tenant's image ref unless the node has it, with the credentials imageAccess
// says; an image the node has is used only once the tenant's credentials pass the registry's
// check (a shared one needs none). onPull runs (in the caller's goroutine) once it turns out
// a pull is needed.
func (a *Agent) pull(ctx context.Context, tenant, ref string, onPull func()) error {
	acc, err := a.imageAccess(ctx, tenant, ref)
	if err != nil {
		return err
	}
	ok, err := a.images().Has(ctx, ref)
	if err != nil {
		return err
	}
	if ok {
		if acc.Shared || !explicitRegistry(ref) || a.checked(tenant, ref, acc, false) {
			return nil
		}
		if err := a.images().Check(ctx, ref, acc); err != nil {
			return err
		}
		a.checked(tenant, ref, acc, true)
		return nil
	}
	onPull()
	t0 := time.Now()
	err = a.images().Pull(ctx, ref, acc)
	if err != nil {
		a.imageMetrics.pulls.WithLabelValues("failed").Inc()
		return err
	}
	a.imageMetrics.pulls.WithLabelValues("ok").Inc()
	a.imageMetrics.duration.Observe(time.Since(t0).Seconds())
	a.checked(tenant, ref, acc, true) // the pull asked the registry with these credentials
	return nil
}

// explicitRegistry reports whether ref names its registry. One that does not (built on the
// node, or a Docker Hub short name) has no registry to check it against: see docs/images.md.
func explicitRegistry(ref string) bool {
	p, err := images.ParseRef(ref)
	return err == nil && p.Explicit
}

// fetch pulls the image of a docker worker being started when the node lacks it, showing the
// worker as pulling meanwhile.
func (r *run) fetch(ctx context.Context, s *slot, seq int, tenant, ref string) error {
	return r.a.pull(ctx, tenant, ref, func() {
		r.post(func() {
			if s.seq == seq && s.busy {
				s.state, s.since = cluster.WorkerPulling, time.Now()
				r.log.Info("pulling image", "worker", s.id, "image", ref)
			}
		})
	})
}

// pullFailed records a start that did not happen because the image could not be pulled. It
// is not a crash: the restart counts stay, so the master does not take a registry outage
// for a crash loop and move the worker; the start is retried with the start backoff.
func (r *run) pullFailed(s *slot, seq int, err error) {
	r.notStarted(s, seq, "image pull failed", "image pull failed", err)
}

// notStarted records a start that did not happen for a reason outside the worker (its
// image, its secrets): not a crash, so the restart counts stay; it is tried again with the
// start backoff, its state showing why (lastExit: "what: err", in one line).
func (r *run) notStarted(s *slot, seq int, what, logMsg string, err error) {
	s.busy = false
	if seq != s.seq {
		return
	}
	s.failures++
	s.state, s.since = cluster.WorkerFailed, time.Now()
	s.lastExit = what + ": " + strings.Join(strings.Fields(err.Error()), " ")
	retry := r.retryIn(s.failures, err)
	s.retryAt = time.Now().Add(retry)
	r.log.Warn(logMsg, "worker", s.id, "attempt", s.failures, "retry_in", retry, "err", err)
	r.reconcile()
}

// prepull is one image of the assignment's pre-pull list.
type prepull struct {
	status   cluster.ImageStatus
	busy     bool
	failures int
	retryAt  time.Time
	seq      int
}

// syncImages starts pulling the pre-pull list's images the node lacks, drops the ones no
// longer listed, and tells the image collector what the node wants.
func (r *run) syncImages(list []string) {
	if r.prepulls == nil {
		r.prepulls = map[string]*prepull{}
	}
	want := map[string]bool{}
	for _, ref := range list {
		want[ref] = true
	}
	for ref := range r.prepulls {
		if !want[ref] {
			delete(r.prepulls, ref)
		}
	}
	now := time.Now()
	var next time.Time
	for _, ref := range slices.Sorted(maps.Keys(want)) {
		p := r.prepulls[ref]
		if p == nil {
			p = &prepull{status: cluster.ImageStatus{Ref: ref}}
			r.prepulls[ref] = p
		}
		switch {
		case p.busy || p.status.State == cluster.ImageReady:
		case p.status.State == cluster.ImageFailed && now.Before(p.retryAt):
			if next.IsZero() || p.retryAt.Before(next) {
				next = p.retryAt
			}
		default:
			r.startPrepull(ref, p)
		}
	}
	if !next.IsZero() && (r.prepullAt.IsZero() || next.Before(r.prepullAt)) {
		r.prepullAt = next
		r.goOp(func() {
			if ctxtime.Sleep(r.ctx, time.Until(next)) == nil {
				r.post(func() {
					if r.prepullAt.Equal(next) {
						r.prepullAt = time.Time{}
					}
					r.syncImages(slices.Collect(maps.Keys(r.prepulls)))
				})
			}
		})
	}
	wanted := slices.Collect(maps.Keys(want))
	for _, wa := range r.desired {
		if isolationOf(wa) == cluster.IsolationDocker && imageRef(wa) != "" {
			wanted = append(wanted, imageRef(wa))
		}
	}
	slices.Sort(wanted)
	r.a.mu.Lock()
	r.a.wanted = slices.Compact(wanted)
	r.a.mu.Unlock()
}

func (r *run) startPrepull(ref string, p *prepull) {
	p.busy, p.seq = true, p.seq+1
	p.status.State, p.status.Error, p.status.Since = cluster.ImagePulling, "", time.Now().UTC().Truncate(time.Millisecond)
	if r.a.images() == nil {
		r.prepullDone(ref, p, p.seq, fmt.Errorf("this node pulls no images: its agent offers no docker isolation"))
		return
	}
	seq, ctx, tenant := p.seq, r.ctx, r.prepullTenants[ref]
	r.goOp(func() {
		err := r.a.pull(ctx, tenant, ref, func() {})
		r.post(func() { r.prepullDone(ref, p, seq, err) })
	})
}

func (r *run) prepullDone(ref string, p *prepull, seq int, err error) {
	if r.prepulls[ref] != p || p.seq != seq {
		return // dropped from the list meanwhile
	}
	p.busy = false
	p.status.Since = time.Now().UTC().Truncate(time.Millisecond)
	if err != nil {
		p.failures++
		p.status.State, p.status.Error = cluster.ImageFailed, strings.Join(strings.Fields(err.Error()), " ")
		p.retryAt = time.Now().Add(r.backoff(p.failures))
		r.log.Warn("pre-pull failed", "image", ref, "attempt", p.failures, "retry_in", r.backoff(p.failures), "err", err)
		r.syncImages(slices.Collect(maps.Keys(r.prepulls)))
	} else {
		p.failures = 0
		p.status.State = cluster.ImageReady
		r.log.Info("image pre-pulled", "image", ref)
	}
}

// imageStatuses reports the pre-pull list, sorted by reference.
func (r *run) imageStatuses() []cluster.ImageStatus {
	var out []cluster.ImageStatus
	for _, ref := range slices.Sorted(maps.Keys(r.prepulls)) {
		out = append(out, r.prepulls[ref].status)
	}
	return out
}

// WantedImages lists the images the node's assignment needs: its docker workers' and its
// pre-pull list. The node's image collector keeps them.
func (a *Agent) WantedImages() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.wanted)
}
