package autoscale

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
)

var nan = math.NaN()

func flat(v float64, n, rounds int) Series {
	s := Series{Sum: make([]float64, rounds), N: make([]int, rounds)}
	for i := range s.Sum {
		s.Sum[i], s.N[i] = v, n
	}
	return s
}

func policy() cluster.ScalingPolicy {
	return cluster.ScalingPolicy{Min: 2, Max: 10, Metric: "input_backlog", Target: 100,
		CooldownUp: cluster.Duration(30 * time.Second), CooldownDown: cluster.Duration(time.Minute), Stabilization: cluster.Duration(time.Minute)}
}

func TestEvaluate(t *testing.T) {
	now := time.Unix(1e9, 0)
	base := func() Input {
		return Input{Now: now, Policy: policy(), Workers: 4, Links: 1, Running: 4, Settled: true, Step: 10 * time.Second,
			Metric: flat(400, 4, 7), Throughput: flat(40, 4, 7)}
	}
	for _, tc := range []struct {
		name   string
		change func(*Input)
		kind   string
		to     int
		reason string // a substring
	}{
		{"at target", func(in *Input) {}, Steady, 4, ""},
		{"within tolerance", func(in *Input) { in.Metric = flat(430, 4, 7) }, Steady, 4, ""},
		{"over target", func(in *Input) { in.Metric = flat(1200, 4, 7) }, Scale, 12 - 2, "300 per worker over target 100 (4 workers): 4 -> 10"},
		{"over target, maxStep", func(in *Input) { in.Metric = flat(1200, 4, 7); in.Policy.MaxStep = 2 }, Scale, 6, "wants 12"},
		{"over target at max", func(in *Input) { in.Metric = flat(1200, 4, 7); in.Workers, in.Policy.Max = 4, 4 }, Refuse, 4, "but max is 4"},
		{"over target in cooldown", func(in *Input) { in.Metric = flat(1200, 4, 7); in.Last = now.Add(-10 * time.Second) }, Refuse, 4, "cooldown (scaled 10s ago, cooldownUp 30s)"},
		{"over target, no room", func(in *Input) { in.Metric = flat(1200, 4, 7); in.Unplaced = 1; in.Running = 4 }, Refuse, 4, "find no room"},
		{"under target for the window", func(in *Input) { in.Metric = flat(100, 4, 7) }, Scale, 2, "under target 100 for 1m0s: 4 -> 2"},
		{"under target, maxStep", func(in *Input) { in.Metric = flat(0, 4, 7); in.Policy.MaxStep = 1 }, Scale, 3, ""},
		{"under target, one round disagrees", func(in *Input) { in.Metric = flat(100, 4, 7); in.Metric.Sum[2] = 400 }, Steady, 4, ""},
		{"under target in cooldown", func(in *Input) { in.Metric = flat(100, 4, 7); in.Last = now.Add(-30 * time.Second) }, Refuse, 4, "cooldownDown 1m0s"},
		{"under target at min", func(in *Input) { in.Metric = flat(0, 2, 7); in.Workers, in.Running = 2, 2 }, Refuse, 2, "but min is 2"},
		{"history shorter than the window", func(in *Input) { in.Metric = flat(0, 4, 3) }, Steady, 4, ""},
		{"window mostly missing", func(in *Input) {
			in.Metric = flat(0, 4, 7)
			for i := 0; i < 5; i++ {
				in.Metric.Sum[i] = nan
			}
		}, Steady, 4, ""},
		// The capacity floor: a backlog near zero does not scale in a job whose throughput
		// needs its workers. 40/s at 10/s per worker (learned) needs 40/9 -> 5 workers.
		{"backlog zero, throughput needs the workers", func(in *Input) {
			in.Metric, in.Throughput, in.Capacity, in.Workers, in.Running = flat(0, 5, 7), flat(40, 5, 7), 10, 5, 5
		}, Steady, 5, ""},
		{"backlog zero, throughput fell", func(in *Input) {
			in.Metric, in.Throughput, in.Capacity, in.Workers, in.Running = flat(0, 5, 7), flat(8, 5, 7), 10, 5, 5
		}, Scale, 2, "throughput fits 1 workers"},
		{"no data", func(in *Input) { in.Metric = flat(nan, 0, 7) }, Hold, 4, "no worker serves it"},
		{"metric stops", func(in *Input) { in.Metric.Sum[6] = nan }, Hold, 4, "no value of input_backlog"},
		{"not every worker reports", func(in *Input) { in.Metric.N[6] = 3 }, Hold, 4, "3 of 4 running workers report"},
		{"a change under way", func(in *Input) { in.Settled, in.Running = false, 3 }, Hold, 4, "under way (3 of 4"},
		{"a rollout", func(in *Input) { in.Rolling = true }, Hold, 4, "rollout"},
		{"out of range after a manual scale", func(in *Input) { in.Workers, in.Running = 14, 14; in.Metric = flat(1400, 14, 7) }, Scale, 10, "outside the policy's 2..10"},
		{"mirrored: per link", func(in *Input) {
			in.Links, in.Running = 2, 8
			in.Metric = flat(2400, 8, 7) // 300 per worker
		}, Scale, 10, "4 -> 10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := base()
			tc.change(&in)
			d := Evaluate(in)
			if d.Kind != tc.kind || d.To != tc.to || !strings.Contains(d.Reason, tc.reason) {
				t.Errorf("got %s to %d: %q\nwant %s to %d: %q", d.Kind, d.To, d.Reason, tc.kind, tc.to, tc.reason)
			}
			if (d.Kind == Hold || d.Kind == Refuse) && d.Class == "" {
				t.Errorf("a %s without a class", d.Kind)
			}
		})
	}
}

