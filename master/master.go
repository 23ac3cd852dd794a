package master

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/ctxtime"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/master/eventlog"
)

// Config tunes a master.
type Config struct {
	// ID names this master in the election; it should be unique among masters.
	ID string
	// API is the address the HTTP API listens on, advertised to clients through the store.
	API string
	// RouterStore is the store URL mirrored jobs' output routers open (the master's own
	// zk:// URL; for an embedded store, which one process holds, "mem://": the router then
	// recovers from its file sink alone).
	RouterStore string
	// CrashLoopRestarts is how many restarts within an agent's window make the master move a
	// worker to another node; 0 means 5.
	CrashLoopRestarts int
	// Resync is how often the leader re-plans even when nothing was seen to change.
	Resync time.Duration
	// Debounce gathers bursts of changes into one reconcile: planning waits until the store
	// has been quiet this long, but no longer than MaxDebounce.
	Debounce    time.Duration
	MaxDebounce time.Duration
	// ReregisterGrace is how long, after this master starts leading and after its store
	// connection comes back, nodes missing from the store are waited for before their
	// workers move. Default DefaultReregisterGrace.
	ReregisterGrace time.Duration
	// Resolver pins docker jobs' images to digests (see pinImage); nil resolves anonymously
	// through the registries' HTTP API.
	Resolver Resolver
	// PinRetry is how often images that could not be pinned are tried again. Default
	// DefaultPinRetry.
	PinRetry time.Duration
	// TenantUIDs is the range tenants' uids are given from (desired.CreateTenantIn).
	// Default cluster.DefaultTenantUIDs.
	TenantUIDs cluster.UIDRange
	// Events bounds and paces the cluster's events (see eventlog.go).
	Events   eventlog.Config
	Logger   *slog.Logger
	Registry prometheus.Registerer
}

func (c *Config) defaults() {
	if c.CrashLoopRestarts <= 0 {
		c.CrashLoopRestarts = 5
	}
	if c.Resync <= 0 {
		c.Resync = 10 * time.Second
	}
	if c.Debounce <= 0 {
		c.Debounce = 50 * time.Millisecond
	}
	if c.MaxDebounce < c.Debounce {
		c.MaxDebounce = max(10*c.Debounce, time.Second)
	}
	if c.ReregisterGrace <= 0 {
		c.ReregisterGrace = DefaultReregisterGrace
	}
	if c.Resolver == nil {
		c.Resolver = &images.Resolver{}
	}
	if c.PinRetry <= 0 {
		c.PinRetry = DefaultPinRetry
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.RouterStore == "" {
		c.RouterStore = "mem://"
	}
	if c.TenantUIDs == (cluster.UIDRange{}) {
		c.TenantUIDs = cluster.DefaultTenantUIDs
	}
}

// TenantUIDs is the range this master gives tenants' uids from.
func (m *Master) TenantUIDs() cluster.UIDRange { return m.cfg.TenantUIDs }

// Master decides where workers run. Any number of masters may run; one leads at a time and
// holds nothing that the store does not.
type Master struct {
	cfg     Config
	store   coord.Store
	log     *slog.Logger
	metrics *metrics

	// The mirrors run for the master's whole life: the API reads them on every master,
	// and the leader plans from them.
	jobs, nodes, confs, assigns, tenants, dcs *mirror
	wake                                      chan struct{}
	// events holds the cluster's events and queues those this master records.
	events *eventlog.Log
	// quit is closed when Run returns: streaming answers (events -f, job logs -f) end.
	quit     chan struct{}
	quitOnce sync.Once
	vc       viewCache // records decoded by earlier views
	reads    reads     // what the API answers from

	mu     sync.Mutex
	leader bool
	conn   storeState // guarded by mu
}

// New returns a master on store. It does nothing until Run.
func New(store coord.Store, cfg Config) (*Master, error) {
	cfg.defaults()
	if cfg.ID == "" {
		return nil, errors.New("master: a master needs an id")
	}
	m := &Master{cfg: cfg, store: store, log: cfg.Logger.With("master", cfg.ID), wake: make(chan struct{}, 1)}
	m.metrics = newMetrics(cfg.Registry)
	m.events = eventlog.New(store, cfg.Events, cfg.ID, m.log, m.metrics.events)
	m.quit = make(chan struct{})
	m.jobs = newMirror(store, cluster.JobsKey, m.poke)
	m.nodes = newMirror(store, cluster.NodesKey, m.poke)
	m.nodes.decode = m.nodeDecoder
	m.confs = newMirror(store, cluster.NodeConfsKey, m.poke)
	m.assigns = newMirror(store, cluster.AssignmentsKey, func() {})
	// A tenant's priority cap changes what placement sees of its jobs: replan on a change.
	m.tenants = newMirror(store, cluster.TenantsKey, m.poke)
	m.dcs = newMirror(store, cluster.DCsKey, m.poke)
	return m, nil
}

// Leader reports whether this master leads now.
func (m *Master) Leader() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.leader
}

func (m *Master) setLeader(v bool) {
	m.mu.Lock()
	m.leader = v
	m.mu.Unlock()
	if v {
		m.metrics.leader.Set(1)
	} else {
		m.metrics.leader.Set(0)
		// The leader alone sets the per-job gauges: a master that stops leading drops its
		// (soon stale) ones, so that max() over the masters is the leader's.
		m.metrics.jobDesired.Reset()
		m.metrics.jobRunning.Reset()
		m.metrics.jobUnplaced.Reset()
		m.metrics.unplaced.Set(0)
		m.unpublish()
	}
}

// Replan asks the leader to reconcile now, as a change in the store would, rather than at
// its next resync; a master that does not lead plans once it leads.
func (m *Master) Replan() { m.poke() }

