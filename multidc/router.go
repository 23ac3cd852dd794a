package multidc

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/ctxtime"
)

// Config configures a Router.
type Config struct {
	Job   string
	Links []string // the job's links, in order of preference
	// DC is the data center this router runs in ("" when unknown). Links are named for
	// their data centers: the router keeps the active link in another data center when a
	// live one can take over without a gap, so that losing one data center costs either a
	// link switch or a router takeover, never both at once.
	DC    string
	Store coord.Store // checkpoint, status and the one-router-per-job election
	Sink  Sink        // the router closes it when Run returns
	// OpenSink, when Sink is nil, opens the sink once the router leads the job's election:
	// a standby router must not hold the sink (a file sink is locked by its writer).
	// It gets the evidence of a file sink that the router's record keeps (nil: none).
	OpenSink func(ctx context.Context, ev *SinkEvidence) (Sink, error)
	// TakeOver says that opening the sink fences off every router that opened it before
	// (a fencing sink: PostgreSQL, JetStream; see Fences). A standby then takes the sink over
	// on evidence that the leader is gone (its record unchanged for StaleAfter and its API
	// not answering as the leader) instead of waiting for its store session to expire, a
	// leader keeps delivering when its store session is lost (the sink fences it, not the
	// election), and a sink that cannot be opened is retried, the reason in the record,
	// instead of stopping the router.
	TakeOver bool
	// StaleAfter is how long a leader's record may stay unchanged before a standby (with
	// TakeOver) asks the leader's API whether it still leads. Default 2 x StatusInterval.
	StaleAfter time.Duration
	// PeerClient asks another router's API whether it leads (GET /v1/lead): one that trusts
	// the router CA. Default: a plain client.
	PeerClient *http.Client
	// TokenHash is the hash (api.HashToken) of the job's own token (SenderToken): failovers
	// need it. Without LinkTokenHashes (a job from before per-link tokens), records and
	// heartbeats of every link are taken with it too.
	TokenHash string
	// LinkTokenHashes are the hashes of the links' tokens (LinkSenderToken), by link: a
	// link's records and heartbeats are taken with its token alone (403 with another's).
	LinkTokenHashes map[string]string
	// Listen, if set, is the address New listens on and Run serves the API on
	// ("127.0.0.1:0" picks a port; see URL).
	Listen string
	// TLS, if set, makes the API serve HTTPS with it (URL then says https).
	TLS *tls.Config
	// Metrics, if set, is served at /metrics next to the API. Its series name the job: the
	// caller guards it (the router command serves it to the scrape token or the admin
	// token, package internal/metricsauth).
	Metrics http.Handler
	// HeartbeatTimeout is how long a worker may be silent before its link counts as dead.
	// Default 400 ms (workers beat every 100 ms): the sink switches links within half a
	// second of the active link's loss. Failovers of links that were only late are counted
	// (Status.SpuriousFailovers).
	HeartbeatTimeout time.Duration
	// CloseGrace is how long a worker whose connection to the router closed may take to
	// beat again before it counts as dead: a killed worker is noticed after CloseGrace
	// instead of HeartbeatTimeout. Default HeartbeatTimeout/2; it needs the router's own
	// server (Config.Listen), and a negative value turns it off.
	CloseGrace time.Duration
	// CheckpointInterval is how often the delivered offset is synced and saved, when it
	// moved. Default 100 ms.
	CheckpointInterval time.Duration
	// StatusInterval is how often the record is rewritten when nothing was delivered, so
	// that its status (heartbeat ages, buffers) stays fresh and, with TakeOver, a standby
	// sees the leader alive. Default 1 s, or 200 ms with TakeOver.
	StatusInterval time.Duration
	Limits         Limits
	// MaxBatch bounds the records of one sink write. Default 1024.
	MaxBatch int
	// MaxBody bounds a records request's body (413 above it). Default DefaultMaxBody.
	MaxBody int64
	// Registerer receives the router's metrics (labelled job=Job); nil means none.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// DefaultMaxBody is the default bound of a records request's body: far above a batch of
// the sizes workers send (a thousand records of a few KiB), far below the router's memory.
const DefaultMaxBody = 8 << 20

// Router forwards one link's output of a mirrored job to the sink. Build it with New, run
// it with Run; Handler serves its API, which Run also serves on Config.Listen.
type Router struct {
	cfg      Config
	log      *slog.Logger
	ln       net.Listener
	instance string // this run's id, new at every New
	ckpt     checkpointer
	m        *metrics
	kick     chan struct{} // wakes the delivery loop

	mu           sync.Mutex
	state        runState
	ord          *orderer // nil until recovered
	live         *liveness
	preferred    string // the active link of the previous run, kept if it is alive
	manual       bool   // the active link was chosen by an operator: kept, even in the router's own dc
	readyAt      time.Time
	checkpoint   int64
	failovers    int64
	lastFailover *Failover
	switched     bool      // a failover not yet saved in the record: save it at the next tick
	spurious     int64     // heartbeat failovers whose link was alive again at once
	suspect      *Failover // the last heartbeat failover, until its link is seen dead long enough
	suspectBeat  time.Time // the last beat of that link's stalest worker before it
	epoch        int64     // the fencing sink's epoch this router holds
	how          string    // how this router came to lead: elected or evidence
	sinkErr      string    // the sink's last failure, "" once it works again
	sinkErrSince time.Time
	stopped      bool                   // the last checkpoint of a router stopping: the standby need not wait
	claimSince   time.Time              // when this router began trying to open the sink it claimed (zero: not)
	conns        map[net.Conn][]beatKey // the workers each open connection carried
	fails        *api.FailLimiter       // failed token checks, per remote address
}

type runState int

const (
	starting runState = iota
	ready
	stopping
)

// New checks cfg and, if cfg.Listen is set, listens there.
func New(cfg Config) (*Router, error) {
	if err := cluster.CheckName(cfg.Job); err != nil {
		return nil, fmt.Errorf("multidc: job: %w", err)
	}
	if len(cfg.Links) < 1 {
		return nil, errors.New("multidc: no links")
	}
	for i, l := range cfg.Links {
		if err := cluster.CheckName(l); err != nil {
			return nil, fmt.Errorf("multidc: link: %w", err)
		}
		if slices.Index(cfg.Links, l) != i {
			return nil, fmt.Errorf("multidc: link %q listed twice", l)
		}
	}
	if cfg.DC != "" {
		if err := cluster.CheckName(cfg.DC); err != nil {
			return nil, fmt.Errorf("multidc: dc: %w", err)
		}
	}
	if cfg.Store == nil || (cfg.Sink == nil && cfg.OpenSink == nil) {
		return nil, errors.New("multidc: a router needs a store and a sink")
	}
	if len(cfg.TokenHash) != 64 {
		return nil, errors.New("multidc: a router needs the hash of its job's sender token (--token-hash)")
	}
	for l, h := range cfg.LinkTokenHashes {
		if !slices.Contains(cfg.Links, l) || len(h) != 64 {
			return nil, fmt.Errorf("multidc: link token hash for %q: want LINK=HEX for one of the links %v", l, cfg.Links)
		}
	}
	if len(cfg.LinkTokenHashes) > 0 && len(cfg.LinkTokenHashes) != len(cfg.Links) {
		return nil, fmt.Errorf("multidc: link token hashes for %d of %d links: give one per link", len(cfg.LinkTokenHashes), len(cfg.Links))
	}
	if cfg.HeartbeatTimeout <= 0 {
		cfg.HeartbeatTimeout = 400 * time.Millisecond
	}
	switch {
	case cfg.CloseGrace == 0:
		cfg.CloseGrace = cfg.HeartbeatTimeout / 2
	case cfg.CloseGrace < 0:
		cfg.CloseGrace = 1<<63 - 1 // never
	}
	if cfg.CheckpointInterval <= 0 {
		cfg.CheckpointInterval = 100 * time.Millisecond
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = time.Second
		if cfg.TakeOver {
			cfg.StatusInterval = 200 * time.Millisecond
		}
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = 2 * cfg.StatusInterval
	}
	if cfg.PeerClient == nil {
		cfg.PeerClient = &http.Client{}
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 1024
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	cfg.Limits = cfg.Limits.withDefaults()
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// A new instance id per Router: workers tell a restarted router by it (package doc).
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	r := &Router{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "router", "job", cfg.Job),
		instance: hex.EncodeToString(b),
		ckpt:     checkpointer{kv: cfg.Store, job: cfg.Job, version: -1},
		kick:     make(chan struct{}, 1),
		live:     newLiveness(cfg.Links, cfg.HeartbeatTimeout, cfg.CloseGrace),
		conns:    map[net.Conn][]beatKey{},
		fails:    api.NewFailLimiter(),
	}
	m, err := newMetrics(r, cfg.Registerer)
	if err != nil {
		return nil, err
	}
	r.m = m
	if cfg.Listen != "" {
		ln, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("multidc: listen: %w", err)
		}
		r.ln = ln
		if cfg.TLS != nil {
			r.ln = tls.NewListener(ln, cfg.TLS)
		}
	}
	return r, nil
}

