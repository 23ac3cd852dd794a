package agents

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/ctxtime"
)

// ErrNotRunning is returned by Evict for a worker the agent does not run.
var ErrNotRunning = errors.New("agent: no such running worker")

// Victim is a running worker the node's health checks may evict.
type Victim struct {
	ID       string
	Priority int
	Request  uint64 // memory the job asked for
	Usage    uint64 // memory in use now
}

// call runs fn on the agent's loop and waits for it.
func (a *Agent) call(ctx context.Context, fn func(r *run)) error {
	a.mu.Lock()
	r := a.cur
	a.mu.Unlock()
	if r == nil {
		return errors.New("agent: not running")
	}
	done := make(chan struct{})
	select {
	case r.events <- func() { fn(r); close(done) }:
	case <-ctx.Done():
		return ctx.Err()
	case <-r.ctx.Done():
		return errors.New("agent: stopping")
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Victims lists the running workers with their priority, request and memory use, read
// from their drivers now.
func (a *Agent) Victims(ctx context.Context) ([]Victim, error) {
	type running struct {
		v    Victim
		mode string
	}
	var rs []running
	err := a.call(ctx, func(r *run) {
		for id, s := range r.workers {
			if s.state == cluster.WorkerRunning && !s.busy && !s.evicted {
				rs = append(rs, running{Victim{ID: id, Priority: s.assign.Priority, Request: uint64(s.assign.Resources.Memory)}, s.mode})
			}
		}
	})
	if err != nil {
		return nil, err
	}
	out := make([]Victim, 0, len(rs))
	for _, x := range rs {
		if u, err := a.driver(x.mode).Usage(ctx, x.v.ID); err == nil {
			x.v.Usage = u.MemoryBytes
		}
		out = append(out, x.v)
	}
	return out, nil
}

// Evict stops a running worker with its grace period and keeps it stopped: the node
// record reports it evicted, and the master places it on another node. It returns once
// the worker has stopped.
func (a *Agent) Evict(ctx context.Context, id string) error {
	var found bool
	err := a.call(ctx, func(r *run) {
		s := r.workers[id]
		if s == nil || s.evicted || !s.active() || s.busy {
			return
		}
		found = true
		s.evicted = true
		r.log.Warn("evicting worker under memory pressure", "worker", id, "key", s.assign.Key.String())
		r.a.metrics.evictions.WithLabelValues(s.assign.Key.Job).Inc()
		r.stop(s, false)
	})
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%w: %s", ErrNotRunning, id)
	}
	for {
		var stopped bool
		if err := a.call(ctx, func(r *run) {
			s := r.workers[id]
			stopped = s == nil || !s.busy
		}); err != nil {
			return err
		}
		if stopped {
			return nil
		}
		if err := ctxtime.Sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}