func (m *Master) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Run campaigns for leadership and, while leading, reconciles; it campaigns again after
// losing it. It returns when ctx is done.
func (m *Master) Run(ctx context.Context) error {
	if err := EnsureDirs(ctx, m.store); err != nil {
		return err
	}
	defer m.quitOnce.Do(func() { close(m.quit) })
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		m.watchStore(ctx)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		m.events.Run(ctx, m.Leader)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		m.repin(ctx)
	}()
	for _, mr := range []*mirror{m.jobs, m.nodes, m.confs, m.assigns, m.tenants, m.dcs} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if err := mr.run(ctx); err != nil && ctx.Err() == nil {
					m.log.Warn("watch failed; retrying", "dir", mr.dir, "err", err)
					time.Sleep(200 * time.Millisecond)
				}
			}
		}()
	}
	for _, mr := range []*mirror{m.jobs, m.nodes, m.confs, m.assigns, m.tenants, m.dcs} {
		select {
		case <-mr.ready:
		case <-ctx.Done():
			return nil
		}
	}
	el, err := coord.NewElection(m.store, cluster.ElectionKey, m.cfg.ID)
	if err != nil {
		return fmt.Errorf("master: %w", err)
	}
	for {
		lead, err := el.Campaign(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			m.log.Warn("campaign failed; retrying", "err", err)
			if ctxtime.Sleep(ctx, 500*time.Millisecond) != nil {
				return nil
			}
			continue
		}
		m.log.Info("leading")
		since := time.Now()
		m.setLeader(true)
		lctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-lead.Done():
			case <-lctx.Done():
			}
			cancel()
		}()
		err = m.lead(lctx, since)
		cancel()
		m.setLeader(false)
		// Give the candidate entry up whatever ended the term: one left behind would be the
		// lowest candidate forever, and every later campaign would wait for it.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = lead.Resign(rctx)
		rcancel()
		if ctx.Err() != nil {
			return nil
		}
		m.log.Warn("leadership lost", "err", err)
	}
}

// EnsureDirs creates the store's top-level directories so watches have something to watch.
func EnsureDirs(ctx context.Context, s coord.KV) error {
	for _, k := range []string{cluster.JobsKey, cluster.TenantsKey, cluster.NodesKey, cluster.AssignmentsKey, cluster.NodeConfsKey, cluster.DCsKey, cluster.MasterDirKey,
		cluster.HistoryKey, cluster.RoutersKey, cluster.EventsKey} {
		if _, err := s.Create(ctx, k, nil, coord.Persistent); err != nil && !errors.Is(err, coord.ErrExists) {
			return fmt.Errorf("master: create %s: %w", k, err)
		}
	}
	return nil
}

// lead runs the reconcile loop until ctx is done.
func (m *Master) lead(ctx context.Context, since time.Time) error {
	if m.cfg.API != "" {
		info, _ := json.Marshal(cluster.MasterInfo{ID: m.cfg.ID, API: m.cfg.API})
		_ = m.store.Delete(ctx, cluster.MasterKey, coord.AnyVersion)
		if _, err := m.store.Create(ctx, cluster.MasterKey, info, coord.Ephemeral); err != nil && !errors.Is(err, coord.ErrExists) {
			m.log.Warn("advertise API", "err", err)
		}
		defer func() {
			dctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = m.store.Delete(dctx, cluster.MasterKey, coord.AnyVersion)
		}()
	}
	m.startGrace("started leading")
	m.events.Emit(api.Event{Kind: api.EventMasterLeading, Object: "master/" + m.cfg.ID, Reason: "elected leader: it places workers from now on"})
	rctx, stopRouters := context.WithCancel(ctx)
	routersDone := make(chan struct{})
	go func() {
		defer close(routersDone)
		m.watchRouters(rctx, since)
	}()
	defer func() {
		stopRouters()
		<-routersDone
	}()
	r := &reconciler{m: m, since: since}
	defer r.stopWake()
	if err := r.loadAssignments(ctx); err != nil {
		return err
	}
	m.backfillUIDs(ctx)
	tick := time.NewTicker(m.cfg.Resync)
	defer tick.Stop()
	for {
		if err := r.reconcile(ctx); err != nil && ctx.Err() == nil {
			m.log.Warn("reconcile failed; retrying", "err", err)
			_ = ctxtime.Sleep(ctx, 200*time.Millisecond)
			m.poke()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.wake:
		case <-tick.C:
		}
		// Let a burst of changes arrive before planning: wait until the store has been quiet
		// for Debounce (at most MaxDebounce). Nodes of a data center that goes down vanish
		// one after another; planning after the first would move its workers as a single
		// node's, not the data center's whole jobs.
		deadline := time.After(m.cfg.MaxDebounce)
	quiet:
		for {
			select {
			case <-m.wake:
				continue
			case <-time.After(m.cfg.Debounce):
				break quiet
			case <-deadline:
				break quiet
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// backfillUIDs gives the tenants stored before uids existed theirs, at the start of a term
// (and again while one is without: see reconcile), so that none stays uid-less: the
// workers of a tenant without a uid are not placed, rather than run as anyone else.
func (m *Master) backfillUIDs(ctx context.Context) {
	n, err := desired.BackfillTenantUIDs(ctx, m.store, m.cfg.TenantUIDs)
	if n > 0 {
		m.log.Info("gave tenants stored without uids theirs", "tenants", n, "range", m.cfg.TenantUIDs.String())
	}
	if err != nil && ctx.Err() == nil {
		m.log.Warn("tenants without uids: their workers wait", "err", err)
	}
}