// URL is the base URL of the router's API, "" without a listener.
func (r *Router) URL() string {
	if r.ln == nil {
		return ""
	}
	if r.cfg.TLS != nil {
		return "https://" + r.ln.Addr().String()
	}
	return "http://" + r.ln.Addr().String()
}

// Run leads the job's router election, recovers the delivered offset, and delivers until
// ctx is done or something fatal happens (lost leadership, a broken sink, another router
// writing the record). It saves a last checkpoint and closes the sink and the listener
// before it returns; a Router runs once.
func (r *Router) Run(ctx context.Context) (err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer func() {
		if r.cfg.Sink == nil {
			return
		}
		if cerr := r.cfg.Sink.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("multidc: close sink: %w", cerr)
		}
	}()

	var wg sync.WaitGroup
	if r.ln != nil {
		// Serve from the start: until the router leads and has recovered, workers get 503
		// and retry, instead of connection errors.
		srv := api.NewServer(r.Handler())
		srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) }
		srv.ConnState = r.connState
		wg.Go(func() {
			if err := srv.Serve(r.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				cancel(fmt.Errorf("multidc: serve: %w", err))
			}
		})
		defer func() {
			sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer scancel()
			_ = srv.Shutdown(sctx)
			wg.Wait()
		}()
		r.log.Info("router API listening", "url", r.URL())
	}

	ekey, err := cluster.RouterElectionKey(r.cfg.Job)
	if err != nil {
		return fmt.Errorf("multidc: %w", err)
	}
	el, err := coord.NewElection(r.cfg.Store, ekey, r.instance)
	if err != nil {
		return fmt.Errorf("multidc: %w", err)
	}
	r.log.Info("waiting to lead the job's router election", "instance", r.instance, "takeOver", r.cfg.TakeOver)
	held := &leadership{}
	defer held.resign()
	if r.cfg.TakeOver {
		// The election only breaks the tie between routers when none has led yet; the
		// sink's fence keeps one writer. A router keeps standing for it while it runs.
		cctx, ccancel := context.WithCancel(ctx)
		var camp sync.WaitGroup
		camp.Go(func() { r.keepCampaigning(cctx, el, held) })
		defer func() {
			ccancel()
			camp.Wait()
		}()
	}
	if err := r.acquire(ctx, el, held); err != nil {
		if ctx.Err() != nil {
			return fatal(ctx)
		}
		return err
	}
	if err := r.recover(ctx); err != nil {
		return err
	}

	var loops sync.WaitGroup
	loops.Go(func() {
		if err := r.deliverLoop(ctx); err != nil {
			cancel(err)
		}
	})
	loops.Go(func() { r.healthLoop(ctx) })
	loops.Go(func() {
		if err := r.checkpointLoop(ctx); err != nil {
			cancel(err)
		}
	})
	lost := make(<-chan struct{})
	if !r.cfg.TakeOver {
		lost = held.get().Done()
	}
	select {
	case <-lost:
		if ctx.Err() == nil {
			cancel(errors.New("multidc: lost the router election (store session lost or store closed): stopping so that one router writes the sink"))
		}
	case <-ctx.Done():
	}
	r.mu.Lock()
	r.state = stopping
	r.mu.Unlock()
	loops.Wait()

	// A last checkpoint, unless another router may be writing: leadership is gone, or
	// another router took the sink over.
	cause := context.Cause(ctx)
	taken := errors.Is(cause, ErrFenced) || errors.Is(cause, coord.ErrConflict)
	select {
	case <-lost:
	default:
		if taken {
			break
		}
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		r.mu.Lock()
		r.stopped = true
		r.mu.Unlock()
		if serr := r.saveCheckpoint(sctx); serr != nil {
			r.log.Warn("last checkpoint failed; the next router recovers from the sink", "err", serr)
		}
	}
	r.log.Info("router stopped")
	return fatal(ctx)
}

