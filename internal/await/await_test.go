package await

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/coord"
)

func TestDo(t *testing.T) {
	errPermanent := errors.New("wrong credentials")
	for _, c := range []struct {
		name     string
		errs     []error // what fn returns, one per call; nil past the end
		ctxEnds  bool
		want     error
		calls    int
		waitings int
	}{
		{name: "answers at once", calls: 1},
		{name: "store away twice, then back", errs: []error{fmt.Errorf("open: %w", coord.ErrUnavailable), context.DeadlineExceeded}, calls: 3, waitings: 2},
		{name: "an error waiting cannot cure", errs: []error{coord.ErrUnavailable, errPermanent}, want: errPermanent, calls: 2, waitings: 1},
		{name: "stopped while waiting", errs: []error{coord.ErrUnavailable, coord.ErrUnavailable, coord.ErrUnavailable}, ctxEnds: true, want: context.Canceled, calls: 2, waitings: 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			g := &gauge{Gauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})}
			var during []float64
			calls, waitings := 0, 0
			d := Dep{Name: "the store", Log: slog.New(slog.DiscardHandler), Waiting: g, First: time.Millisecond, Max: 2 * time.Millisecond,
				OnWait: func(error) {
					waitings++
					if c.ctxEnds && waitings == 2 {
						cancel()
					}
				}}
			err := d.Do(ctx, "open", func(ctx context.Context) error {
				calls++
				if calls > 1 {
					during = append(during, value(g))
				}
				if _, ok := ctx.Deadline(); !ok {
					t.Error("a try without a deadline")
				}
				if calls <= len(c.errs) {
					return c.errs[calls-1]
				}
				return nil
			})
			if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
				t.Errorf("Do = %v, want %v", err, c.want)
			}
			if calls != c.calls || waitings != c.waitings {
				t.Errorf("%d calls, %d waits; want %d, %d", calls, waitings, c.calls, c.waitings)
			}
			for i, v := range during {
				if v != 1 {
					t.Errorf("gauge %v during the wait (try %d), want 1", v, i+2)
				}
			}
			if v := value(g); v != 0 {
				t.Errorf("gauge %v after Do, want 0", v)
			}
		})
	}
}

// gauge is a gauge that remembers what it was set to.
type gauge struct {
	prometheus.Gauge
	v float64
}

func (g *gauge) Set(v float64) { g.v = v }

func value(g *gauge) float64 { return g.v }
