package healthcheck

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

const mib = 1 << 20

func TestChooseVictim(t *testing.T) {
	for _, tc := range []struct {
		name string
		cs   []Candidate
		want string
	}{
		{"empty", nil, ""},
		{"lowest priority first even if small", []Candidate{
			{ID: "big-important", Priority: 100, Request: 64 * mib, Usage: 900 * mib},
			{ID: "small-unimportant", Priority: 1, Request: 64 * mib, Usage: 10 * mib},
		}, "small-unimportant"},
		{"among equals the furthest over its request", []Candidate{
			{ID: "a", Priority: 5, Request: 512 * mib, Usage: 600 * mib}, // +88
			{ID: "b", Priority: 5, Request: 64 * mib, Usage: 200 * mib},  // +136
			{ID: "c", Priority: 5, Request: 1024 * mib, Usage: 700 * mib},
		}, "b"},
		{"nobody over: the least under", []Candidate{
			{ID: "a", Priority: 0, Request: 512 * mib, Usage: 100 * mib},
			{ID: "b", Priority: 0, Request: 128 * mib, Usage: 100 * mib},
		}, "b"},
		{"full tie: larger usage, then id", []Candidate{
			{ID: "y", Priority: 0, Request: 100, Usage: 200},
			{ID: "x", Priority: 0, Request: 100, Usage: 200},
			{ID: "z", Priority: 0, Request: 0, Usage: 100},
		}, "x"},
		{"negative priorities", []Candidate{
			{ID: "p0", Priority: 0}, {ID: "pm", Priority: -3},
		}, "pm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, ok := ChooseVictim(tc.cs)
			if ok != (tc.want != "") || v.ID != tc.want {
				t.Errorf("got %q %v, want %q", v.ID, ok, tc.want)
			}
		})
	}
}

// The chooser is a minimum of a total order: whatever the input order, the same victim, and
// RankVictims agrees with it.
func TestChooseVictimOrderIndependent(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		cs := make([]Candidate, 1+rng.IntN(8))
		for i := range cs {
			cs[i] = Candidate{ID: string(rune('a' + i)), Priority: rng.IntN(3),
				Request: uint64(rng.IntN(4)) * mib, Usage: uint64(rng.IntN(6)) * mib}
		}
		want, _ := ChooseVictim(cs)
		if r := RankVictims(cs); r[0] != want {
			t.Fatalf("rank[0] %v != choice %v", r[0], want)
		}
		for _, c := range cs {
			if c.Priority < want.Priority || (c.Priority == want.Priority && c.Over() > want.Over()) {
				t.Fatalf("%v chosen over %v", want, c)
			}
		}
		rng.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
		if got, _ := ChooseVictim(cs); got != want {
			t.Fatalf("order changed the choice: %v vs %v", got, want)
		}
	}
}

// fakeNode is memory shared by fake workers: the probe reads the sum, stopping a worker frees
// its part.
type fakeNode struct {
	mu      sync.Mutex
	total   uint64
	workers map[string]Candidate
	stopped []string
	probes  int
}

func (n *fakeNode) Probe() (Sample, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.probes++
	var used uint64
	for _, w := range n.workers {
		used += w.Usage
	}
	f := float64(used) / float64(n.total)
	return Sample{At: time.Now(), Used: f, NodeUsed: f, Source: SourceNode}, nil
}

func (n *fakeNode) candidates(context.Context) ([]Candidate, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var cs []Candidate
	for _, w := range n.workers {
		cs = append(cs, w)
	}
	return cs, nil
}

func (n *fakeNode) stop(_ context.Context, c Candidate) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.workers, c.ID)
	n.stopped = append(n.stopped, c.ID)
	return nil
}