// leadership is the election's leadership a router holds now, nil while none.
type leadership struct {
	mu sync.Mutex
	l  *coord.Leadership
}

func (h *leadership) get() *coord.Leadership {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.l
}

func (h *leadership) set(l *coord.Leadership) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.l = l
}

func (h *leadership) resign() {
	if l := h.get(); l != nil {
		rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer rcancel()
		_ = l.Resign(rctx)
	}
}

// keepCampaigning stands in the job's router election until ctx is done, again after every
// loss (TakeOver: losing the election stops no one).
func (r *Router) keepCampaigning(ctx context.Context, el *coord.Election, held *leadership) {
	for ctx.Err() == nil {
		l, err := el.Campaign(ctx)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("campaign failed; standing again", "err", err)
				_ = ctxtime.Sleep(ctx, time.Second)
			}
			continue
		}
		held.set(l)
		select {
		case <-l.Done():
			held.set(nil)
			r.log.Info("lost the router election (the sink's fence, not the election, keeps one writer)")
		case <-ctx.Done():
		}
	}
}

// acquire returns once this router may write the sink, with the sink open. Without TakeOver
// that is when it leads the election. With it, when it leads the election and no router has
// led before, or when the router that led is gone by evidence (see leaderGone); opening the
// sink then fences that router off.
func (r *Router) acquire(ctx context.Context, el *coord.Election, held *leadership) error {
	if !r.cfg.TakeOver {
		lead, err := el.Campaign(ctx)
		if err != nil {
			return fmt.Errorf("multidc: campaign: %w", err)
		}
		held.set(lead)
		r.how = LeadElected
		if r.cfg.Sink != nil {
			return nil
		}
		// The record's evidence lets a file sink know its file (see SinkEvidence).
		rec, _, err := r.ckpt.load(ctx)
		if err != nil {
			return err
		}
		sink, err := r.cfg.OpenSink(ctx, rec.Sink)
		if err != nil {
			return fmt.Errorf("multidc: open sink: %w", err)
		}
		r.setSink(sink)
		return nil
	}
	var w leaderWatch
	t := time.NewTicker(takeoverCheck)
	defer t.Stop()
	var retryAt time.Time
	backoff := 500 * time.Millisecond
	for {
		take, why := r.leaderGone(ctx, &w, held.get() != nil)
		if take {
			w.claimed = why
		}
		if take && !time.Now().Before(retryAt) {
			rec, _, err := r.ckpt.load(ctx)
			sink := r.cfg.Sink
			if err == nil && sink == nil {
				sink, err = r.cfg.OpenSink(ctx, rec.Sink)
			}
			if err == nil {
				r.setSink(sink)
				r.how = why
				r.log.Info("taking the sink over", "how", why)
				return nil
			}
			if ctx.Err() != nil {
				return err
			}
			if errors.Is(err, coord.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
				r.log.Warn("cannot take the sink over yet: the store does not answer; trying again", "err", err)
			} else {
				r.mu.Lock()
				if r.claimSince.IsZero() {
					r.claimSince = time.Now()
				}
				r.mu.Unlock()
				r.sinkProblem(ctx, fmt.Errorf("multidc: open sink: %w", err))
			}
			retryAt = time.Now().Add(backoff)
			backoff = min(2*backoff, 5*time.Second)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (r *Router) setSink(sink Sink) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cfg.Sink = sink
	if f, ok := sink.(fencing); ok {
		r.epoch = f.Epoch()
	}
}

// fencing is a sink whose opening fences off every earlier opener (PGSink, NATSSink).
type fencing interface{ Epoch() int64 }

// How a router came to lead (Status.Leading).
const (
	LeadElected  = "elected"
	LeadEvidence = "evidence"
)

// takeoverCheck is how often a standby with TakeOver looks at the leader's record.
const takeoverCheck = 100 * time.Millisecond

// peerTimeout bounds a standby's question to the leader's API.
const peerTimeout = 300 * time.Millisecond

// leaderWatch is what a standby saw of the leader's record.
type leaderWatch struct {
	version int64
	seen    bool
	changed time.Time // when the standby last saw it change (its own clock)
	claimed string    // why this router last decided to take the sink (see Status.Leading)
}

// leaderGone says whether this router should take the sink, and how it came to. A record
// that does not change for StaleAfter (the leader rewrites it every StatusInterval) is asked
// about: a leader answering its /v1/lead still leads, anything else (a cut host times out, a
// dead process refuses, a stopping one says not ready) is evidence that it is gone. Time is
// measured on this router's clock from the store's versions, not from the record's wall
// clock, which is another host's. With no record yet, the election decides.
func (r *Router) leaderGone(ctx context.Context, w *leaderWatch, elected bool) (bool, string) {
	key, _ := cluster.RouterKey(r.cfg.Job)
	gctx, cancel := context.WithTimeout(ctx, time.Second)
	e, err := r.cfg.Store.Get(gctx, key)
	cancel()
	now := time.Now()
	switch {
	case errors.Is(err, coord.ErrNotFound) || err == nil && len(e.Value) == 0:
		return elected, LeadElected
	case err != nil:
		return false, "" // no evidence either way
	}
	var rec RouterRecord
	if json.Unmarshal(e.Value, &rec) != nil {
		return elected, LeadElected
	}
	if !w.seen || e.Version != w.version {
		w.seen, w.version, w.changed = true, e.Version, now
	}
	switch {
	case rec.Instance == r.instance:
		return true, w.claimed // this router's own record (a sink problem it noted)
	case rec.Stopped:
		return true, LeadElected // the leader stopped and said so
	case now.Sub(w.changed) < r.cfg.StaleAfter:
		return false, ""
	case r.peerLeads(ctx, rec.Router):
		w.changed = now // alive but slow to write: give it another StaleAfter
		return false, ""
	}
	r.log.Warn("the leading router is gone by evidence: taking the sink over",
		"leader", rec.Router, "leaderInstance", rec.Instance, "unchangedFor", now.Sub(w.changed).Round(time.Millisecond))
	return true, LeadEvidence
}

// claimFor is how long a router that claimed a fencing sink but cannot open it holds the
// claim (answering GET /v1/lead) before the other router may try: the sink may be out of
// reach from this router's data center alone.
const claimFor = 10 * time.Second

// leads reports whether this router leads, or holds a claim on its sink it is still trying
// to make good (see claimFor).
func (r *Router) leads(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state == ready || !r.claimSince.IsZero() && now.Sub(r.claimSince) < claimFor
}

// peerLeads asks another router's API whether it leads (GET /v1/lead answers 200).
func (r *Router) peerLeads(ctx context.Context, url string) bool {
	if url == "" || url == r.URL() {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, peerTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/lead", nil)
	if err != nil {
		return false
	}
	resp, err := r.cfg.PeerClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	return resp.StatusCode == http.StatusOK
}

// sinkProblem notes why the sink cannot be written (opened, or written to): in the router's
// log and in its record, where `job status` reads it.
func (r *Router) sinkProblem(ctx context.Context, err error) {
	now := time.Now()
	r.mu.Lock()
	changed := r.sinkErr != err.Error()
	if r.sinkErr == "" {
		r.sinkErrSince = now
	}
	r.sinkErr = err.Error()
	since := r.sinkErrSince
	ready := r.ord != nil
	r.mu.Unlock()
	if changed {
		r.log.Warn("the sink cannot be written; retrying", "err", err)
	}
	if ready {
		return // the checkpoint loop saves it with the status
	}
	// Not leading yet: the record says it, in this router's name.
	rec, _, lerr := r.ckpt.load(ctx)
	if lerr != nil {
		return
	}
	rec.Instance, rec.Router, rec.Updated = r.instance, r.URL(), now.UTC()
	rec.Job, rec.Stopped = r.cfg.Job, false
	rec.SinkError, rec.SinkErrorSince = err.Error(), &since
	if serr := r.ckpt.save(ctx, rec); serr != nil {
		r.log.Warn("cannot record the sink's problem", "err", serr)
	}
}

// fatal returns why ctx ended, or nil when its parent was simply cancelled.
func fatal(ctx context.Context) error {
	err := context.Cause(ctx)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}

// evidencer is a sink that leaves evidence of what it wrote (FileSink).
type evidencer interface{ Evidence() *SinkEvidence }

// lastOffsetter is a sink that knows the last offset it holds (FileSink).
type lastOffsetter interface {
	LastOffset(ctx context.Context) (int64, error)
}

// recover sets the first undelivered offset from the checkpoint and the sink, and writes
// the record, which claims it for this router.
func (r *Router) recover(ctx context.Context) error {
	rec, found, err := r.ckpt.load(ctx)
	if err != nil {
		return err
	}
	next := int64(0)
	if found {
		next = rec.Checkpoint + 1
	}
	if lo, ok := r.cfg.Sink.(lastOffsetter); ok {
		last, err := lo.LastOffset(ctx)
		if err != nil {
			return fmt.Errorf("multidc: sink: %w", err)
		}
		switch {
		case last+1 > next:
			// Delivered after the last checkpoint, before a crash: the sink is the truth.
			r.log.Info("sink is ahead of the checkpoint; continuing after the sink", "checkpoint", next-1, "sink", last)
		case last+1 < next:
			r.log.Warn("sink is behind the checkpoint: the offsets between are missing from it (lost with fsync=never, or the sink was replaced)",
				"checkpoint", next-1, "sink", last)
		}
		next = max(next, last+1)
		if _, ok := r.cfg.Sink.(fencing); ok {
			// A fencing sink holds its delivered offset with the rows: it, not the
			// checkpoint, is where this router continues.
			next = last + 1
		}
	}
	r.mu.Lock()
	r.ord = newOrderer(r.cfg.Links, next, r.cfg.Limits)
	r.checkpoint = next - 1
	if found {
		r.failovers = rec.Failovers
		r.lastFailover = rec.LastFailover
		if slices.Contains(r.cfg.Links, rec.Active) {
			r.preferred = rec.Active
			// An operator's choice outlives the router that carried it out.
			r.manual = rec.LastFailover != nil && rec.LastFailover.Reason == ReasonManual && rec.LastFailover.To == rec.Active
		}
	}
	r.mu.Unlock()
	for attempt := 0; ; attempt++ {
		err := r.saveCheckpoint(ctx)
		if err == nil {
			break
		}
		// A leader taken over by evidence may write its record once more before it learns
		// (from its sink or the record) that it is fenced off: the record is this router's.
		if !r.cfg.TakeOver || !errors.Is(err, coord.ErrConflict) || attempt >= 10 {
			return err
		}
		if _, _, err := r.ckpt.load(ctx); err != nil {
			return err
		}
	}
	r.mu.Lock()
	r.state = ready
	r.claimSince = time.Time{}
	r.readyAt = time.Now()
	r.mu.Unlock()
	r.log.Info("router recovered", "nextOffset", next, "checkpointFound", found, "previousActive", r.preferred)
	return nil
}

// deliverLoop writes the active link's records to the sink, in order, as they become
// contiguous. It is the only caller of peek, commit and Sink.Write.
func (r *Router) deliverLoop(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	for {
		r.mu.Lock()
		batch := r.ord.peek(r.cfg.MaxBatch)
		r.mu.Unlock()
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-r.kick:
			}
			continue
		}
		if err := r.cfg.Sink.Write(ctx, batch); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, ErrSinkBroken) || errors.Is(err, ErrFenced) {
				return err
			}
			r.m.sinkErrors.Inc()
			r.sinkProblem(ctx, err)
			r.log.Debug("sink write failed; retrying", "first", batch[0].Offset, "records", len(batch), "err", err, "backoff", backoff)
			if ctxtime.Sleep(ctx, backoff) != nil {
				return nil
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		now := time.Now()
		r.mu.Lock()
		if r.sinkErr != "" {
			r.log.Info("the sink is written again", "after", now.Sub(r.sinkErrSince).Round(time.Millisecond))
			r.sinkErr = ""
		}
		err := r.ord.commit(batch)
		r.mu.Unlock()
		if err != nil {
			return err // a bug: the sink has records the orderer did not hand out
		}
		for _, rec := range batch {
			r.m.latency.Observe(now.Sub(rec.received).Seconds())
		}
	}
}

// healthLoop checks the active link's heartbeats several times per timeout and fails over.
func (r *Router) healthLoop(ctx context.Context) {
	every := min(max(min(r.cfg.HeartbeatTimeout, r.cfg.CloseGrace)/10, 5*time.Millisecond), 50*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			r.mu.Lock()
			switched := r.checkHealthLocked(now)
			r.mu.Unlock()
			if switched {
				r.wake()
			}
		}
	}
}

// checkHealthLocked chooses the active link: the first one once links heartbeat, and
// another one when the active link's heartbeats stop. It reports whether it switched.
func (r *Router) checkHealthLocked(now time.Time) bool {
	r.checkSpuriousLocked(now)
	act := r.ord.active
	if act != nil && r.live.alive(act.name, now) {
		return r.keepApartLocked(now)
	}
	alive := func(name string) bool { return (act == nil || name != act.name) && r.live.alive(name, now) }
	if act == nil && r.preferred != "" && alive(r.preferred) {
		// A router that took over: the link that was active goes on at once, an
		// operator's choice still one.
		manual := r.manual
		r.switchLocked(r.preferred, ReasonHeartbeat, now)
		r.manual = manual
		return true
	}
	if act == nil {
		// At start, give every link one timeout to show up, so that the previous active
		// link (or the first configured one) is chosen rather than the quickest.
		all := true
		for _, l := range r.cfg.Links {
			all = all && r.live.alive(l, now)
		}
		if !all && now.Sub(r.readyAt) < r.cfg.HeartbeatTimeout {
			return false
		}
	}
	to := r.ord.mostAdvanced(func(name string) bool { return alive(name) && name != r.cfg.DC })
	if own := r.ord.mostAdvanced(alive); to == "" || (act != nil && r.ord.byName[own].mark > r.ord.byName[to].mark && r.ord.run(r.ord.byName[to]) == 0) {
		// The link in the router's own data center only when no other one is alive, or
		// when, in a failover, it alone holds the next record.
		to = own
	}
	if to == "" {
		return false // nobody better: keep the (dead) active link, it may come back
	}
	if act == nil && r.preferred != "" && alive(r.preferred) && r.ord.byName[r.preferred].mark >= r.ord.byName[to].mark {
		to = r.preferred
	}
	r.switchLocked(to, ReasonHeartbeat, now)
	return true
}

