package master

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/await"
	"github.com/stormdock/stormdock/internal/ctxtime"
	"github.com/stormdock/stormdock/internal/keyring"
	"github.com/stormdock/stormdock/master/agentclient"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/master/eventlog"
	"github.com/stormdock/stormdock/master/jobmetrics"
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
	// SinkDir is the directory mirrored jobs' file sinks must lie below, as
	// SinkDir/<tenant>/... (the operator's --sink-dir); "" turns file sinks off. Submits and
	// updates are checked against it (CheckSinkDir); the routers check again on their node.
	SinkDir string
	// CrashLoopRestarts is how many restarts within an agent's window make the master move a
	// worker to another node; 0 means 5.
	CrashLoopRestarts int
	// AvoidPeriod is how long a node is avoided for a job whose workers crash-looped there
	// the first time; each further crash loop there doubles it, up to AvoidMax. When the
	// job's workers fit nowhere else they are placed on an avoided node all the same.
	// Defaults DefaultAvoidPeriod and DefaultAvoidMax.
	AvoidPeriod time.Duration
	AvoidMax    time.Duration
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
	// Keyring holds the key tenant secrets are sealed with (the operator's --secrets-key
	// file, the same on every master); nil turns secrets off.
	Keyring *keyring.File
	// APICertSHA256 is the SHA-256 of the certificate an https:// API serves, advertised
	// with it (cluster.MasterInfo) so that agents trust that certificate alone.
	APICertSHA256 string
	// Events bounds and paces the cluster's events (see eventlog.go).
	Events eventlog.Config
	// Metrics shapes the collection and history of the jobs' metrics (jobmetrics.go).
	Metrics  jobmetrics.Config
	Logger   *slog.Logger
	Registry prometheus.Registerer
	// StoreWaiting is set to 1 while Run waits for the store before it can start (see
	// await.StoreWaiting); nil: the master registers its own in Registry.
	StoreWaiting prometheus.Gauge
}

func (c *Config) defaults() {
	if c.CrashLoopRestarts <= 0 {
		c.CrashLoopRestarts = 5
	}
	if c.AvoidPeriod <= 0 {
		c.AvoidPeriod = DefaultAvoidPeriod
	}
	if c.AvoidMax < c.AvoidPeriod {
		c.AvoidMax = max(DefaultAvoidMax, c.AvoidPeriod)
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

// commitHook runs before an assignment transaction and returns the context to send it
// with (a test passes one that does not end, as a request already on its way or queued in
// the client would not) and a function that gets the transaction's outcome.
type commitHook func(ctx context.Context) (context.Context, func(error))

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
	// secrets mirrors each tenant's secret index (versions, never values).
	secrets *mirror
	// admin follows the admin token's hash, which the API checks every request against.
	admin adminToken
	wake  chan struct{}
	// events holds the cluster's events and queues those this master records.
	events *eventlog.Log
	// agents signs this master's requests to agents (workers' logs, job metrics).
	agents *agentclient.Client
	// collector pulls the jobs' metrics from the agents and keeps their history.
	collector *jobmetrics.Collector
	// quit is closed when Run returns: streaming answers (events -f, job logs -f) end.
	quit     chan struct{}
	quitOnce sync.Once
	vc       viewCache // records decoded by earlier views
	reads    reads     // what the API answers from
	// published counts the leader's states the API has seen published (changes.go).
	published publishes

	// beforeCommit, when set (tests), runs before each assignment transaction: a test
	// holds a leader there until it is deposed (see commitHook).
	beforeCommit atomic.Pointer[commitHook]

	// waiting says what Run waits for before it can start ("" when it does not wait).
	waiting atomic.Pointer[string]

	mu     sync.Mutex
	leader bool
	fence  coord.Fence // this term's, while leader
	conn   storeState  // guarded by mu
}

// New returns a master on store. It does nothing until Run.
func New(store coord.Store, cfg Config) (*Master, error) {
	cfg.defaults()
	if cfg.ID == "" {
		return nil, errors.New("master: a master needs an id")
	}
	m := &Master{cfg: cfg, store: store, log: cfg.Logger.With("master", cfg.ID), wake: make(chan struct{}, 1)}
	m.metrics = newMetrics(cfg.Registry)
	if m.cfg.StoreWaiting == nil {
		m.cfg.StoreWaiting = await.StoreWaiting(cfg.Registry)
	}
	m.events = eventlog.New(store, cfg.Events, cfg.ID, m.log, m.metrics.events)
	m.agents = agentclient.New(store)
	mc := cfg.Metrics
	if mc.Logger == nil {
		mc.Logger = m.log
	}
	if mc.Registerer == nil {
		mc.Registerer = cfg.Registry
	}
	var err error
	if m.collector, err = jobmetrics.NewCollector(mc, metricsSource{m}, m.agents); err != nil {
		return nil, fmt.Errorf("master: %w", err)
	}
	m.quit = make(chan struct{})
	m.jobs = newMirror(store, cluster.JobsKey, m.poke)
	m.nodes = newMirror(store, cluster.NodesKey, m.poke)
	m.nodes.decode = m.nodeDecoder
	m.confs = newMirror(store, cluster.NodeConfsKey, m.poke)
	m.assigns = newMirror(store, cluster.AssignmentsKey, func() {})
	// A tenant's priority cap changes what placement sees of its jobs: replan on a change.
	m.tenants = newMirror(store, cluster.TenantsKey, m.poke)
	m.dcs = newMirror(store, cluster.DCsKey, m.poke)
	// A secret's new version reaches its workers through their assignments.
	m.secrets = newMirror(store, cluster.SecretsKey, m.poke)
	m.secrets.decode = secretsDecoder
	return m, nil
}

// Waiting says what the master waits for before it can start serving ("" when nothing): its
// store, away when it started.
func (m *Master) Waiting() string {
	if p := m.waiting.Load(); p != nil {
		return *p
	}
	return ""
}

func (m *Master) setWaiting(s string) { m.waiting.Store(&s) }

// Agents is how this master reaches the agents' signed endpoint.
func (m *Master) Agents() *agentclient.Client { return m.agents }

// Leader reports whether this master leads now.
func (m *Master) Leader() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.leader
}

