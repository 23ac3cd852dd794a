// Package autoscale decides a job's worker count from its metrics' history and its scaling
// policy: pure (no I/O, no clock of its own), so that every decision can be replayed.
package autoscale

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/stormdock/stormdock/cluster"
)

// How a decision is made, each evaluation (every collection round, on the leader):
//
//   - Each round of the history proposes a worker count: the proportional one,
//     ceil(W * v / target) for a value v per worker (the target-value rule of Nomad's
//     autoscaler and the HPA), and, once the job's capacity is known, a floor that keeps its
//     throughput within Headroom of what the proposed workers can process:
//     ceil(throughput / (capacity * Headroom)). The capacity (records per second one worker
//     processes) is learned whenever the metric is above target, when the workers are busy
//     by definition: throughput / workers then. The floor is what keeps a backlog-like metric
//     (near zero whenever there are enough workers, whatever the load) from proposing the
//     minimum at every quiet moment and flapping.
//   - Out: when the newest value is above target (by more than Tolerance), the newest
//     proposal, unless within CooldownUp of the policy's last change.
//   - In: when every proposal of the stabilization window is below the current count, the
//     highest of them, unless within CooldownDown.
//   - Bounded by min, max and maxStep; nothing at all (a hold, said why) while the metric
//     has no value, while not every running worker reports it, while a change is under way.

// Tolerance is how far from target the value may be without a change (HPA's default).
const Tolerance = 0.1

// Headroom is the share of their capacity the workers' throughput may use in a proposal.
const Headroom = 0.9

// Series is one series of a job over the last rounds, oldest first; NaN where missing. N
// counts the workers that gave a value in each round.
type Series struct {
	Sum []float64
	N   []int
}

func (s Series) last() (float64, int, bool) {
	if len(s.Sum) == 0 || math.IsNaN(s.Sum[len(s.Sum)-1]) {
		return 0, 0, false
	}
	return s.Sum[len(s.Sum)-1], s.N[len(s.N)-1], true
}

// Input is what one evaluation of one job sees.
type Input struct {
	Now    time.Time
	Policy cluster.ScalingPolicy
	// Workers is the job's worker count (per link for a mirrored job); Links how many
	// copies run (1 for others).
	Workers, Links int
	// Running counts its workers running, over all links; Unplaced those no node takes;
	// Settled is false while workers are being started or stopped, or a rollout runs.
	Running, Unplaced int
	Settled           bool
	Rolling           bool
	// Step is the history's resolution; Metric the policy's metric over the rounds (the
	// last ones, covering at least the stabilization window), Throughput the job's.
	Step       time.Duration
	Metric     Series
	Throughput Series
	// Last is when the policy last changed the count (zero: never).
	Last time.Time
	// Capacity is the per-worker throughput learned before (0: unknown).
	Capacity float64
}

// Kinds of Decision.
const (
	Scale  = "scale"  // change the count to To
	Refuse = "refuse" // the policy wants a change it may not make now: said why, with numbers
	Hold   = "hold"   // nothing can be decided: said why
	Steady = "steady" // nothing to do
)

// Decision is one evaluation's outcome.
type Decision struct {
	Kind string
	// To is the count to scale to; Want what the policy proposed before its bounds.
	To, Want int
	// Value is the metric per worker now; Reason says it all in one line.
	Value  float64
	Reason string
	// Class groups refusals and holds of the same cause, so that the caller reports a
	// cause once, not every round.
	Class string
	// Capacity is the per-worker throughput as learned now (0: unknown).
	Capacity float64
}

