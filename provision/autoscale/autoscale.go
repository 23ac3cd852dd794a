// Package autoscale keeps a provisioned cluster's node count between a minimum and a
// maximum: nodes are added for workers that wait for room, and idle nodes drained and removed.
package autoscale

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
)

// Policy is a cluster's autoscaling (`stormdock cluster autoscale NAME --min N --max M`, or
// a policy file with these fields).
type Policy struct {
	Min int `json:"min" yaml:"min"`
	Max int `json:"max" yaml:"max"`
	// Grace is how long workers may wait for room (unplaced for want of a slot, memory or
	// cpu) before nodes are added for them. Default DefaultGrace.
	Grace cluster.Duration `json:"grace,omitempty" yaml:"grace,omitempty"`
	// IdleBelow is the share of a node's slots in use at or under which it counts as idle;
	// IdleFor how long it must stay so before it is drained and removed. Defaults
	// DefaultIdleBelow and DefaultIdleFor.
	IdleBelow float64          `json:"idleBelow,omitempty" yaml:"idleBelow,omitempty"`
	IdleFor   cluster.Duration `json:"idleFor,omitempty" yaml:"idleFor,omitempty"`
	// Cooldown is how long after a change the next may come. Default DefaultCooldown.
	Cooldown cluster.Duration `json:"cooldown,omitempty" yaml:"cooldown,omitempty"`
	// Interval is how often the cluster is looked at. Default DefaultInterval.
	Interval cluster.Duration `json:"interval,omitempty" yaml:"interval,omitempty"`
	// MaxStep bounds the nodes one change adds or removes; 0 means no bound.
	MaxStep int `json:"maxStep,omitempty" yaml:"maxStep,omitempty"`
}

// Defaults of Policy.
const (
	DefaultGrace     = 30 * time.Second
	DefaultIdleBelow = 0.0
	DefaultIdleFor   = 5 * time.Minute
	DefaultCooldown  = time.Minute
	DefaultInterval  = 10 * time.Second
)

// WithDefaults returns the policy with its durations set.
func (p Policy) WithDefaults() Policy {
	for _, d := range []struct {
		v   *cluster.Duration
		def time.Duration
	}{{&p.Grace, DefaultGrace}, {&p.IdleFor, DefaultIdleFor}, {&p.Cooldown, DefaultCooldown}, {&p.Interval, DefaultInterval}} {
		if *d.v == 0 {
			*d.v = cluster.Duration(d.def)
		}
	}
	return p
}

// Validate says every problem of the policy at once.
func (p Policy) Validate() error {
	var ps []string
	if p.Min < 1 {
		ps = append(ps, "min must be at least 1 (destroy the cluster to have none)")
	}
	if p.Max < p.Min {
		ps = append(ps, fmt.Sprintf("max %d must be at least min %d", p.Max, p.Min))
	}
	if p.IdleBelow < 0 || p.IdleBelow >= 1 || math.IsNaN(p.IdleBelow) {
		ps = append(ps, "idleBelow must be a share of the slots, at least 0 and below 1")
	}
	for name, d := range map[string]cluster.Duration{"grace": p.Grace, "idleFor": p.IdleFor, "cooldown": p.Cooldown} {
		if d < 0 {
			ps = append(ps, name+" must not be negative")
		}
	}
	if p.Interval < 0 || p.Interval > 0 && p.Interval.Std() < 100*time.Millisecond {
		ps = append(ps, "interval must be at least 100ms")
	}
	if p.MaxStep < 0 {
		ps = append(ps, "maxStep must not be negative (0 means no bound)")
	}
	if len(ps) > 0 {
		slices.Sort(ps)
		return fmt.Errorf("invalid cluster autoscaling policy: %s", strings.Join(ps, "; "))
	}
	return nil
}

// ParsePolicy reads a policy file (YAML or JSON) strictly and checks it.
func ParsePolicy(data []byte) (Policy, error) {
	var p Policy
	if err := cluster.Decode(data, &p, "cluster autoscaling policy"); err != nil {
		return p, err
	}
	return p, p.Validate()
}

// Node is one agent as the controller sees it: its place among the provider's agents (the
// provider removes the highest indexes first) and the master's view of it.
type Node struct {
	ID       string
	DC, Rack string
	Slots    int
	Used     int
	// Schedulable is false for a node that takes no work (draining, unhealthy, lost).
	Schedulable bool
	// Jobs are the jobs with workers on it and the failure domains each spreads over.
	Jobs map[string][]string
}

