package healthcheck

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/stormdock/stormdock/internal/ctxtime"
)

// Candidate is a running worker the eviction loop may stop.
type Candidate struct {
	// ID is the agent's name for the worker (e.g. its isolation id).
	ID string
	// Priority is the job's priority: larger is more important (cluster.JobSpec.Priority).
	Priority int
	// Request is the memory the job asked for, in bytes; Usage what the worker uses now
	// (its cgroup's working set, see Prober.Cgroup).
	Request uint64
	Usage   uint64
}

// Over is how far the worker uses more memory than it asked for (negative when below).
func (c Candidate) Over() int64 {
	return clampInt64(c.Usage) - clampInt64(c.Request)
}

func clampInt64(v uint64) int64 {
	if v > 1<<62 {
		return 1 << 62
	}
	return int64(v)
}

// compareVictims orders candidates from the first to evict to the last: lowest priority
// first; among equals, the one furthest over its request; then the largest user; then by id
// so that the order is total and the choice reproducible.
func compareVictims(a, b Candidate) int {
	if c := cmp.Compare(a.Priority, b.Priority); c != 0 {
		return c
	}
	if c := cmp.Compare(b.Over(), a.Over()); c != 0 {
		return c
	}
	if c := cmp.Compare(b.Usage, a.Usage); c != 0 {
		return c
	}
	return cmp.Compare(a.ID, b.ID)
}

// RankVictims returns the candidates in eviction order, without changing cs.
func RankVictims(cs []Candidate) []Candidate {
	out := slices.Clone(cs)
	slices.SortFunc(out, compareVictims)
	return out
}

// ChooseVictim returns the worker to evict first, or false when there is none.
func ChooseVictim(cs []Candidate) (Candidate, bool) {
	if len(cs) == 0 {
		return Candidate{}, false
	}
	return slices.MinFunc(cs, compareVictims), true
}

// ErrNoVictim is returned when memory is critical but no worker is left to evict: what uses
// the memory is not ours, and the kernel will have to deal with it.
var ErrNoVictim = errors.New("no worker left to evict")

// Evictor stops workers one at a time while memory stays at or above the critical mark.
type Evictor struct {
	// Critical is the used fraction at or above which a worker is evicted.
	Critical float64
	// Cooldown is the wait after each eviction before probing again: the kernel needs a
	// moment to free a dead worker's memory, and evicting a second worker for pressure the
	// first one's exit would have relieved is the flapping this package exists to avoid.
	Cooldown time.Duration
	// Max bounds evictions per Run (0: no bound), so a probe that reads wrong cannot empty
	// the node in one go.
	Max int
	// Probe reads the node again before each choice.
	Probe Probe
	// Candidates lists the running workers with their usage.
	Candidates func(ctx context.Context) ([]Candidate, error)
	// Stop stops one worker and returns once it has exited, so that its memory is free.
	Stop func(ctx context.Context, c Candidate) error
	// OnEvict, when set, is told of every worker stopped (metrics).
	OnEvict func(c Candidate, s Sample)
	Logger  *slog.Logger
}

// Run evicts until a probe reads below Critical, and returns the workers it stopped. It
// returns early with an error when ctx ends, a probe or the stop callback fails, no candidate
// is left (ErrNoVictim) or Max evictions did not help.
func (e *Evictor) Run(ctx context.Context) ([]Candidate, error) {
	log := e.Logger
	if log == nil {
		log = slog.Default()
	}
	var evicted []Candidate
	for {
		s, err := e.Probe.Probe()
		if err != nil {
			return evicted, fmt.Errorf("evict: %w", err)
		}
		if s.Used < e.Critical {
			return evicted, nil
		}
		if e.Max > 0 && len(evicted) >= e.Max {
			return evicted, fmt.Errorf("evict: memory %.1f%% used after %d evictions, stopping here", 100*s.Used, len(evicted))
		}
		cs, err := e.Candidates(ctx)
		if err != nil {
			return evicted, fmt.Errorf("evict: list workers: %w", err)
		}
		v, ok := ChooseVictim(cs)
		if !ok {
			return evicted, fmt.Errorf("evict: memory %.1f%% used: %w", 100*s.Used, ErrNoVictim)
		}
		log.Warn("evicting worker: memory above critical mark",
			"worker", v.ID, "priority", v.Priority, "usage", v.Usage, "request", v.Request,
			"used", round3(s.Used), "source", s.Source, "critical", e.Critical)
		if err := e.Stop(ctx, v); err != nil {
			return evicted, fmt.Errorf("evict %s: %w", v.ID, err)
		}
		evicted = append(evicted, v)
		if e.OnEvict != nil {
			e.OnEvict(v, s)
		}
		if err := ctxtime.Sleep(ctx, e.Cooldown); err != nil {
			return evicted, err
		}
	}
}

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }
