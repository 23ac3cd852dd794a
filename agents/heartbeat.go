package agents

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/atomicfile"
	"github.com/stormdock/stormdock/isolation"
)

// memoryQuantum rounds reported memory so that small fluctuations do not force a write.
const memoryQuantum = 4 << 20

// sampleEvery is how many heartbeats pass between two memory samples: reading every
// worker's cgroup statistics costs more than the rest of a heartbeat, and a memory reading
// that changes by a few MiB is not worth a store write per heartbeat.
const sampleEvery = 5

// heartbeat samples memory use every sampleEvery beats; the loop publishes what changed.
func (r *run) heartbeat() {
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
			ts = append(ts, target{s, s.seq, r.a.driver(s.mode)})
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
			Restart:        s.assign.Restart,
			State:          state,
			PID:            s.pid,
			Port:           s.port,
			ContainerID:    s.containerID,
			Restarts:       s.restarts,
			RecentRestarts: len(s.recent),
			LastExit:       s.lastExit,
			ExitReason:     s.exitReason,
			Lapses:         s.lapses,
			Memory:         s.memory,
			Since:          s.since.UTC().Truncate(time.Millisecond),
		})
	}
	slices.SortFunc(ws, func(a, b cluster.WorkerStatus) int { return a.Key.Compare(b.Key) })
	granted, requested := r.a.sessionTimeouts()
	return cluster.NodeRecord{
		SessionTimeout:   granted,
		SessionRequested: requested,
		Node:             node,
		Health:           r.health,
		Workers:          ws,
		Isolation:        r.a.modesNow(),
		Images:           r.imageStatuses(),
		Logs:             r.a.cfg.Logs,
		Agent:            r.a.instance,
		Started:          r.began,
		Identity:         r.a.identityRecord(),
	}
}

// flush publishes the node record when it differs from the one last written: a worker's or
// the node's change is reported at once, not at the next heartbeat, in one write per burst
// of changes. While workers are being started, the write waits for the last of those starts
// to end (every start of an assignment runs at once, so they end within moments of each
// other), but not for longer than a heartbeat: a slow start (a container's) holds back no
// other report for longer. A health change waits for no start. Writes are at most one per
// pace.MinWrite, but for a first few after a quiet while (pace.Burst).
func (r *run) flush() {
	if !r.pendingSince.IsZero() && !r.urgent && r.starting() > 0 && !r.publishAt.IsZero() {
		return // the burst goes on and its write is due already: no need to encode the record
	}
	b, err := json.Marshal(r.record())
	if err != nil {
		r.log.Error("encode node record", "err", err)
		return
	}
	if bytes.Equal(b, r.lastSent) {
		r.pendingSince, r.urgent = time.Time{}, false
		return
	}
	now := time.Now()
	if r.pendingSince.IsZero() {
		r.pendingSince = now
	}
	at := now
	if !r.urgent && r.starting() > 0 {
		at = r.pendingSince.Add(r.a.cfg.Heartbeat)
	}
	if next := r.writes.Next(now); next.After(at) {
		at = next
	}
	if at.After(now) {
		if r.publishAt.IsZero() || at.Before(r.publishAt) {
			r.publishAt = at
			r.publishTimer.Reset(at.Sub(now))
		}
		return
	}
	r.write(b)
}

// starting counts the workers whose driver start is under way (not pulling an image).
func (r *run) starting() int {
	n := 0
	for _, s := range r.workers {
		if s.busy && s.state == cluster.WorkerStarting {
			n++
		}
	}
	return n
}

// publish writes the node record now if it changed since the last one (or always, with
// force): at start and when the keeper's state changes.
func (r *run) publish(force bool) {
	b, err := json.Marshal(r.record())
	if err != nil {
		r.log.Error("encode node record", "err", err)
		return
	}
	if !force && bytes.Equal(b, r.lastSent) {
		return
	}
	r.write(b)
}

// write hands the node record to the keeper, which writes it into the node's entry, under
// the node's session.
func (r *run) write(b []byte) {
	r.updateMetrics()
	if err := atomicfile.WriteFile(filepath.Join(r.a.cfg.StateDir, nodeRecordFile), b, 0o600); err != nil {
		r.log.Error("write node record", "err", err)
		return
	}
	now := time.Now()
	r.lastSent = b
	r.writes.Took(now)
	r.pendingSince, r.urgent = time.Time{}, false
	if r.keeper != nil {
		r.keeper.Notify()
	}
	r.log.Debug("node record handed to the keeper", "bytes", len(b), "starting", r.starting())
}

// publishSoon publishes the node record without waiting for a burst of starts to end: a
// worker that ended, failed to start or was evicted is news for the master (it may move
// the worker) and for the cluster's events. The write pace (package pace) still holds.
func (r *run) publishSoon() {
	r.urgent = true
	r.flush()
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