// Evaluate makes the decision for in.
func Evaluate(in Input) Decision {
	p := in.Policy
	links := max(in.Links, 1)
	d := Decision{Kind: Steady, To: in.Workers, Want: in.Workers, Capacity: in.learn()}
	v, n, ok := in.Metric.last()
	switch {
	case in.Rolling:
		return hold(d, "rolling", "a rollout is under way: nothing decided until it is done")
	case !ok:
		return hold(d, "nodata", fmt.Sprintf("no value of %s in the last round: no worker serves it (yet?), so nothing is decided", p.Metric))
	case n == 0:
		return hold(d, "nodata", fmt.Sprintf("no worker reports %s: nothing decided", p.Metric))
	case n < in.Running:
		return hold(d, "partial", fmt.Sprintf("%d of %d running workers report %s: nothing decided until every one does", n, in.Running, p.Metric))
	case !in.Settled:
		return hold(d, "settling", fmt.Sprintf("the last change is under way (%d of %d workers running): nothing decided", in.Running, in.Workers*links))
	}
	per := v / float64(n)
	d.Value = per
	cur := in.Workers
	// Out of the policy's range (a manual scale before a resume, an update): back in.
	if cur < p.Min || cur > p.Max {
		to := min(max(cur, p.Min), p.Max)
		d.Kind, d.To, d.Want = Scale, to, to
		d.Reason = fmt.Sprintf("%d workers is outside the policy's %d..%d: %d -> %d", cur, p.Min, p.Max, cur, to)
		return d
	}
	propose := func(i int) (int, bool) {
		sum, cnt := in.Metric.Sum[i], in.Metric.N[i]
		if math.IsNaN(sum) || cnt == 0 {
			return 0, false
		}
		want := int(math.Ceil(float64(cur) * (sum / float64(cnt)) / p.Target))
		if r := sum / float64(cnt) / p.Target; math.Abs(r-1) <= Tolerance {
			want = cur
		}
		if d.Capacity > 0 && i < len(in.Throughput.Sum) && !math.IsNaN(in.Throughput.Sum[i]) {
			floor := int(math.Ceil(in.Throughput.Sum[i] / float64(links) / (d.Capacity * Headroom)))
			want = max(want, floor)
		}
		return want, true
	}
	last := len(in.Metric.Sum) - 1
	now, _ := propose(last)
	if per > p.Target*(1+Tolerance) {
		d.Want = max(now, cur+1)
		to := min(d.Want, p.Max)
		if p.MaxStep > 0 {
			to = min(to, cur+p.MaxStep)
		}
		why := fmt.Sprintf("%s %.4g per worker over target %g (%d workers)", p.Metric, per, p.Target, cur)
		switch {
		case cur >= p.Max:
			return refuse(d, fmt.Sprintf("max:%d", d.Want), fmt.Sprintf("%s: wants %d workers, but max is %d", why, d.Want, p.Max))
		case in.Unplaced > 0:
			return refuse(d, "room", fmt.Sprintf("%s: wants %d workers, but %d of its workers find no room already", why, d.Want, in.Unplaced))
		case !in.Last.IsZero() && in.Now.Sub(in.Last) < p.Up():
			return refuse(d, "cooldown-up", fmt.Sprintf("%s: wants %d workers, in cooldown (scaled %s ago, cooldownUp %s)",
				why, d.Want, in.Now.Sub(in.Last).Round(time.Second), p.Up()))
		}
		d.Kind, d.To = Scale, to
		d.Reason = fmt.Sprintf("%s: %d -> %d workers", why, cur, to)
		if to < d.Want {
			d.Reason += fmt.Sprintf(" (wants %d: bounded by max %d, maxStep %d)", d.Want, p.Max, p.MaxStep)
		}
		return d
	}
	// In: every proposal of the window below the count.
	rounds := int(p.Window() / max(in.Step, time.Millisecond))
	if rounds < 1 {
		rounds = 1
	}
	if rounds > len(in.Metric.Sum) {
		return d // the history does not reach back a whole window yet
	}
	highest, seen := 0, 0
	for i := last - rounds + 1; i <= last; i++ {
		want, ok := propose(i)
		if !ok {
			continue
		}
		seen++
		highest = max(highest, want)
	}
	// Gaps (a round that read no node) are forgiven; a window mostly without data is not
	// a window in which every proposal agreed.
	if seen*5 < rounds*4 || highest >= cur {
		return d
	}
	d.Want = highest
	to := max(highest, p.Min)
	if p.MaxStep > 0 {
		to = max(to, cur-p.MaxStep)
	}
	why := fmt.Sprintf("%s %.4g per worker under target %g for %s", p.Metric, per, p.Target, p.Window())
	if d.Capacity > 0 {
		why += fmt.Sprintf(" (throughput fits %d workers of %.4g/s)", highest, d.Capacity)
	}
	switch {
	case cur <= p.Min:
		return refuse(d, "min", fmt.Sprintf("%s: wants %d workers, but min is %d", why, highest, p.Min))
	case !in.Last.IsZero() && in.Now.Sub(in.Last) < p.Down():
		return refuse(d, "cooldown-down", fmt.Sprintf("%s: wants %d workers, in cooldown (scaled %s ago, cooldownDown %s)",
			why, highest, in.Now.Sub(in.Last).Round(time.Second), p.Down()))
	}
	d.Kind, d.To = Scale, to
	d.Reason = fmt.Sprintf("%s: %d -> %d workers", why, cur, to)
	return d
}

// Transient reports whether a hold's class is one every change goes through for a round or
// two: workers starting, new workers not reporting the metric yet.
func Transient(class string) bool { return class == "partial" || class == "settling" }

func hold(d Decision, class, reason string) Decision {
	d.Kind, d.Class, d.Reason = Hold, class, reason
	return d
}

func refuse(d Decision, class, reason string) Decision {
	d.Kind, d.Class, d.Reason = Refuse, class, reason
	return d
}

// learn is the per-worker capacity: the median throughput per worker over the rounds whose
// metric was above target (the workers busy), or what was learned before.
func (in Input) learn() float64 {
	var seen []float64
	for i := range in.Metric.Sum {
		sum, n := in.Metric.Sum[i], in.Metric.N[i]
		if math.IsNaN(sum) || n == 0 || sum/float64(n) <= in.Policy.Target*(1+Tolerance) {
			continue
		}
		if i >= len(in.Throughput.Sum) || math.IsNaN(in.Throughput.Sum[i]) || in.Throughput.N[i] == 0 {
			continue
		}
		if c := in.Throughput.Sum[i] / float64(in.Throughput.N[i]); c > 0 {
			seen = append(seen, c)
		}
	}
	if len(seen) == 0 {
		return in.Capacity
	}
	slices.Sort(seen)
	return seen[len(seen)/2]
}
