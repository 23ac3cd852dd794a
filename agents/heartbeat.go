package agents

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/isolation"
)

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
			Restart:        s.assign.Restart,
			State:          state,
			PID:            s.pid,
			Port:           s.port,
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
		Images:    r.imageStatuses(),
		Logs:      r.a.cfg.Logs,
		Agent:     r.a.instance,
		Started:   r.began,
	}
}

// publish hands the node record to the keeper if it changed since the last one (or always,
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
	// The keeper writes it into the node's entry, under the node's session.
	if err := writeFileAtomic(filepath.Join(r.a.cfg.StateDir, nodeRecordFile), b, 0o600); err != nil {
		r.log.Error("write node record", "err", err)
		return
	}
	r.lastSent, r.lastSentAt = b, time.Now()
	if r.keeper != nil {
		r.keeper.Notify()
	}
}

// publishSoon publishes the node record within minHealthWrite of the last write, not at the
// next heartbeat: a worker that ended, failed to start or was evicted is news for the
// master (it may move the worker) and for the cluster's events. Starts and stops wait for
// the heartbeat: a node starting many workers writes its record once per heartbeat still.
func (r *run) publishSoon() {
	if wait := minHealthWrite - time.Since(r.lastSentAt); wait > 0 {
		r.healthTimer.Reset(wait)
		return
	}
	r.publish(false)
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
