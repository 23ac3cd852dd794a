package agents

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/ctxtime"
)

// Images fetches docker workers' images onto the node (package images, through the engine,
// with the agent's registry credentials). Credentials stay behind it: the agent never sees
// or logs them.
type Images interface {
	// Has reports whether ref is on the node.
	Has(ctx context.Context, ref string) (bool, error)
	// Pull fetches ref; its error names the registry and says why.
	Pull(ctx context.Context, ref string) error
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

// pull fetches ref unless the node has it; onPull runs (in the caller's goroutine) once it
// turns out a pull is needed.
func (a *Agent) pull(ctx context.Context, ref string, onPull func()) error {
	ok, err := a.cfg.Images.Has(ctx, ref)
	if err != nil || ok {
		return err
	}
	onPull()
	t0 := time.Now()
	err = a.cfg.Images.Pull(ctx, ref)
	if err != nil {
		a.imageMetrics.pulls.WithLabelValues("failed").Inc()
		return err
	}
	a.imageMetrics.pulls.WithLabelValues("ok").Inc()
	a.imageMetrics.duration.Observe(time.Since(t0).Seconds())
	return nil
}

// fetch pulls the image of a docker worker being started when the node lacks it, showing the
// worker as pulling meanwhile.
func (r *run) fetch(ctx context.Context, s *slot, seq int, ref string) error {
	return r.a.pull(ctx, ref, func() {
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
	s.busy = false
	if seq != s.seq {
		return
	}
	s.failures++
	s.state, s.since = cluster.WorkerFailed, time.Now()
	s.lastExit = "image pull failed: " + strings.Join(strings.Fields(err.Error()), " ")
	s.retryAt = time.Now().Add(r.backoff(s.failures))
	r.log.Warn("image pull failed", "worker", s.id, "attempt", s.failures, "retry_in", r.backoff(s.failures), "err", err)
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
	if r.a.cfg.Images == nil {
		r.prepullDone(ref, p, p.seq, fmt.Errorf("this node pulls no images: its agent offers no docker isolation"))
		return
	}
	seq, ctx := p.seq, r.ctx
	r.goOp(func() {
		err := r.a.pull(ctx, ref, func() {})
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
