package api

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Event is one change of the cluster as the masters record it: GET /v1/events. Every master
// serves the same events, in the same order (by ID).
type Event struct {
	// ID orders events: it grows with every event recorded (it is not dense).
	ID   int64     `json:"id"`
	Time time.Time `json:"time"`
	// Kind is one of the Event* kinds below.
	Kind string `json:"kind"`
	// Object is what the event is about: job/NAME, worker/JOB/N (worker/JOB@LINK/N for a
	// link worker), node/ID, dc/NAME, link/JOB@LINK, tenant/NAME.
	Object string `json:"object"`
	Reason string `json:"reason,omitempty"`
	// The fields events are filtered by; each is set when the event concerns it.
	Job    string `json:"job,omitempty"`
	Tenant string `json:"tenant,omitempty"`
	Link   string `json:"link,omitempty"`
	Worker *int   `json:"worker,omitempty"`
	Node   string `json:"node,omitempty"`
	DC     string `json:"dc,omitempty"`
	// To and ToDC are where a moved worker goes.
	To   string `json:"to,omitempty"`
	ToDC string `json:"toDc,omitempty"`
	// Principal made the API call of an api.call event: admin or tenant/NAME.
	Principal string `json:"principal,omitempty"`
	// Master is the master that recorded the event.
	Master string `json:"master,omitempty"`
}

// Event kinds.
const (
	EventJobSubmitted = "job.submitted"
	EventJobUpdated   = "job.updated" // a new generation of the spec
	EventJobScaled    = "job.scaled"
	EventJobKilled    = "job.killed"
	EventJobRemoved   = "job.removed" // every worker stopped, the record gone

	// Autoscaling (a job's scaling: block): a change with the numbers behind it, a change
	// the policy wants but may not make (max, min, cooldown, quota, no room), a round in
	// which nothing can be decided (no data, a change under way), a pause and a resume.
	EventJobAutoscaled       = "job.autoscaled"
	EventJobAutoscaleRefused = "job.autoscale-refused"
	EventJobAutoscaleHeld    = "job.autoscale-held"
	EventJobAutoscalePaused  = "job.autoscale-paused"
	EventJobAutoscaleResumed = "job.autoscale-resumed"

	// A provisioned cluster's autoscaler (`stormdock cluster autoscale`): nodes added or
	// removed, and a change it wants and may not make. It records them through POST
	// /v1/events with the admin token: the only kinds that may be recorded so.
	EventClusterAutoscaled       = "cluster.autoscaled"
	EventClusterAutoscaleRefused = "cluster.autoscale-refused"

	EventRolloutStep     = "rollout.step" // a batch admitted, a canary held, done, paused...
	EventRolloutFailed   = "rollout.failed"
	EventRolloutReverted = "rollout.reverted"

	EventWorkerPlaced    = "worker.placed"
	EventWorkerStarted   = "worker.started"
	EventWorkerExited    = "worker.exited" // ended unasked: code, signal, OOM
	EventWorkerRestarted = "worker.restarted"
	EventWorkerCrashLoop = "worker.crash-looping"
	EventWorkerFailed    = "worker.failed" // could not be started (image pull, bad command)
	EventWorkerEvicted   = "worker.evicted"
	EventWorkerMoved     = "worker.moved"
	EventWorkerStopped   = "worker.stopped" // scaled in or its job killed
	EventWorkerUnplaced  = "worker.unplaced"
	EventWorkerRolledOut = "worker.rolled-out" // replaced by a new generation (rolling updates)
	EventNodeRegistered  = "node.registered"
	EventNodeLost        = "node.lost"
	EventNodeBack        = "node.back"
	EventNodeThrottled   = "node.throttled"
	EventNodeUnhealthy   = "node.unhealthy"
	EventNodeHealthy     = "node.healthy"
	EventNodeDrained     = "node.drained"
	EventNodeUndrained   = "node.undrained"
	EventNodeAvoidEnded  = "node.avoid-ended" // a node avoided for a job's crash loops takes its workers again
	EventDCLost          = "dc.lost"
	EventDCFailed        = "dc.failed"
	EventDCRestored      = "dc.restored"
	EventLinkFailover    = "link.failover"
	EventMasterLeading   = "master.leading"
	EventAPICall         = "api.call"       // a change made through the API, with its principal
	EventEventsDropped   = "events.dropped" // events a master could not record in time
	EventRolloutPrefix   = "rollout."       // rollouts (rolling updates) name their own kinds
)