// TestEvaluateBounds: whatever the history holds (NaN, zeros, huge values, partial counts),
// a decision never leaves min..max, never moves by more than maxStep (but back into range),
// never scales without every running worker's value in the last round, and never to 0.
func TestEvaluateBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	values := []float64{nan, 0, 1, 99, 100, 101, 1e9, math.Inf(1)}
	for i := 0; i < 20000; i++ {
		p := policy()
		p.Min = 1 + r.IntN(5)
		p.Max = p.Min + r.IntN(10)
		p.MaxStep = r.IntN(3)
		workers := 1 + r.IntN(20)
		rounds := 1 + r.IntN(12)
		in := Input{Now: time.Unix(1e9, 0), Policy: p, Workers: workers, Links: 1 + r.IntN(2), Running: workers, Settled: r.IntN(4) > 0,
			Step: 10 * time.Second, Metric: Series{Sum: make([]float64, rounds), N: make([]int, rounds)},
			Throughput: Series{Sum: make([]float64, rounds), N: make([]int, rounds)}, Capacity: []float64{0, 5, 10}[r.IntN(3)]}
		in.Running *= in.Links
		for k := range rounds {
			in.Metric.Sum[k], in.Metric.N[k] = values[r.IntN(len(values))], r.IntN(in.Running+1)
			in.Throughput.Sum[k], in.Throughput.N[k] = values[r.IntN(len(values))], r.IntN(in.Running+1)
		}
		if r.IntN(3) == 0 {
			in.Last = in.Now.Add(-time.Duration(r.IntN(120)) * time.Second)
		}
		d := Evaluate(in)
		if d.Kind != Scale {
			if d.To != workers {
				t.Fatalf("case %d: %s with To %d != %d", i, d.Kind, d.To, workers)
			}
			continue
		}
		last, lastN := in.Metric.Sum[rounds-1], in.Metric.N[rounds-1]
		outside := workers < p.Min || workers > p.Max
		switch {
		case d.To < p.Min || d.To > p.Max || d.To < 1:
			t.Fatalf("case %d: scaled to %d outside %d..%d (%+v)", i, d.To, p.Min, p.Max, d)
		case d.To == workers:
			t.Fatalf("case %d: a scale to the same count %d", i, workers)
		case math.IsNaN(last) || lastN < in.Running || !in.Settled:
			t.Fatalf("case %d: scaled with last value %v from %d of %d workers (settled %v)", i, last, lastN, in.Running, in.Settled)
		case !outside && p.MaxStep > 0 && (d.To-workers > p.MaxStep || workers-d.To > p.MaxStep):
			t.Fatalf("case %d: %d -> %d beyond maxStep %d", i, workers, d.To, p.MaxStep)
		}
	}
}