// Observation is the cluster at one look.
type Observation struct {
	Now time.Time
	// Nodes are the cluster's agents in the provider's order (index 0 first); a node the
	// master does not know yet has Slots 0.
	Nodes []Node
	// SlotsPerNode is what a new node brings.
	SlotsPerNode int
	// WaitingForRoom counts workers unplaced for want of room (a slot, memory or cpu, or a
	// job's maxPerNode), Unplaced every unplaced worker.
	WaitingForRoom, Unplaced int
}

// State is what the controller remembers between looks.
type State struct {
	// WaitingSince is when workers began to wait for room (zero: none waits).
	WaitingSince time.Time
	// IdleSince is when each node last became idle, by id.
	IdleSince map[string]time.Time
	// Last is when the last change was made.
	Last time.Time
}

// Decision kinds.
const (
	Add    = "add"
	Remove = "remove"
	Refuse = "refuse" // a change is wanted and may not be made: Reason says why
	Steady = "steady"
)

// Decision is one look's outcome: To nodes (from From), with the reason and its numbers.
type Decision struct {
	Kind     string
	From, To int
	Reason   string
	// Class groups refusals of the same cause, reported once.
	Class string
	// Remove names the nodes a removal takes (the highest indexes).
	Remove []string
}

// Decide makes the decision for obs and updates st (the waiting and idle clocks).
func Decide(p Policy, st *State, obs Observation) Decision {
	p = p.WithDefaults()
	cur := len(obs.Nodes)
	d := Decision{Kind: Steady, From: cur, To: cur}
	if st.IdleSince == nil {
		st.IdleSince = map[string]time.Time{}
	}
	if obs.WaitingForRoom > 0 {
		if st.WaitingSince.IsZero() {
			st.WaitingSince = obs.Now
		}
	} else {
		st.WaitingSince = time.Time{}
	}
	seen := map[string]bool{}
	for _, n := range obs.Nodes {
		seen[n.ID] = true
		if idle(p, n) {
			if _, ok := st.IdleSince[n.ID]; !ok {
				st.IdleSince[n.ID] = obs.Now
			}
		} else {
			delete(st.IdleSince, n.ID)
		}
	}
	for id := range st.IdleSince {
		if !seen[id] {
			delete(st.IdleSince, id)
		}
	}
	cooling := !st.Last.IsZero() && obs.Now.Sub(st.Last) < p.Cooldown.Std()
	// Out of range (a cluster created or scaled by hand outside min..max): back in.
	if cur < p.Min || cur > p.Max {
		to := min(max(cur, p.Min), p.Max)
		d.Kind, d.To = Add, to
		if to < cur {
			d.Kind = Remove
			for _, n := range obs.Nodes[to:] {
				d.Remove = append(d.Remove, n.ID)
			}
		}
		d.Reason = fmt.Sprintf("%d nodes is outside the policy's %d..%d: %d -> %d", cur, p.Min, p.Max, cur, to)
		return d
	}
	if obs.WaitingForRoom > 0 {
		waited := obs.Now.Sub(st.WaitingSince)
		if waited < p.Grace.Std() {
			return d
		}
		per := max(obs.SlotsPerNode, 1)
		want := cur + (obs.WaitingForRoom+per-1)/per
		to := min(want, p.Max)
		if p.MaxStep > 0 {
			to = min(to, cur+p.MaxStep)
		}
		why := fmt.Sprintf("%d workers wait for room for %s (grace %s)", obs.WaitingForRoom, waited.Round(time.Second), p.Grace)
		switch {
		case cur >= p.Max:
			d.Kind, d.Class, d.Reason = Refuse, "max", fmt.Sprintf("%s: want %d nodes of %d slots, but max is %d", why, want, per, p.Max)
		case cooling:
			d.Kind, d.Class, d.Reason = Refuse, "cooldown", fmt.Sprintf("%s: want %d nodes, in cooldown (changed %s ago, cooldown %s)", why, want, obs.Now.Sub(st.Last).Round(time.Second), p.Cooldown)
		default:
			d.Kind, d.To = Add, to
			d.Reason = fmt.Sprintf("%s: %d -> %d nodes of %d slots", why, cur, to, per)
		}
		return d
	}
	if obs.Unplaced > 0 || cur <= p.Min || cooling {
		return d // workers wait for something nodes do not give: nothing is removed now
	}
	// In: the highest indexes that have been idle long enough, as long as what they run
	// fits on the others and no job loses a failure domain it spreads over.
	n := 0
	for i := cur - 1; i >= p.Min; i-- {
		since, ok := st.IdleSince[obs.Nodes[i].ID]
		if !ok || obs.Now.Sub(since) < p.IdleFor.Std() {
			break
		}
		if p.MaxStep > 0 && n >= p.MaxStep {
			break
		}
		if why := safe(obs.Nodes[:i], obs.Nodes[i:]); why != "" {
			d.Kind, d.Class = Refuse, "unsafe:"+obs.Nodes[i].ID
			d.Reason = fmt.Sprintf("node %s is idle for %s, but %s: it stays", obs.Nodes[i].ID, obs.Now.Sub(since).Round(time.Second), why)
			if n == 0 {
				return d
			}
			break
		}
		n++
	}
	if n == 0 {
		return d
	}
	d.Kind, d.To = Remove, cur-n
	for _, node := range obs.Nodes[cur-n:] {
		d.Remove = append(d.Remove, node.ID)
	}
	d.Reason = fmt.Sprintf("%s idle (at most %.0f%% of slots used) for %s: drained and removed, %d -> %d nodes",
		strings.Join(d.Remove, ", "), p.IdleBelow*100, p.IdleFor, cur, cur-n)
	return d
}