// keepApartLocked switches a live active link in the router's own data center to a live
// link in another one that can take over without holding the sink back: it holds at least
// a whole batch from the next offset, or all the active link holds. A switch loses and
// doubles nothing (the orderer hands out each offset once whatever the link); it is counted
// as a failover for ReasonApart. An operator's choice is kept. It reports whether it switched.
func (r *Router) keepApartLocked(now time.Time) bool {
	act := r.ord.active
	if r.cfg.DC == "" || act.name != r.cfg.DC || r.manual {
		return false
	}
	to := r.ord.mostAdvanced(func(name string) bool { return name != act.name && r.live.alive(name, now) })
	if to == "" {
		return false
	}
	if l := r.ord.byName[to]; l.mark < act.mark && r.ord.run(l) < int64(r.cfg.MaxBatch) {
		return false
	}
	r.switchLocked(to, ReasonApart, now)
	return true
}

// switchLocked makes to the active link.
func (r *Router) switchLocked(to, reason string, now time.Time) {
	from := r.ord.activeName()
	_ = r.ord.failover(to) // to is a configured link
	r.manual = reason == ReasonManual
	if from == "" && (r.preferred == "" || r.preferred == to) {
		r.log.Info("active link chosen", "link", to, "nextOffset", r.ord.next)
		return
	}
	if from == "" {
		// A router that took over from another, whose active link no longer heartbeats:
		// the sink's link changes as in any failover.
		from = r.preferred
	}
	r.failovers++
	r.m.failovers.WithLabelValues(reason).Inc()
	r.lastFailover = &Failover{From: from, To: to, Reason: reason, At: now.UTC(), NextOffset: r.ord.next}
	if reason == ReasonHeartbeat && r.ord.activeName() != from {
		r.suspect = r.lastFailover
		r.suspectBeat, _ = r.live.oldest(from, now)
	}
	r.switched = true // the masters' events learn of it from the record
	r.log.Warn("failover", "from", from, "to", to, "reason", reason, "nextOffset", r.ord.next,
		"run", r.ord.run(r.ord.active))
}