// sim is a word count: lines arrive at rate per second; each worker processes at most
// capacity per second; the backlog is what arrived and was not processed. The metrics a
// round sees are its state at the round's end; a change of the worker count takes effect
// delay rounds later (workers start, rescan the input).
type sim struct {
	capacity float64
	backlog  float64
	workers  int
	running  int
	pending  []int // counts in flight, by rounds until they run
}

func (s *sim) round(rate float64, step time.Duration) (backlog, throughput float64) {
	if len(s.pending) > 0 {
		s.pending = s.pending[1:]
		if len(s.pending) == 0 {
			s.running = s.workers
		}
	}
	dt := step.Seconds()
	can := float64(s.running) * s.capacity * dt
	arrived := rate * dt
	done := math.Min(can, s.backlog+arrived)
	s.backlog += arrived - done
	return s.backlog, done / dt
}

// TestSimulatedStep: a job driven through a load step of 5x, a long steady stretch and a
// step back, with the history the masters would keep: it scales out until the backlog is
// back under target, makes no decision at all while the load is steady (no flapping), and
// scales back in when the load falls. The capacity is unknown at the start and learned.
func TestSimulatedStep(t *testing.T) {
	const step = time.Second
	p := cluster.ScalingPolicy{Min: 2, Max: 20, Metric: "input_backlog", Target: 20,
		CooldownUp: cluster.Duration(10 * time.Second), CooldownDown: cluster.Duration(20 * time.Second), Stabilization: cluster.Duration(15 * time.Second)}
	s := &sim{capacity: 10, workers: 2, running: 2}
	var hist, tput Series
	var last time.Time
	capacity := 0.0
	now := time.Unix(1e9, 0)
	type change struct {
		at       int
		from, to int
	}
	var changes []change
	phase := func(rate float64, rounds, from int) {
		for i := 0; i < rounds; i++ {
			now = now.Add(step)
			b, tp := s.round(rate, step)
			n := s.running
			hist.Sum, hist.N = append(hist.Sum, b), append(hist.N, n)
			tput.Sum, tput.N = append(tput.Sum, tp), append(tput.N, n)
			k := max(0, len(hist.Sum)-20)
			in := Input{Now: now, Policy: p, Workers: s.workers, Links: 1, Running: s.running, Settled: s.running == s.workers,
				Step: step, Metric: Series{hist.Sum[k:], hist.N[k:]}, Throughput: Series{tput.Sum[k:], tput.N[k:]}, Last: last, Capacity: capacity}
			d := Evaluate(in)
			capacity = d.Capacity
			if d.Kind == Scale {
				changes = append(changes, change{from + i, s.workers, d.To})
				s.workers, last = d.To, now
				s.pending = []int{1, 1, 1} // three rounds to start and rescan
			}
		}
	}
	phase(8, 30, 0) // 8/s on 2 workers of 10/s: nothing to do
	if len(changes) != 0 {
		t.Fatalf("scaled under a light steady load: %+v", changes)
	}
	phase(40, 90, 30) // 5x
	out := len(changes)
	if out == 0 || s.workers < 5 {
		t.Fatalf("after the step to 40/s: %d workers (%+v), want at least 5", s.workers, changes)
	}
	if s.backlog > p.Target*float64(s.workers) {
		t.Fatalf("backlog %v still over target after 90 s at %d workers", s.backlog, s.workers)
	}
	at := len(changes)
	phase(40, 300, 120) // steady: five minutes, no decision
	if len(changes) != at {
		t.Fatalf("decisions under a steady load: %+v", changes[at:])
	}
	phase(8, 120, 420) // back down
	if s.workers != 2 {
		t.Fatalf("after the step back to 8/s: %d workers (%+v), want 2", s.workers, changes)
	}
	t.Logf("changes: %+v (learned capacity %.2f/s per worker)", changes, capacity)
}