// term returns this term's fence, and false when this master does not lead. Writes made
// for the term go through coord.Fenced(m.store, fence).
func (m *Master) term() (coord.Fence, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.fence, m.leader
}

func (m *Master) setLeader(v bool, f coord.Fence) {
	m.mu.Lock()
	m.leader, m.fence = v, f
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
	// A master started while the store is away (no server, no quorum) waits for it rather
	// than exit: systemd would only start it again into the same outage.
	dep := await.Dep{Name: "the store", Log: m.log, Waiting: m.cfg.StoreWaiting}
	if err := dep.Do(ctx, "create the cluster's directories", func(ctx context.Context) error {
		err := EnsureDirs(ctx, m.store)
		if err != nil {
			m.setWaiting("the store: " + err.Error())
		}
		return err
	}); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	// The keyring check writes to the store too: a store lost right after the directories
	// were made is waited out the same way (a mismatched key is no outage: it ends Run).
	if err := dep.Do(ctx, "check the secrets keyring", func(ctx context.Context) error {
		err := m.checkKeyring(ctx)
		if err != nil && await.StoreUnavailable(err) {
			m.setWaiting("the store: " + err.Error())
		}
		return err
	}); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	m.setWaiting("")
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
		m.events.Run(ctx, m.term)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		m.repin(ctx)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		m.collect(ctx)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		m.admin.watch(ctx, m.store)
	}()
	for _, mr := range []*mirror{m.jobs, m.nodes, m.confs, m.assigns, m.tenants, m.dcs, m.secrets} {
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
	for _, mr := range []*mirror{m.jobs, m.nodes, m.confs, m.assigns, m.tenants, m.dcs, m.secrets} {
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
		m.setLeader(true, lead.Fence())
		lctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-lead.Done():
			case <-lctx.Done():
			}
			cancel()
		}()
		err = m.lead(lctx, since, lead.Fence())
		cancel()
		m.setLeader(false, coord.Fence{})
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
		cluster.HistoryKey, cluster.RoutersKey, cluster.EventsKey, cluster.SecretsKey} {
		if _, err := s.Create(ctx, k, nil, coord.Persistent); err != nil && !errors.Is(err, coord.ErrExists) {
			return fmt.Errorf("master: create %s: %w", k, err)
		}
	}
	return nil
}