// spuriousSilence is how long at most the link failed over for its heartbeats may have been
// silent for the failover to count as spurious: its workers were late, not gone (a loaded
// machine, a pause), and beat again within two timeouts of their last beat. A worker that
// died and was started again is silent longer. A spurious failover loses nothing; it is
// counted, so that the heartbeat timeout can be judged against the machines' load.
func (r *Router) spuriousSilence() time.Duration { return 2 * r.cfg.HeartbeatTimeout }

// checkSpuriousLocked counts the last heartbeat failover as spurious when the link it left
// is alive again within spuriousSilence of its last beat.
func (r *Router) checkSpuriousLocked(now time.Time) {
	f := r.suspect
	if f == nil {
		return
	}
	silent := now.Sub(r.suspectBeat)
	switch {
	case silent > r.spuriousSilence():
		r.suspect = nil
	case r.live.alive(f.From, now):
		r.suspect = nil
		r.spurious++
		r.m.spurious.Inc()
		r.log.Warn("spurious failover: the link failed over for its heartbeats was alive again at once (its workers were late, not gone)",
			"link", f.From, "silentFor", silent.Round(time.Millisecond), "heartbeatTimeout", r.cfg.HeartbeatTimeout)
	}
}

// Failover makes to the active link by hand; with to == "" it picks the most advanced live
// standby. The target must be alive.
func (r *Router) Failover(to string) (Status, error) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != ready {
		return Status{}, errNotReady
	}
	act := r.ord.activeName()
	if to == "" {
		to = r.ord.mostAdvanced(func(n string) bool { return n != act && r.live.alive(n, now) })
		if to == "" {
			return Status{}, fmt.Errorf("%w: no live standby link to fail over to", api.ErrConflict)
		}
	}
	if _, ok := r.ord.byName[to]; !ok {
		return Status{}, fmt.Errorf("%w: unknown link %q (the router of job %s has %v)", api.ErrBadInput, to, r.cfg.Job, r.cfg.Links)
	}
	if to != act {
		if !r.live.alive(to, now) {
			return Status{}, fmt.Errorf("%w: link %q is not alive (its workers do not heartbeat): it would be failed over again at once", api.ErrConflict, to)
		}
		r.switchLocked(to, ReasonManual, now)
		r.wake()
	}
	return r.statusLocked(now), nil
}

