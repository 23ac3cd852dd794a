package agents

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/isolation"
)

// ErrNodeTaken: the node's entry belongs to a live agent on another host (two agents were
// given the same node id).
var ErrNodeTaken = errors.New("node id registered by another agent")

// memoryQuantum rounds reported memory so that small fluctuations do not force a write.
const memoryQuantum = 4 << 20

// sampleEvery is how many heartbeats pass between two memory samples: reading every
// worker's cgroup statistics costs more than the rest of a heartbeat, and a memory reading
// that changes by a few MiB is not worth a store write per heartbeat.
const sampleEvery = 5

// heartbeat publishes the node record if it changed, and samples memory use for the next one.
func (r *run) heartbeat() {
	r.publish(false)
	r.beats++
	if r.sampling || r.beats%sampleEvery != 1 {
		return // a slow driver: skip a sample rather than pile them up
	}
	type target struct {
		s   *slot
		seq int
		drv isolation.Driver
	}
	var ts []target
	for _, s := range r.workers {
		if s.state == cluster.WorkerRunning {
			ts = append(ts, target{s, s.seq, r.a.drivers[s.mode]})
		}
	}
	if len(ts) == 0 {
		return
	}
	r.sampling = true
	ctx, timeout := r.ctx, r.a.cfg.Heartbeat
	r.goOp(func() {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		mem := make([]cluster.Bytes, len(ts))
		ok := make([]bool, len(ts))
		for i, t := range ts {
			u, err := t.drv.Usage(ctx, t.s.id)
			if err == nil {
				mem[i] = cluster.Bytes((u.MemoryBytes + memoryQuantum/2) / memoryQuantum * memoryQuantum)
				ok[i] = true
			}
		}
		r.post(func() {
			r.sampling = false
			for i, t := range ts {
				if ok[i] && t.s.seq == t.seq && t.s.state == cluster.WorkerRunning {
					t.s.memory = mem[i]
				}
			}
		})
	})
}

// record is the node record as the agent would write it now.
func (r *run) record() cluster.NodeRecord {
	node := r.a.Node()
	node.Throttled = r.health.Throttled
	now := time.Now()
	ws := make([]cluster.WorkerStatus, 0, len(r.workers))
	for _, s := range r.workers {
		r.pruneRecent(s, now)
		state := s.state
		if state == "" {
			state = cluster.WorkerStarting
		}
		ws = append(ws, cluster.WorkerStatus{
			Key:            s.assign.Key,
			Generation:     s.assign.Generation,
			State:          state,
			PID:            s.pid,
			ContainerID:    s.containerID,
			Restarts:       s.restarts,
			RecentRestarts: len(s.recent),
			LastExit:       s.lastExit,
			Memory:         s.memory,
			Since:          s.since.UTC().Truncate(time.Millisecond),
		})
	}
	slices.SortFunc(ws, func(a, b cluster.WorkerStatus) int { return a.Key.Compare(b.Key) })
	return cluster.NodeRecord{
		Node:      node,
		Health:    r.health,
		Workers:   ws,
		Isolation: r.a.modes,
		Agent:     r.a.instance,
		Started:   r.began,
	}
}

// publish hands the node record to the writer if it changed since the last one (or always,
// with force).
func (r *run) publish(force bool) {
	r.updateMetrics()
	b, err := json.Marshal(r.record())
	if err != nil {
		r.log.Error("encode node record", "err", err)
		return
	}
	if !force && bytes.Equal(b, r.lastSent) {
		return
	}
	r.lastSent, r.lastSentAt = b, time.Now()
	r.writer.send(b)
}

// updateMetrics publishes slot and worker gauges.
func (r *run) updateMetrics() {
	byState := map[string]int{}
	for _, s := range r.workers {
		st := s.state
		if st == "" {
			st = cluster.WorkerStarting
		}
		byState[st]++
	}
	r.a.metrics.setWorkers(byState)
	r.a.metrics.setSlots(r.a.cfg.Node.Slots, len(r.workers), r.health.Throttled)
}

// statusWriter writes node records to the store from a goroutine of its own, so that a slow or
// disconnected store never holds up the agent's loop. Only the latest record is kept: records
// that were superseded before they could be written are skipped.
type statusWriter struct {
	a   *Agent
	key string
	log *slog.Logger

	mu   sync.Mutex
	next []byte
	wake chan struct{}

	version int64 // of our entry as last written; -1: unknown (writer goroutine only)
}

func newStatusWriter(a *Agent, log *slog.Logger) *statusWriter {
	return &statusWriter{a: a, key: cluster.NodeKey(a.cfg.Node.ID), log: log, wake: make(chan struct{}, 1), version: -1}
}

func (w *statusWriter) send(b []byte) {
	w.mu.Lock()
	w.next = b
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *statusWriter) take() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := w.next
	w.next = nil
	return b
}

// requeue puts b back unless a newer record arrived meanwhile.
func (w *statusWriter) requeue(b []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.next == nil {
		w.next = b
	}
}

const writeRetryPause = 250 * time.Millisecond

func (w *statusWriter) run(ctx context.Context) {
	for {
		b := w.take()
		if b == nil {
			select {
			case <-ctx.Done():
				return
			case <-w.wake:
				continue
			}
		}
		if err := w.write(ctx, b); err != nil {
			if ctx.Err() != nil {
				return
			}
			w.log.Warn("write node record", "err", err)
			w.requeue(b)
			t := time.NewTimer(writeRetryPause)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// write puts b into the node's session-bound entry. It writes with the entry's version, never
// unconditionally: an unconditional Put would create a persistent entry while the session's
// entry is momentarily gone (expiry), and the node would then never disappear.
func (w *statusWriter) write(ctx context.Context, b []byte) error {
	st := w.a.store
	for attempt := 0; attempt < 5; attempt++ {
		if w.version >= 0 {
			v, err := st.Put(ctx, w.key, b, w.version)
			switch {
			case err == nil:
				w.version = v
				w.a.metrics.storeWrites.Inc()
				return nil
			case errors.Is(err, coord.ErrNotFound), errors.Is(err, coord.ErrConflict):
				w.version = -1 // gone or re-created (new session): find out below
			default:
				return err
			}
		}
		_, err := st.Create(ctx, w.key, b, coord.Ephemeral)
		if err == nil {
			w.version = 0
			w.a.metrics.storeWrites.Inc()
			return nil
		}
		if !errors.Is(err, coord.ErrExists) {
			return err
		}
		e, err := st.Get(ctx, w.key)
		switch {
		case errors.Is(err, coord.ErrNotFound):
			continue
		case err != nil:
			return err
		case e.Owner == st.SessionID():
			w.version = e.Version
			continue
		}
		var old cluster.NodeRecord
		_ = json.Unmarshal(e.Value, &old)
		if old.Node.Host != w.a.cfg.Node.Host || old.Agent == w.a.instance {
			return fmt.Errorf("%w: %s is held by agent %s on host %q", ErrNodeTaken, w.key, old.Agent, old.Node.Host)
		}
		// An earlier agent on this host, whose session has not timed out yet. It is dead: this
		// agent holds the state directory's lock. Take the entry over now rather than wait.
		w.log.Info("replacing the node entry of an earlier agent", "old_agent", old.Agent)
		if err := st.Delete(ctx, w.key, e.Version); err != nil && !errors.Is(err, coord.ErrNotFound) && !errors.Is(err, coord.ErrConflict) {
			return err
		}
	}
	return fmt.Errorf("write %s: gave up after repeated conflicts", w.key)
}