func TestEvictorStopsOneAtATimeUntilBelowCritical(t *testing.T) {
	n := &fakeNode{total: 1000 * mib, workers: map[string]Candidate{
		"keep-hi":  {ID: "keep-hi", Priority: 100, Request: 100 * mib, Usage: 400 * mib},
		"lo-over":  {ID: "lo-over", Priority: 1, Request: 50 * mib, Usage: 250 * mib},
		"lo-under": {ID: "lo-under", Priority: 1, Request: 300 * mib, Usage: 200 * mib},
		"mid":      {ID: "mid", Priority: 50, Request: 100 * mib, Usage: 120 * mib},
	}} // 970/1000
	var notified []string
	e := &Evictor{Critical: 0.8, Cooldown: time.Millisecond, Probe: n, Candidates: n.candidates, Stop: n.stop,
		OnEvict: func(c Candidate, s Sample) { notified = append(notified, c.ID) }}
	got, err := e.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// 970 -> stop lo-over (720 < 800): one eviction is enough.
	if ids := ids(got); !slices.Equal(ids, []string{"lo-over"}) || !slices.Equal(n.stopped, ids) || !slices.Equal(notified, ids) {
		t.Fatalf("evicted %v, stopped %v, notified %v", ids, n.stopped, notified)
	}
	// Raise the pressure: now two more must go, lowest priority first.
	n.mu.Lock()
	w := n.workers["keep-hi"]
	w.Usage = 700 * mib
	n.workers["keep-hi"] = w // 700+200+120 = 1020
	n.mu.Unlock()
	got, err = e.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ids := ids(got); !slices.Equal(ids, []string{"lo-under", "mid"}) {
		t.Fatalf("second round evicted %v", ids)
	}
	// Only keep-hi is left, at 70%: below critical, nothing to do.
	if got, err := e.Run(context.Background()); err != nil || len(got) != 0 {
		t.Fatalf("below critical: %v %v", got, err)
	}
}

func ids(cs []Candidate) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.ID)
	}
	return out
}

func TestEvictorEdges(t *testing.T) {
	full := &fakeNode{total: 100, workers: map[string]Candidate{}}
	full.workers["only"] = Candidate{ID: "only", Usage: 99}
	e := &Evictor{Critical: 0.5, Probe: full, Candidates: full.candidates,
		Stop: func(context.Context, Candidate) error { return errors.New("cannot stop") }}
	if _, err := e.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "cannot stop") || full.probes != 1 {
		t.Fatalf("failing stop: %v after %d probes", err, full.probes)
	}
	// Memory that is not ours: nothing to evict.
	foreign := &fakeNode{total: 100, workers: map[string]Candidate{}}
	e = &Evictor{Critical: 0.5, Probe: probeFunc(func() (Sample, error) { return Sample{Used: 0.9}, nil }),
		Candidates: foreign.candidates, Stop: foreign.stop}
	if _, err := e.Run(context.Background()); !errors.Is(err, ErrNoVictim) {
		t.Fatalf("no victim: %v", err)
	}
	// Max bounds a probe that keeps reading high.
	many := &fakeNode{total: 100, workers: map[string]Candidate{"a": {ID: "a"}, "b": {ID: "b"}, "c": {ID: "c"}}}
	e = &Evictor{Critical: 0.5, Max: 2, Probe: probeFunc(func() (Sample, error) { return Sample{Used: 0.9}, nil }),
		Candidates: many.candidates, Stop: many.stop}
	if got, err := e.Run(context.Background()); err == nil || len(got) != 2 {
		t.Fatalf("max: %v %v", got, err)
	}
	// The cool-down waits, and ctx cuts it short.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	more := &fakeNode{total: 100, workers: map[string]Candidate{"a": {ID: "a"}, "b": {ID: "b"}}}
	e = &Evictor{Critical: 0.5, Cooldown: time.Hour, Probe: probeFunc(func() (Sample, error) { return Sample{Used: 0.9}, nil }),
		Candidates: more.candidates, Stop: more.stop}
	start := time.Now()
	got, err := e.Run(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || len(got) != 1 || time.Since(start) > 5*time.Second {
		t.Fatalf("cooldown with ctx: %v %v after %v", got, err, time.Since(start))
	}
}

type probeFunc func() (Sample, error)

func (f probeFunc) Probe() (Sample, error) { return f() }