// Status returns the router's status.
func (r *Router) Status() (Status, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ord == nil {
		return Status{}, errNotReady
	}
	return r.statusLocked(time.Now()), nil
}

// checkpointLoop saves the delivered offset when it moved, and the status now and then.
func (r *Router) checkpointLoop(ctx context.Context) error {
	t := time.NewTicker(r.cfg.CheckpointInterval)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			r.mu.Lock()
			moved := r.ord.next-1 != r.checkpoint || r.switched
			r.switched = false
			r.mu.Unlock()
			if !moved && now.Sub(last) < r.cfg.StatusInterval {
				continue
			}
			if err := r.saveCheckpoint(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				if errors.Is(err, coord.ErrConflict) || errors.Is(err, ErrSinkBroken) {
					return err
				}
				r.log.Warn("checkpoint failed; retrying", "err", err)
				continue
			}
			last = now
		}
	}
}

// saveCheckpoint syncs the sink up to the delivered offset and then saves that offset, so
// the checkpoint never covers records the sink could still lose.
func (r *Router) saveCheckpoint(ctx context.Context) error {
	r.mu.Lock()
	delivered := r.ord.next - 1
	r.mu.Unlock()
	if err := r.cfg.Sink.Sync(ctx); err != nil {
		return fmt.Errorf("multidc: sync sink: %w", err)
	}
	r.mu.Lock()
	st := r.statusLocked(time.Now())
	r.mu.Unlock()
	st.Checkpoint = delivered
	r.mu.Lock()
	rec := RouterRecord{Status: st, Instance: r.instance, Stopped: r.stopped}
	r.mu.Unlock()
	if ev, ok := r.cfg.Sink.(evidencer); ok {
		rec.Sink = ev.Evidence()
	}
	if err := r.ckpt.save(ctx, rec); err != nil {
		return err
	}
	r.mu.Lock()
	r.checkpoint = delivered
	r.mu.Unlock()
	return nil
}

// connKey keys the request context's net.Conn.
type connKey struct{}

// noteConnLocked remembers that the request's connection carries the worker, so that its
// closing can be told to liveness.
func (r *Router) noteConnLocked(req *http.Request, k beatKey) {
	c, ok := req.Context().Value(connKey{}).(net.Conn)
	if !ok {
		return
	}
	if ks := r.conns[c]; !slices.Contains(ks, k) {
		r.conns[c] = append(ks, k)
	}
}

func (r *Router) connState(c net.Conn, st http.ConnState) {
	if st != http.StateClosed && st != http.StateHijacked {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range r.conns[c] {
		r.live.connClosed(k.link, k.worker, now)
	}
	delete(r.conns, c)
}

// wake nudges the delivery loop.
func (r *Router) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}