// lead runs the reconcile loop until ctx is done. Every write of the term carries fence.
func (m *Master) lead(ctx context.Context, since time.Time, fence coord.Fence) error {
	kv := coord.Fenced(m.store, fence)
	if m.cfg.API != "" {
		info, _ := json.Marshal(cluster.MasterInfo{ID: m.cfg.ID, API: m.cfg.API, CertSHA256: m.cfg.APICertSHA256})
		if err := m.advertise(ctx, kv, info); errors.Is(err, coord.ErrFenced) {
			return err // the term ended in the store before this master heard of it
		} else if err != nil && ctx.Err() == nil {
			m.log.Warn("advertise API", "err", err)
		}
		defer func() {
			// Before Resign: the fence still holds unless the term ended in the store.
			dctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			m.unadvertise(dctx, kv, info)
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
	// The term's view of assignments is read from the store now, never kept from an
	// earlier term: a leader deposed since may have written after that read (before the
	// fence stopped it), and the election's watch orders this read after its last write.
	r := &reconciler{m: m, kv: kv, since: since}
	defer r.stopWake()
	if err := r.loadAssignments(ctx); err != nil {
		return err
	}
	m.backfillUIDs(ctx, kv)
	actx, stopAutoscale := context.WithCancel(ctx)
	autoscaleDone := make(chan struct{})
	go func() {
		defer close(autoscaleDone)
		m.autoscale(actx, kv)
	}()
	defer func() {
		stopAutoscale()
		<-autoscaleDone
	}()
	tick := time.NewTicker(m.cfg.Resync)
	defer tick.Stop()
	for {
		counts := m.burstCounts() // the view the reconcile takes has at least these
		if err := r.measured(ctx); err != nil && ctx.Err() == nil {
			if errors.Is(err, coord.ErrFenced) {
				// The store says another term began: whatever this master has heard of its
				// own (a server it reads from may lag, or have come apart from its
				// ensemble), retrying would be fenced for good. Stand again.
				return err
			}
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
		first := time.Now()
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
		if err := m.awaitBurst(ctx, counts, first, ctxtime.Sleep); err != nil {
			return err
		}
	}
}

// awaitBurst waits, when many nodes came or went or many jobs changed since the last
// reconcile's view (counts, from burstCounts then), until none has for five Debounces, and
// no longer than three MaxDebounces from first. A data center cut off loses its nodes one
// session at a time, as the store expires or closes them, and a thousand jobs submitted
// together arrive one by one: under load both come with gaps longer than Debounce, and a
// reconcile that starts between them places part of them and the rest only after its
// writes, which at ten thousand nodes are seconds of every node's assignment rewritten. One
// node or job, or a few, never waits. sleep is ctxtime.Sleep but in tests.
func (m *Master) awaitBurst(ctx context.Context, counts []uint64, first time.Time, sleep func(context.Context, time.Duration) error) error {
	burst := false
	for i, src := range m.burstSources() {
		if src.changes()-counts[i] >= uint64(max(burstChanges, src.size()/burstShare)) {
			burst = true
		}
	}
	if !burst {
		return nil
	}
	quietFor, limit := 5*m.cfg.Debounce, first.Add(3*m.cfg.MaxDebounce)
	last := m.burstCounts()
	for {
		wait := min(quietFor, time.Until(limit))
		if wait <= 0 {
			return nil
		}
		if err := sleep(ctx, wait); err != nil {
			return err
		}
		now := m.burstCounts()
		if slices.Equal(now, last) {
			return nil
		}
		last = now
	}
}

// burstSource is a kind of change that comes in bursts: how many so far, and among how
// many entries.
type burstSource struct {
	changes func() uint64
	size    func() int
}

// burstSources are the nodes' comings and goings (not their records' changes, which never
// stop) and the jobs' changes.
func (m *Master) burstSources() []burstSource {
	return []burstSource{{m.nodes.membership, m.nodes.size}, {m.jobs.generation, m.jobs.size}}
}

// burstCounts is each burst source's count now.
func (m *Master) burstCounts() []uint64 {
	srcs := m.burstSources()
	out := make([]uint64, len(srcs))
	for i, src := range srcs {
		out[i] = src.changes()
	}
	return out
}

// A burst (see awaitBurst) is at least burstChanges changes, and of at least one in
// burstShare of the entries: a rack of a hundred nodes at ten thousand is not one, a data
// center is.
const (
	burstChanges = 8
	burstShare   = 50
)

// advertise makes the master key hold info, this leader's API, in place of whatever is
// there: a record left by an earlier leader's client (one re-created by a client after its
// session expired, see coord.Store) is replaced. Each write carries the term's fence.
func (m *Master) advertise(ctx context.Context, kv coord.KV, info []byte) error {
	var err error
	for range 5 {
		var e coord.Entry
		e, err = kv.Get(ctx, cluster.MasterKey)
		switch {
		case err == nil && e.Owner == m.store.SessionID() && bytes.Equal(e.Value, info):
			return nil
		case err == nil:
			err = kv.Delete(ctx, cluster.MasterKey, e.Version)
		case errors.Is(err, coord.ErrNotFound):
			err = nil
		}
		if err != nil && !errors.Is(err, coord.ErrNotFound) && !errors.Is(err, coord.ErrConflict) {
			return err
		}
		_, err = kv.Create(ctx, cluster.MasterKey, info, coord.Ephemeral)
		if err == nil || !errors.Is(err, coord.ErrExists) {
			return err
		}
	}
	return err
}

// unadvertise removes the master key if it is still this leader's own (check-and-delete,
// fenced): never a later leader's, which a deposed master's unconditional delete would
// take away.
func (m *Master) unadvertise(ctx context.Context, kv coord.KV, info []byte) {
	e, err := kv.Get(ctx, cluster.MasterKey)
	if err != nil || e.Owner != m.store.SessionID() || !bytes.Equal(e.Value, info) {
		return
	}
	if err := kv.Delete(ctx, cluster.MasterKey, e.Version); err != nil && !errors.Is(err, coord.ErrNotFound) && !errors.Is(err, coord.ErrFenced) {
		m.log.Warn("withdraw API advertisement", "err", err)
	}
}

// backfillUIDs gives the tenants stored before uids existed theirs, at the start of a term
// (and again while one is without: see reconcile), so that none stays uid-less: the
// workers of a tenant without a uid are not placed, rather than run as anyone else.
func (m *Master) backfillUIDs(ctx context.Context, kv coord.KV) {
	n, err := desired.BackfillTenantUIDs(ctx, kv, m.cfg.TenantUIDs)
	if n > 0 {
		m.log.Info("gave tenants stored without uids theirs", "tenants", n, "range", m.cfg.TenantUIDs.String())
	}
	if err != nil && ctx.Err() == nil {
		m.log.Warn("tenants without uids: their workers wait", "err", err)
	}
}
