package agents

import (
	"context"
	"errors"
	"reflect"
	"syscall"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/isolation"
)

// Live changes: an assignment that changes nothing a worker runs (cluster.WorkerAssignment
// SameRun) reaches the running worker without a restart. What it can re-read (the worker
// count and its epoch, the generation, live env, routers) is rewritten in its live
// configuration (STORMDOCK_CONFIG), and the worker gets SIGHUP to re-read it; the rest
// (grace period, priority) is the agent's own and only recorded.

// liveSignal is what a worker gets after its live configuration changed.
const liveSignal = syscall.SIGHUP

// signalTimeout bounds one signal delivery (a docker engine call).
const signalTimeout = 10 * time.Second

// equalAssignment reports whether two assignments are the same in every field.
func equalAssignment(a, b cluster.WorkerAssignment) bool { return reflect.DeepEqual(a, b) }

// liveChange takes want for a worker whose run stays the same.
func (r *run) liveChange(s *slot, want cluster.WorkerAssignment) {
	config := !s.assign.SameLive(want)
	s.assign = want
	if err := r.a.writeRecord(s.id, s.record()); err != nil {
		r.log.Warn("write worker record", "worker", s.id, "err", err)
	}
	if !config {
		return
	}
	if err := r.a.writeConfig(s.id, want, r.a.userOf(want, s.mode)); err != nil {
		r.log.Warn("write live configuration", "worker", s.id, "err", err)
		return
	}
	r.log.Info("live configuration changed", "worker", s.id, "generation", want.Generation, "workers", want.Workers, "epoch", want.Epoch)
	// A worker not running now reads the file when it starts; one being started may miss
	// the signal, which is why workers also re-read the file when it changes.
	if s.state != cluster.WorkerRunning || s.busy {
		return
	}
	drv, id, ctx := r.a.drivers[s.mode], s.id, r.ctx
	if drv == nil {
		return
	}
	r.goOp(func() {
		sctx, cancel := context.WithTimeout(ctx, signalTimeout)
		defer cancel()
		if err := drv.Signal(sctx, id, liveSignal); err != nil && !errors.Is(err, isolation.ErrNotFound) && ctx.Err() == nil {
			r.log.Warn("signal live configuration change", "worker", id, "err", err)
		}
	})
}
