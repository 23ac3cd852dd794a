// Package await waits out what a daemon depends on (the coordination store, the docker
// engine) instead of exiting: it retries with a doubling pause, says so in the log without
// flooding it, and shows the wait in a gauge, until the dependency answers or ctx ends.
package await

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/ctxtime"
)

// Defaults of Dep.
const (
	DefaultFirst   = 500 * time.Millisecond
	DefaultMax     = 15 * time.Second
	DefaultAttempt = 10 * time.Second
)

// Dep is one dependency waited for.
type Dep struct {
	// Name is what is waited for, as the log says it ("the store", "the docker engine").
	Name string
	Log  *slog.Logger
	// Waiting, when set, is 1 while a Do waits and 0 otherwise.
	Waiting prometheus.Gauge
	// First is the pause after the first failure; it doubles up to Max. Attempt bounds
	// each try (its context's deadline).
	First, Max, Attempt time.Duration
	// Transient says which errors are worth waiting out; nil: StoreUnavailable. Any other
	// error ends Do at once.
	Transient func(error) bool
	// OnWait, when set, is told every transient failure (a daemon's health answer says
	// what it waits for).
	OnWait func(error)
}

// OpenStore opens the store at url (coord.Open), waiting for it as Do does. It names the
// store in its log lines without credentials.
func (d Dep) OpenStore(ctx context.Context, url string, opts coord.Options) (coord.Store, error) {
	name := "the store"
	if t, err := coord.ParseURL(url); err == nil {
		name = t.String()
	}
	var s coord.Store
	err := d.Do(ctx, "open "+name, func(ctx context.Context) (err error) {
		s, err = coord.Open(ctx, url, opts)
		return err
	})
	return s, err
}

// StoreUnavailable reports whether err is the store not answering (no server, no quorum,
// a session not yet had), or an attempt's own deadline.
func StoreUnavailable(err error) bool {
	return errors.Is(err, coord.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// Do calls fn until it returns nil or an error that is not transient, or ctx ends (then it
// returns ctx's error). Each try gets a context bounded by Attempt. The first failure is
// logged at once, every later one as the pause doubles (so a long wait writes a line every
// Max at most), and the end of a wait once.
func (d Dep) Do(ctx context.Context, what string, fn func(ctx context.Context) error) error {
	first, maxPause, attempt := d.First, d.Max, d.Attempt
	if first <= 0 {
		first = DefaultFirst
	}
	if maxPause < first {
		maxPause = max(DefaultMax, first)
	}
	if attempt <= 0 {
		attempt = DefaultAttempt
	}
	transient := d.Transient
	if transient == nil {
		transient = StoreUnavailable
	}
	log := d.Log
	if log == nil {
		log = slog.Default()
	}
	var since time.Time
	pause := first
	tries := 0
	defer func() {
		if d.Waiting != nil && !since.IsZero() {
			d.Waiting.Set(0)
		}
	}()
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		err := fn(actx)
		cancel()
		if err == nil {
			if !since.IsZero() {
				log.Info(fmt.Sprintf("%s answers again: %s done", d.Name, what), "waited", time.Since(since).Round(time.Millisecond), "tries", tries+1)
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !transient(err) {
			return err
		}
		tries++
		if d.OnWait != nil {
			d.OnWait(err)
		}
		if since.IsZero() {
			since = time.Now()
			if d.Waiting != nil {
				d.Waiting.Set(1)
			}
		}
		log.Warn(fmt.Sprintf("waiting for %s: %s", d.Name, what), "err", err, "waiting", time.Since(since).Round(time.Second), "retry_in", pause)
		if err := ctxtime.Sleep(ctx, pause); err != nil {
			return err
		}
		pause = min(2*pause, maxPause)
	}
}

// StoreWaiting is the gauge of a daemon waiting for its store, registered in reg (nil:
// none).
func StoreWaiting(reg prometheus.Registerer) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "stormdock_store_waiting",
		Help: "1 while this process waits for the coordination store to answer before it can start (or go on starting)."})
	if reg != nil {
		reg.MustRegister(g)
	}
	return g
}