func idle(p Policy, n Node) bool {
	if n.Slots == 0 {
		return false // not registered yet: not idle, new
	}
	return float64(n.Used) <= p.IdleBelow*float64(n.Slots)
}

// safe says why removing gone would leave a worker without room on keep, or a job without a
// failure domain it spreads over; "" when it would not.
func safe(keep, gone []Node) string {
	free, moving := 0, 0
	for _, n := range keep {
		if n.Schedulable {
			free += max(n.Slots-n.Used, 0)
		}
	}
	for _, n := range gone {
		moving += n.Used
	}
	if moving > free {
		return fmt.Sprintf("its %d workers would not fit on the other nodes (%d free slots)", moving, free)
	}
	for _, g := range gone {
		for _, job := range slices.Sorted(maps.Keys(g.Jobs)) {
			for _, domain := range g.Jobs[job] {
				var mine string
				switch domain {
				case cluster.DomainDC:
					mine = g.DC
				case cluster.DomainRack:
					mine = g.DC + "/" + g.Rack
				default:
					continue
				}
				if !slices.ContainsFunc(keep, func(n Node) bool {
					return n.Schedulable && (domain == cluster.DomainDC && n.DC == g.DC || domain == cluster.DomainRack && n.DC+"/"+n.Rack == mine)
				}) {
					return fmt.Sprintf("job %s spreads over %ss and %s would have no other node", job, domain, mine)
				}
			}
		}
	}
	return ""
}

// roomReasons are the placement engine's words for a node that lacks room (see
// placement's rejectText): a worker unplaced for these alone waits for nodes.
var roomReasons = []string{"no free slot", "not enough memory", "not enough cpu", "maxPerNode"}

// ForRoom reports whether an unplaced worker's reason ("0 of 3 nodes fit: no free slot (2),
// node draining (1)") is only a want of room, which more nodes would give.
func ForRoom(reason string) bool {
	_, list, ok := strings.Cut(reason, "nodes fit: ")
	if !ok {
		return false
	}
	for _, part := range strings.Split(list, ", ") {
		part = strings.TrimSpace(part)
		if i := strings.LastIndex(part, " ("); i >= 0 {
			part = part[:i]
		}
		if !slices.ContainsFunc(roomReasons, func(r string) bool { return strings.HasPrefix(part, r) }) && part != "node draining" {
			return false
		}
	}
	return true
}

// event is the decision as a cluster event for the master's log.
func (d Decision) event(name string) api.Event {
	kind := api.EventClusterAutoscaled
	if d.Kind == Refuse {
		kind = api.EventClusterAutoscaleRefused
	}
	return api.Event{Kind: kind, Object: "cluster/" + name, Reason: d.Reason}
}

// String is the policy in one line, for logs.
func (p Policy) String() string {
	b, _ := json.Marshal(p)
	return string(b)
}