// EventKinds lists the kinds above, for documentation and tests.
func EventKinds() []string {
	return []string{EventJobSubmitted, EventJobUpdated, EventJobScaled, EventJobKilled, EventJobRemoved,
		EventJobAutoscaled, EventJobAutoscaleRefused, EventJobAutoscaleHeld, EventJobAutoscalePaused, EventJobAutoscaleResumed,
		EventClusterAutoscaled, EventClusterAutoscaleRefused,
		EventWorkerPlaced, EventWorkerStarted, EventWorkerExited, EventWorkerRestarted, EventWorkerCrashLoop,
		EventWorkerFailed, EventWorkerEvicted, EventWorkerMoved, EventWorkerStopped, EventWorkerUnplaced,
		EventNodeRegistered, EventNodeLost, EventNodeBack, EventNodeThrottled, EventNodeUnhealthy, EventNodeHealthy,
		EventNodeDrained, EventNodeUndrained, EventNodeAvoidEnded, EventDCLost, EventDCFailed, EventDCRestored, EventLinkFailover,
		EventMasterLeading, EventAPICall, EventEventsDropped}
}

// EventFilter selects events: every field set must match. An empty filter takes all.
type EventFilter struct {
	Job  string // the job, its output routers included
	Node string // where it happened, or where a moved worker went
	DC   string
	// Kinds takes events of these kinds; one ending in "." takes every kind it starts
	// (node. is node.lost, node.back, ...). Empty takes every kind.
	Kinds []string
	// Since takes events at or after this time; After takes events with a larger ID.
	Since time.Time
	After int64
	// Tenant, when set, keeps the tenant's jobs' events alone (a tenant's token sees only
	// these).
	Tenant string
}

// Match reports whether the filter takes e.
func (f EventFilter) Match(e *Event) bool {
	switch {
	case e.ID <= f.After:
		return false
	case !f.Since.IsZero() && e.Time.Before(f.Since):
		return false
	case f.Tenant != "" && e.Tenant != f.Tenant:
		return false
	case f.Job != "" && e.Job != f.Job && e.Job != f.Job+".router":
		return false
	case f.Node != "" && e.Node != f.Node && e.To != f.Node:
		return false
	case f.DC != "" && e.DC != f.DC && e.ToDC != f.DC:
		return false
	case len(f.Kinds) > 0 && !slices.ContainsFunc(f.Kinds, func(k string) bool { return kindMatch(k, e.Kind) }):
		return false
	}
	return true
}

func kindMatch(want, kind string) bool {
	if strings.HasSuffix(want, ".") {
		return strings.HasPrefix(kind, want)
	}
	return kind == want
}

// ParseKinds reads a kind filter: kinds or kind prefixes ending in "." (worker.), separated by
// commas.
func ParseKinds(s string) ([]string, error) {
	var out []string
	for k := range strings.SplitSeq(s, ",") {
		k = strings.TrimSpace(k)
		if k == "" {
			continue
		}
		ok := IsEventKind(k)
		if strings.HasSuffix(k, ".") {
			ok = slices.ContainsFunc(append(EventKinds(), EventRolloutStep), func(kind string) bool { return strings.HasPrefix(kind, k) })
		}
		if !ok {
			return nil, fmt.Errorf("%w: kind %q: want an event kind (node.lost) or the start of some ending in a dot (node.): see `stormdock events --help`", ErrBadInput, k)
		}
		out = append(out, k)
	}
	return out, nil
}

// IsEventKind reports whether kind is one of EventKinds or a rollout's.
func IsEventKind(kind string) bool {
	return slices.Contains(EventKinds(), kind) || len(kind) > len(EventRolloutPrefix) && kind[:len(EventRolloutPrefix)] == EventRolloutPrefix
}
