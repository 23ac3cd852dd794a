// Package clusterbench measures the control plane at cluster scale: a real master and a real
// ZooKeeper with thousands of simulated agents (package agents/sim), for `stormdock bench cluster`.
package clusterbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/stormdock/stormdock/agents/sim"
	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/ctxtime"
	sdmaster "github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/jobmetrics"
	"github.com/stormdock/stormdock/placement/synth"
)

// Config describes one benchmark run.
type Config struct {
	// Store is the ZooKeeper to measure (zk://HOST:PORT[/CHROOT]); the run works under a
	// fresh chroot below it and removes it at the end.
	Store string
	// StoreTLS names a zks:// store's TLS files, for the master, the simulated agents and
	// the four-letter words.
	StoreTLS coord.TLSFiles
	// Nodes, spread evenly over DCs x Racks (per dc); Slots per node (memory 4Gi and cpu 2
	// per slot).
	Nodes, DCs, Racks, Slots int
	// Workers over Jobs jobs (sizes vary around the mean, spread over dc and rack).
	Workers, Jobs int
	// NodesPerSession is how many nodes of one rack share a ZooKeeper session (see
	// session.go); 0 or 1: a session per node, as real agents hold.
	NodesPerSession int
	// Heartbeat and Churn of the simulated agents (see sim.Config).
	Heartbeat time.Duration
	Churn     float64
	// SessionTimeout of the master's and the agents' sessions.
	SessionTimeout time.Duration
	// Steady is how long steady state is measured; Poll how long the API pollers run.
	Steady, Poll time.Duration
	// Pollers is how many clients poll `job list` and `job status` at once.
	Pollers int
	// Settle bounds the wait for each phase to complete.
	Settle time.Duration
	// MasterBinary, when set, runs the master as `MasterBinary master ...`, a process of its
	// own; otherwise it runs in this process (its memory and cpu then include the agents').
	MasterBinary string
	// ClientBinary, when set, runs the API's clients, the submission and the pollers, as
	// `ClientBinary bench submit` and `ClientBinary bench poll` (see SubmitCommand), processes
	// of their own; otherwise they run in this process, where they wait for the agents'
	// scheduler and collector.
	ClientBinary string
	// MetricsSeries is how many series each simulated worker serves (half gauges, half
	// counters; the five an agent measures come on top): the agents then serve job metrics
	// and the master pulls them every MetricsInterval (its --metrics-interval; default 10s,
	// negative: off). 0 serves none.
	MetricsSeries   int
	MetricsInterval time.Duration
	// MasterMemoryLimit is the master's --memory-limit (a process: MasterBinary), "" none.
	MasterMemoryLimit string
	// Pin puts the master (a process: MasterBinary) on a core of its own and this process
	// (the agents), with ZooKeeper when it runs on this machine, on the other cores (see
	// pinning). With one core free nothing is pinned, and the report says so.
	Pin bool
	// SkipDC skips the data-center loss.
	SkipDC bool
	// ProfileDir, when set, receives the master's profiles (see Profiles): a heap profile
	// when each phase settled and a cpu profile of ProfileSpan (default 10s) from the
	// start of each event.
	ProfileDir  string
	ProfileSpan time.Duration
	Seed        uint64
	// Progress receives a line per step; nil for none.
	Progress io.Writer
	Logger   *slog.Logger
}

// Report is what a run measured. Durations are in seconds.
type Report struct {
	Nodes   int    `json:"nodes"`
	Workers int    `json:"workers"`
	Jobs    int    `json:"jobs"`
	DCs     int    `json:"dcs"`
	Racks   int    `json:"racksPerDC"`
	Slots   int    `json:"slots"`
	Master  string `json:"master"` // "process" or "in-process"
	// Hosting says how the simulated agents ran; Pinning which cores the master, the agents
	// and ZooKeeper ran on ("" when not asked).
	Hosting  string `json:"hosting"`
	Sessions int    `json:"agentSessions"`
	Pinning  string `json:"pinning,omitempty"`
	// MasterProcs is the master's GOMAXPROCS (one when pinned to one core).
	MasterProcs int `json:"masterGOMAXPROCS"`
	// Register is from the first agent's start to every node registered; AgentsRSS the bench
	// process's resident memory high-water mark after it (agents and, in process, master).
	Register float64 `json:"registerSeconds"`
	BenchRSS int64   `json:"benchPeakRSSBytes"`
	// BenchCPU is the bench process's cpu seconds over the run: the agents' (and, in
	// process, the master's).
	BenchCPU  float64 `json:"benchCPUSeconds"`
	Heartbeat float64 `json:"heartbeatSeconds"`

	Submit Phase `json:"submit"`
	// APIRunning is from the first submission to `job list` reporting every worker running.
	APIRunning float64 `json:"apiAllRunningSeconds"`
	// StartedTwice counts workers started more than once (0 is correct).
	StartedTwice int `json:"startedTwice"`

	Steady Steady `json:"steady"`
	// Metrics is the master's job metrics when the agents serve them.
	Metrics *Metrics `json:"metrics,omitempty"`
	Store   Store    `json:"store"`
	Poll    Poll     `json:"poll"`
	Rack    Phase    `json:"rackLoss"`
	DC      *Phase   `json:"dcLoss,omitempty"`

	// AgentSessionsExpired counts simulated agents' sessions that expired over the run
	// (the bench process too slow to keep them): not 0 means the machine could not hold
	// this many agents, and the figures are of a cluster whose nodes came and went.
	AgentSessionsExpired int `json:"agentSessionsExpired"`

	// Profiles are the master's profiles the run took; nil without Config.ProfileDir.
	Profiles *Profiles `json:"profiles,omitempty"`

	MasterPeakRSS int64   `json:"masterPeakRSSBytes"`
	MasterCPU     float64 `json:"masterCPUSeconds"`
	Total         float64 `json:"totalSeconds"`
}

// Phase is one event: a submission or a loss, from its start to its workers assigned and
// acknowledged running by their agents.
type Phase struct {
	What     string  `json:"what"`
	Workers  int     `json:"workers"`  // workers it concerns
	Assigned float64 `json:"assigned"` // seconds to the last of them assigned
	Acked    float64 `json:"acked"`    // seconds to the last of them acknowledged running
	// Closed is, for a loss, the seconds until the store had closed every lost session:
	// the loss itself, which the other figures include.
	Closed float64 `json:"closed,omitempty"`
	// Left counts workers still not assigned and acknowledged when the phase ended;
	// Unplaced of them the master reported it could not place (no capacity left).
	Left     int `json:"left"`
	Unplaced int `json:"unplaced"`
	// OthersMoved and OthersRestarted count workers outside the loss that were assigned
	// elsewhere or started again (0 is what a loss of spare capacity should do).
	OthersMoved     int `json:"othersMoved"`
	OthersRestarted int `json:"othersRestarted"`
	// MovedTwice counts the lost domain's workers started more than once before the phase
	// ended: moved on, and moved again (0 is correct).
	MovedTwice int     `json:"movedTwice"`
	MasterCPU  float64 `json:"masterCPUSeconds"`
	ZK         Rates   `json:"zookeeper"`
	// Reconciles the leader ran meanwhile, their mean duration, and the processor time they
	// took on their own thread (seconds): the master's cost of the event itself.
	Reconciles      int     `json:"reconciles"`
	ReconcileMeanMs float64 `json:"reconcileMeanMs"`
	ReconcileCPU    float64 `json:"reconcileCPUSeconds"`
	// ReconcileSteps is the reconciles' wall time by step (the master's ReconcilePhases), seconds.
	ReconcileSteps map[string]float64 `json:"reconcileStepSeconds,omitempty"`
}

// Steady is the cluster left alone.
type Steady struct {
	ZK Rates `json:"zookeeper"`
	// AgentWrites counts the simulated agents' record writes per node per heartbeat.
	AgentWritesPerNodePerHeartbeat float64 `json:"agentWritesPerNodePerHeartbeat"`
	// WritesPerNodePerHeartbeat is every ZooKeeper write under the chroot, per node per
	// heartbeat: the master's included.
	WritesPerNodePerHeartbeat float64 `json:"writesPerNodePerHeartbeat"`
	MasterCPU                 float64 `json:"masterCPUSeconds"`
}

// Metrics is what the master's job metrics cost: collection, history and the API.
type Metrics struct {
	IntervalSeconds float64 `json:"intervalSeconds"`
	SeriesPerWorker int     `json:"seriesPerWorker"`
	// Covered is from the last submission to every job's series in the master's history.
	Covered float64 `json:"coveredSeconds"`
	// Series and HistoryBytes are what the master keeps (its stormdock_master_job_metrics_*).
	Series         int64   `json:"series"`
	HistoryBytes   int64   `json:"historyBytes"`
	BytesPerSeries float64 `json:"bytesPerSeries"`
	// Rounds and RoundMeanSeconds are the master's rounds over the steady state, NodeFailures
	// the nodes it could not read in them; Answers the agents' answers served.
	Rounds           int     `json:"rounds"`
	RoundMeanSeconds float64 `json:"roundMeanSeconds"`
	NodeFailures     int     `json:"nodeFailures"`
	Answers          int64   `json:"answers"`
}

// Store is what ZooKeeper holds at steady state.
type Store struct {
	Znodes          int64 `json:"znodes"`
	DataBytes       int64 `json:"dataBytes"`
	Watches         int64 `json:"watches"`
	Connections     int64 `json:"connections"`
	Ephemerals      int64 `json:"ephemerals"`
	LargestAssign   int   `json:"largestAssignmentBytes"`
	LargestNode     int   `json:"largestNodeRecordBytes"`
	LargestJob      int   `json:"largestJobRecordBytes"`
	AssignmentBytes int64 `json:"assignmentBytes"` // all assignments together
}

// Poll is the API's latency while Pollers clients poll.
type Poll struct {
	Clients int `json:"clients"`
	// Where the clients ran: in a process of their own (Config.ClientBinary), or in the
	// agents' process, where they wait for its collector and scheduler.
	Where     string  `json:"clientsRan"`
	Seconds   float64 `json:"seconds"`
	ListP50   float64 `json:"jobListP50Ms"`
	ListP99   float64 `json:"jobListP99Ms"`
	StatusP50 float64 `json:"jobStatusP50Ms"`
	StatusP99 float64 `json:"jobStatusP99Ms"`
	// Server* are the same as the master measured them, from when its handler got the
	// request to when it wrote the answer (stormdock_master_api_request_duration_seconds,
	// within a bucket's precision): what is left of the client's figures is the wait of
	// the client's machine and the connection.
	ServerListP50   float64 `json:"serverJobListP50Ms"`
	ServerListP99   float64 `json:"serverJobListP99Ms"`
	ServerStatusP50 float64 `json:"serverJobStatusP50Ms"`
	ServerStatusP99 float64 `json:"serverJobStatusP99Ms"`
	// MetricsP50 and MetricsP99 are `job metrics` (a job's whole history), when the agents
	// serve metrics.
	MetricsP50 float64 `json:"jobMetricsP50Ms,omitempty"`
	MetricsP99 float64 `json:"jobMetricsP99Ms,omitempty"`
	Requests   int     `json:"requests"`
	Errors     int     `json:"errors"`
	MasterCPU  float64 `json:"masterCPUSeconds"`
}

func (c *Config) defaults() error {
	var bad []string
	for name, v := range map[string]int{"nodes": c.Nodes, "workers": c.Workers, "dcs": c.DCs, "racks": c.Racks, "slots": c.Slots} {
		if v < 1 {
			bad = append(bad, fmt.Sprintf("--%s must be at least 1", name))
		}
	}
	if c.Jobs <= 0 {
		c.Jobs = max(1, c.Workers/100)
	}
	if c.Workers < c.Jobs {
		bad = append(bad, "--workers must be at least --jobs")
	}
	if c.Nodes < c.DCs*c.Racks {
		bad = append(bad, fmt.Sprintf("--nodes must be at least --dcs x --racks (%d)", c.DCs*c.Racks))
	}
	if c.Nodes > 0 && c.Slots > 0 && c.Workers > c.Nodes*c.Slots {
		bad = append(bad, fmt.Sprintf("--workers (%d) must fit in --nodes x --slots (%d)", c.Workers, c.Nodes*c.Slots))
	}
	t, err := coord.ParseURL(c.Store)
	if err != nil {
		bad = append(bad, fmt.Sprintf("--store: %v", err))
	} else if t.Scheme != "zk" {
		bad = append(bad, "--store must be a ZooKeeper URL (zk://HOST:PORT): the benchmark measures ZooKeeper")
	}
	if c.NodesPerSession < 0 {
		bad = append(bad, "--nodes-per-session must be at least 1")
	}
	if c.Pin && c.MasterBinary == "" {
		bad = append(bad, "--pin needs the master as a process of its own (--master process)")
	}
	if len(bad) > 0 {
		return errors.New(strings.Join(bad, "\n"))
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = sim.DefaultHeartbeat
	}
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = 10 * time.Second
	}
	if c.Steady <= 0 {
		c.Steady = 10 * time.Second
	}
	if c.Poll <= 0 {
		c.Poll = 10 * time.Second
	}
	if c.Pollers <= 0 {
		c.Pollers = 10
	}
	if c.Settle <= 0 {
		c.Settle = 5 * time.Minute
	}
	if c.ProfileSpan <= 0 {
		c.ProfileSpan = 10 * time.Second
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// Check validates cfg as Run would, without running anything.
func Check(cfg Config) error { return cfg.defaults() }

// run is one benchmark in progress.
type run struct {
	cfg     Config
	rep     *Report
	zkAddr  string
	dial    dialFunc // to the server, for four-letter words (over TLS for zks://)
	ns      string   // the chroot's first segment: ZooKeeper counts writes per namespace
	url     string   // the store URL with the run's chroot
	admin   coord.Store
	master  *master
	cl      *api.Client
	tr      *tracker
	nodes   []cluster.Node
	groups  [][]int // indexes in nodes of the nodes sharing each session
	jobs    []cluster.JobSpec
	keys    []cluster.WorkerKey
	agentMu sync.Mutex
	agents  map[string]*sim.Agent
	metrics *sim.Metrics // the agents' metrics endpoint, when they serve metrics
}

func (r *run) logf(format string, args ...any) {
	if r.cfg.Progress != nil {
		fmt.Fprintf(r.cfg.Progress, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
	}
}

// Run runs the benchmark and returns what it measured.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	began := time.Now()
	t, _ := coord.ParseURL(cfg.Store)
	r := &run{cfg: cfg, zkAddr: t.Servers[0], tr: newTracker(), agents: map[string]*sim.Agent{}}
	if t.TLS {
		var err error
		if r.dial, err = cfg.StoreTLS.ProbeDialer(nil); err != nil {
			return nil, fmt.Errorf("--store: %w", err)
		}
	}
	r.workload()
	r.groups = groups(r.nodes, cfg.NodesPerSession)
	if err := checkFiles(len(r.groups)); err != nil {
		return nil, err
	}
	if err := checkServer(ctx, r.dial, r.zkAddr, len(r.groups)+8); err != nil {
		return nil, err
	}
	chroot := fmt.Sprintf("%s/stormdock-bench-%x", t.Chroot, rand.Uint32())
	r.ns = strings.SplitN(strings.TrimPrefix(chroot, "/"), "/", 2)[0]
	t.Chroot = chroot
	r.url = t.String()
	if t.Credentials != "" {
		return nil, errors.New("--store: the benchmark runs without ZooKeeper credentials; give a server without ACLs")
	}
	r.rep = &Report{Nodes: cfg.Nodes, Workers: cfg.Workers, Jobs: cfg.Jobs, DCs: cfg.DCs, Racks: cfg.Racks, Slots: cfg.Slots,
		Heartbeat: cfg.Heartbeat.Seconds(), Master: "in-process",
		Hosting: fmt.Sprintf("%d goroutine agents in one process, one ZooKeeper connection and session each (%d KiB client buffers)", cfg.Nodes, sim.DefaultBufferSize>>10)}
	if len(r.groups) < cfg.Nodes {
		r.rep.Hosting = fmt.Sprintf("%d goroutine agents in one process over %d ZooKeeper connections and sessions, up to %d nodes of one rack on each (%d KiB client buffers)",
			cfg.Nodes, len(r.groups), cfg.NodesPerSession, sim.DefaultBufferSize>>10)
	}
	r.rep.Sessions = len(r.groups)
	if cfg.MasterBinary != "" {
		r.rep.Master = "process"
	}
	if cfg.ProfileDir != "" {
		if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
			return nil, fmt.Errorf("profiles: %w", err)
		}
		r.rep.Profiles = &Profiles{Dir: cfg.ProfileDir, Files: []ProfileFile{}}
	}
	var err error
	r.admin, err = coord.Open(ctx, r.url, coord.Options{SessionTimeout: cfg.SessionTimeout, Logger: cfg.Logger, TLS: cfg.StoreTLS})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", r.url, err)
	}
	defer r.cleanup()
	dir, err := os.MkdirTemp("", "stormdock-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	r.logf("store %s; master (%s) data in %s", r.url, r.rep.Master, dir)
	var pin *pinning
	if cfg.Pin {
		if pin, r.rep.Pinning, err = planPinning(); err != nil {
			return nil, err
		}
	}
	if r.master, err = startMaster(ctx, cfg, r.url, dir, pin); err != nil {
		return nil, err
	}
	if pin != nil {
		defer pin.release()
		if err := pin.pinRest(r.zkAddr); err != nil {
			return nil, err
		}
		r.rep.Pinning = pin.note
	}
	if rt, err := r.master.runtime(ctx); err == nil {
		r.rep.MasterProcs = rt.GOMAXPROCS
	}
	if r.rep.Pinning != "" {
		r.logf("%s; the master runs with GOMAXPROCS=%d", r.rep.Pinning, r.rep.MasterProcs)
	}
	defer func() {
		if r.master != nil {
			_ = r.master.stop()
		}
	}()
	if r.cl, err = api.NewClient(r.master.url, r.master.token); err != nil {
		return nil, err
	}
	if err := r.register(ctx); err != nil {
		return nil, err
	}
	if err := r.submit(ctx); err != nil {
		return nil, err
	}
	if err := r.collected(ctx); err != nil {
		return nil, err
	}
	if err := r.steady(ctx); err != nil {
		return nil, err
	}
	if err := r.poll(ctx); err != nil {
		return nil, err
	}
	if err := r.loseRack(ctx); err != nil {
		return nil, err
	}
	if !cfg.SkipDC && cfg.DCs > 1 {
		if err := r.loseDC(ctx); err != nil {
			return nil, err
		}
	}
	if u, err := procUsage(r.master.pid); err == nil {
		r.rep.MasterPeakRSS, r.rep.MasterCPU = u.peakRSS, round(u.cpu.Seconds(), 2)
	}
	r.rep.AgentSessionsExpired += r.expired()
	if u, err := procUsage(0); err == nil {
		r.rep.BenchRSS, r.rep.BenchCPU = u.peakRSS, round(u.cpu.Seconds(), 1)
	}
	r.rep.Total = round(time.Since(began).Seconds(), 1)
	return r.rep, nil
}

// workload makes the cluster's nodes and the jobs.
func (r *run) workload() {
	c := r.cfg
	pc := synth.Config{DCs: c.DCs, RacksPerDC: c.Racks, NodesPerRack: max(1, c.Nodes/(c.DCs*c.Racks)), Slots: c.Slots,
		Memory: cluster.Bytes(c.Slots) * 4 << 30, CPU: cluster.CPU(c.Slots * 2000), Jobs: c.Jobs, Workers: c.Workers,
		Spread: []string{cluster.DomainDC, cluster.DomainRack}, Seed: c.Seed}
	all := pc.Nodes()
	// Nodes that do not divide evenly: the first racks get one more.
	for i := len(all); i < c.Nodes; i++ {
		d, rk := (i/c.Racks)%c.DCs, i%c.Racks
		all = append(all, cluster.Node{ID: synth.NodeID(d, rk, pc.NodesPerRack+i/(c.DCs*c.Racks)), DC: synth.DCName(d),
			Rack: synth.RackName(rk), Slots: c.Slots, Memory: pc.Memory, CPU: pc.CPU})
	}
	r.nodes = all[:c.Nodes]
	for i := range r.nodes {
		r.nodes[i].Host = r.nodes[i].ID
	}
	r.jobs = pc.JobSpecs()
	for i := range r.jobs {
		r.jobs[i].Command = []string{"true"}
		r.jobs[i].GracePeriod = cluster.Duration(time.Second)
		r.keys = append(r.keys, r.jobs[i].Keys()...)
	}
}

// register starts every simulated agent and waits until the master lists every node.
func (r *run) register(ctx context.Context) error {
	start := time.Now()
	// A loaded server takes seconds to open a session (each is a logged transaction): the
	// agents wait for theirs longer than a daemon would.
	scfg := sim.Config{Store: r.url, Options: coord.Options{SessionTimeout: r.cfg.SessionTimeout, ConnectTimeout: time.Minute, Logger: r.cfg.Logger, TLS: r.cfg.StoreTLS},
		Heartbeat: r.cfg.Heartbeat, Churn: r.cfg.Churn, Events: r.tr, Logger: r.cfg.Logger}
	scfg.Options.BufferSize = sim.DefaultBufferSize
	if r.cfg.MetricsSeries > 0 {
		m, err := sim.NewMetrics(r.admin, r.cfg.MetricsSeries)
		if err != nil {
			return err
		}
		r.metrics, scfg.Metrics = m, m
	}
	r.logf("starting %d simulated agents on %d sessions", len(r.nodes), len(r.groups))
	if err := parallel(ctx, len(r.groups), 32, func(g int) error {
		cfg := scfg
		if len(r.groups[g]) > 1 {
			sess := &session{open: func(ctx context.Context) (coord.Store, error) { return coord.Open(ctx, scfg.Store, scfg.Options) }}
			cfg.Open = sess.get
		}
		for _, i := range r.groups[g] {
			a, err := sim.Start(ctx, cfg, r.nodes[i])
			// A server slow beyond the session's timeout drops the connection: a failed
			// start left nothing behind (its session is closed), so it is tried again.
			for try := 1; err != nil && try < 3 && ctx.Err() == nil; try++ {
				r.logf("agent %s: %v; trying again", r.nodes[i].ID, err)
				a, err = sim.Start(ctx, cfg, r.nodes[i])
			}
			if err != nil {
				return err
			}
			r.agentMu.Lock()
			r.agents[r.nodes[i].ID] = a
			r.agentMu.Unlock()
		}
		return nil
	}); err != nil {
		return err
	}
	if err := r.until(ctx, "the master lists every node", func() (bool, error) {
		ns, err := r.cl.Nodes(ctx)
		return len(ns) == len(r.nodes), err
	}); err != nil {
		return err
	}
	r.rep.Register = round(time.Since(start).Seconds(), 2)
	if u, err := procUsage(0); err == nil {
		r.rep.BenchRSS = u.peakRSS
	}
	r.logf("%d nodes registered in %.1fs; bench process peak RSS %s", len(r.nodes), r.rep.Register, mib(r.rep.BenchRSS))
	// Tenants the jobs belong to.
	seen := map[string]bool{}
	for _, j := range r.jobs {
		if !seen[j.Tenant] {
			seen[j.Tenant] = true
			if err := r.cl.CreateTenant(ctx, cluster.Tenant{Name: j.Tenant, MaxPriority: cluster.MaxPriority}); err != nil && !errors.Is(err, api.ErrExists) {
				return fmt.Errorf("create tenant %s: %w", j.Tenant, err)
			}
		}
	}
	return nil
}

// submit submits every job and waits for every worker to be assigned and acknowledged.
func (r *run) submit(ctx context.Context) error {
	before, err := r.mark(ctx)
	if err != nil {
		return err
	}
	where := "from the agents' process"
	if r.cfg.ClientBinary != "" {
		where = "from a process of its own"
	}
	r.logf("submitting %d jobs, %d workers, %s", len(r.jobs), len(r.keys), where)
	r.startCPU(ctx, "submit")
	defer r.endCPU()
	start := time.Now()
	spec := SubmitSpec{URL: r.master.url, Token: r.master.token, Parallel: 8}
	for _, j := range r.jobs {
		b, _ := json.Marshal(j)
		spec.Jobs = append(spec.Jobs, b)
	}
	var err2 error
	if r.cfg.ClientBinary != "" {
		var res SubmitResult
		err2 = runApart(ctx, r.cfg.ClientBinary, SubmitCommand, spec, &res)
	} else {
		_, err2 = Submit(ctx, spec)
	}
	if err2 != nil {
		return fmt.Errorf("submit: %w", err2)
	}
	r.logf("submitted in %.1fs", time.Since(start).Seconds())
	p, err := r.settle(ctx, "submit", start, r.keys, before)
	if err != nil {
		return err
	}
	r.rep.Submit = p
	r.rep.StartedTwice = r.tr.startedTwice()
	if err := r.until(ctx, "job list reports every worker running", func() (bool, error) {
		js, err := r.cl.Jobs(ctx)
		running := 0
		for _, j := range js {
			running += j.Running
		}
		return running == len(r.keys), err
	}); err != nil {
		return err
	}
	r.rep.APIRunning = round(time.Since(start).Seconds(), 2)
	r.logf("job list: all %d running after %.1fs", len(r.keys), r.rep.APIRunning)
	r.endCPU()
	r.heapProfile(ctx, "submit")
	return nil
}

// steady measures the cluster left alone, then what the store holds.
func (r *run) steady(ctx context.Context) error {
	// Let the submission's last writes drain first.
	time.Sleep(2 * r.cfg.Heartbeat)
	a, err := r.mark(ctx)
	if err != nil {
		return err
	}
	w0 := r.agentWrites()
	r.logf("steady state for %s", r.cfg.Steady)
	time.Sleep(r.cfg.Steady)
	b, err := r.mark(ctx)
	if err != nil {
		return err
	}
	w1 := r.agentWrites()
	rt := rates(a.zk, b.zk)
	beats := rt.Seconds / r.cfg.Heartbeat.Seconds()
	n := float64(len(r.nodes))
	r.rep.Steady = Steady{ZK: rt, MasterCPU: round((b.cpu - a.cpu).Seconds(), 2),
		AgentWritesPerNodePerHeartbeat: round(float64(w1-w0)/n/beats, 3),
		WritesPerNodePerHeartbeat:      round(float64(b.zk.nsWrites-a.zk.nsWrites)/n/beats, 3)}
	r.rep.Store = Store{Znodes: b.zk.znodes, DataBytes: b.zk.dataBytes, Watches: b.zk.watches, Connections: b.zk.conns, Ephemerals: b.zk.ephemerals}
	if m := r.rep.Metrics; m != nil {
		m.Rounds = int(b.metrics["stormdock_master_job_metrics_round_seconds_count"] - a.metrics["stormdock_master_job_metrics_round_seconds_count"])
		if m.Rounds > 0 {
			m.RoundMeanSeconds = round((b.metrics["stormdock_master_job_metrics_round_seconds_sum"]-a.metrics["stormdock_master_job_metrics_round_seconds_sum"])/float64(m.Rounds), 3)
		}
		m.NodeFailures = int(b.metrics["stormdock_master_job_metrics_node_failures_total"] - a.metrics["stormdock_master_job_metrics_node_failures_total"])
		m.Series, m.HistoryBytes = int64(b.metrics["stormdock_master_job_metrics_series"]), int64(b.metrics["stormdock_master_job_metrics_history_bytes"])
		if m.Series > 0 {
			m.BytesPerSeries = round(float64(m.HistoryBytes)/float64(m.Series), 1)
		}
		m.Answers = r.metrics.Answers()
		r.logf("job metrics: %d series kept, %s of history (%.0f B a series); %d rounds of %.2fs on average, %d node failures; master cpu %.2fs over %.0fs",
			m.Series, mib(m.HistoryBytes), m.BytesPerSeries, m.Rounds, m.RoundMeanSeconds, m.NodeFailures, r.rep.Steady.MasterCPU, rt.Seconds)
	}
	r.logf("steady: %.0f ZooKeeper writes/s, %.3f per node per heartbeat; %d znodes, %s", rt.WritesPerSecond,
		r.rep.Steady.WritesPerNodePerHeartbeat, b.zk.znodes, mib(b.zk.dataBytes))
	return r.recordSizes(ctx)
}

// recordSizes reads every assignment and the job and node records: the largest of each, and
// every worker assigned exactly once.
func (r *run) recordSizes(ctx context.Context) error {
	names, err := r.admin.Children(ctx, cluster.AssignmentsKey)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	seen := map[cluster.WorkerKey]string{}
	var dup []string
	err = parallel(ctx, len(names), 16, func(i int) error {
		e, err := r.admin.Get(ctx, cluster.AssignmentsKey+"/"+names[i])
		if errors.Is(err, coord.ErrNotFound) {
			// Its node left since the listing (its session expired, which the run reports),
			// and the master removed the assignment: nothing of it to measure.
			return nil
		}
		if err != nil {
			return err
		}
		var a cluster.NodeAssignment
		if err := json.Unmarshal(e.Value, &a); err != nil {
			return fmt.Errorf("assignment of %s: %w", names[i], err)
		}
		n, _ := r.admin.Get(ctx, cluster.NodesKey+"/"+names[i])
		mu.Lock()
		defer mu.Unlock()
		r.rep.Store.LargestAssign = max(r.rep.Store.LargestAssign, len(e.Value))
		r.rep.Store.LargestNode = max(r.rep.Store.LargestNode, len(n.Value))
		r.rep.Store.AssignmentBytes += int64(len(e.Value))
		for _, w := range a.Workers {
			if w.Stop {
				continue
			}
			if other, ok := seen[w.Key]; ok {
				dup = append(dup, fmt.Sprintf("%s on %s and %s", w.Key, other, names[i]))
			}
			seen[w.Key] = names[i]
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(dup) > 0 {
		return fmt.Errorf("workers assigned twice: %s", strings.Join(dup[:min(len(dup), 5)], "; "))
	}
	jobs, err := r.admin.Children(ctx, cluster.JobsKey)
	if err != nil {
		return err
	}
	for _, j := range jobs {
		e, err := r.admin.Get(ctx, cluster.JobsKey+"/"+j)
		if err == nil {
			r.rep.Store.LargestJob = max(r.rep.Store.LargestJob, len(e.Value))
		}
	}
	return nil
}

// poll measures `job list` and `job status` while Pollers clients poll them.
func (r *run) poll(ctx context.Context) error {
	a, err := r.mark(ctx)
	if err != nil {
		return err
	}
	spec := PollSpec{URL: r.master.url, Token: r.master.token, Clients: r.cfg.Pollers, For: r.cfg.Poll, Metrics: r.metrics != nil, Seed: r.cfg.Seed}
	for _, j := range r.jobs {
		spec.Jobs = append(spec.Jobs, j.Name)
	}
	where := "in the agents' process"
	poll := func() (PollSamples, error) { return RunPollers(ctx, spec) }
	if r.cfg.ClientBinary != "" {
		where = "in a process of their own"
		poll = func() (s PollSamples, err error) { return s, runApart(ctx, r.cfg.ClientBinary, PollCommand, spec, &s) }
	}
	r.logf("%d clients polling job list and job status for %s, %s", r.cfg.Pollers, r.cfg.Poll, where)
	got, err := poll()
	if err != nil {
		return err
	}
	if got.FirstError != "" {
		r.logf("pollers: %d requests failed; the first: %s", got.Errors, got.FirstError)
	}
	list, status, metrics, errs := got.List, got.Status, got.Metrics, got.Errors
	b, err := r.mark(ctx)
	if err != nil {
		return err
	}
	r.rep.Poll = Poll{Clients: r.cfg.Pollers, Where: where, Seconds: round(b.at.Sub(a.at).Seconds(), 2), ListP50: ms(pct(list, 50)), ListP99: ms(pct(list, 99)),
		StatusP50: ms(pct(status, 50)), StatusP99: ms(pct(status, 99)), Requests: len(list) + len(status) + len(metrics), Errors: errs,
		MasterCPU: round((b.cpu - a.cpu).Seconds(), 2), MetricsP50: ms(pct(metrics, 50)), MetricsP99: ms(pct(metrics, 99))}
	p := &r.rep.Poll
	const listRoute, statusRoute = "GET /v1/jobs", "GET /v1/jobs/{name}"
	p.ServerListP50, p.ServerListP99 = round(serverQuantile(a.metrics, b.metrics, listRoute, 0.5), 1), round(serverQuantile(a.metrics, b.metrics, listRoute, 0.99), 1)
	p.ServerStatusP50, p.ServerStatusP99 = round(serverQuantile(a.metrics, b.metrics, statusRoute, 0.5), 1), round(serverQuantile(a.metrics, b.metrics, statusRoute, 0.99), 1)
	r.logf("job list p50 %.1fms p99 %.1fms; job status p50 %.1fms p99 %.1fms; %d requests, %d errors; as the master measured them: job list p50 %.1fms p99 %.1fms, job status p50 %.1fms p99 %.1fms",
		p.ListP50, p.ListP99, p.StatusP50, p.StatusP99, p.Requests, errs, p.ServerListP50, p.ServerListP99, p.ServerStatusP50, p.ServerStatusP99)
	return nil
}

// loseRack closes the sessions of one rack's nodes.
func (r *run) loseRack(ctx context.Context) error {
	dc, rack := synth.DCName(min(1, r.cfg.DCs-1)), synth.RackName(min(1, r.cfg.Racks-1))
	p, err := r.lose(ctx, fmt.Sprintf("rack %s/%s", dc, rack), func(n cluster.Node) bool { return n.DC == dc && n.Rack == rack })
	if err != nil {
		return err
	}
	r.rep.Rack = p
	return nil
}

// loseDC closes the sessions of one data center's nodes (not the one that lost a rack).
func (r *run) loseDC(ctx context.Context) error {
	dc := synth.DCName(r.cfg.DCs - 1)
	p, err := r.lose(ctx, "dc "+dc, func(n cluster.Node) bool { return n.DC == dc })
	if err != nil {
		return err
	}
	r.rep.DC = &p
	return nil
}

// lose closes the sessions of the live nodes in, and measures until their workers run
// elsewhere.
func (r *run) lose(ctx context.Context, what string, in func(cluster.Node) bool) (Phase, error) {
	r.agentMu.Lock()
	var gone []*sim.Agent
	var ids []string
	lost := map[string]bool{}
	for _, n := range r.nodes {
		if a, ok := r.agents[n.ID]; ok && in(n) {
			gone = append(gone, a)
			ids = append(ids, n.ID)
			lost[n.ID] = true
			delete(r.agents, n.ID)
		}
	}
	r.agentMu.Unlock()
	where, acks := r.tr.snapshot()
	var moved []cluster.WorkerKey
	for _, k := range r.keys {
		if lost[where[k]] {
			moved = append(moved, k)
		}
	}
	before, err := r.mark(ctx)
	if err != nil {
		return Phase{}, err
	}
	r.logf("losing %s: %d nodes, %d workers", what, len(ids), len(moved))
	kind := strings.Fields(what)[0] + " loss"
	r.startCPU(ctx, kind)
	defer r.endCPU()
	start := time.Now()
	r.tr.kill(ids)
	for _, a := range gone {
		r.rep.AgentSessionsExpired += a.Status().Expired
	}
	// All at once, as a data center cut off loses them: closed 64 at a time, a data
	// center's 2,500 sessions took longer than the master waits for changes to stop
	// (MaxDebounce), and it moved their workers in two reconciles.
	_ = parallel(ctx, len(gone), len(gone), func(i int) error { return gone[i].Close() })
	closed := time.Since(start)
	r.logf("%s: %d sessions closed in %.2fs", what, len(gone), closed.Seconds())
	p, err := r.settle(ctx, what, start, moved, before)
	p.Closed = round(closed.Seconds(), 3)
	if err != nil {
		return p, err
	}
	after, acksAfter := r.tr.snapshot()
	for _, k := range r.keys {
		if lost[where[k]] {
			if acksAfter[k]-acks[k] > 1 {
				p.MovedTwice++
			}
			continue
		}
		if after[k] != where[k] {
			p.OthersMoved++
		}
		if acksAfter[k] != acks[k] {
			p.OthersRestarted++
		}
	}
	r.logf("%s: others moved %d, restarted %d; its own started more than once %d", what, p.OthersMoved, p.OthersRestarted, p.MovedTwice)
	r.endCPU()
	r.heapProfile(ctx, kind)
	return p, nil
}

// sample is the store's and the master's state at one moment.
type sample struct {
	at  time.Time
	zk  zkSample
	cpu time.Duration
	// reconciles and reconcileSecs are the leader's reconcile count and total duration.
	reconciles    int
	reconcileSecs float64
	// metrics are the master's job metrics series (metricNames), when they are on.
	metrics map[string]float64
}

func (r *run) mark(ctx context.Context) (sample, error) {
	z, err := sampleZK(ctx, r.dial, r.zkAddr, r.ns)
	if err != nil {
		return sample{}, fmt.Errorf("read ZooKeeper's counters: %w", err)
	}
	u, _ := procUsage(r.master.pid)
	vals := masterMetrics(ctx, r.master.url, r.master.scrape)
	return sample{at: time.Now(), zk: z, cpu: u.cpu, reconciles: int(vals[reconcileCount]), reconcileSecs: vals[reconcileSum], metrics: vals}, nil
}

// collected waits, when the agents serve metrics, until the master's history holds every
// job with all its workers counted.
func (r *run) collected(ctx context.Context) error {
	if r.metrics == nil {
		return nil
	}
	start := time.Now()
	want := map[string]int{}
	for _, j := range r.jobs {
		want[j.Name] = j.TotalWorkers()
	}
	last := ""
	if err := r.until(ctx, "every job's metrics in the master's history", func() (bool, error) {
		m, err := r.cl.LatestMetrics(ctx)
		if err != nil {
			return false, err
		}
		full := 0
		for _, j := range m.Jobs {
			if int(j.Values[api.SeriesWorkers]) == want[j.Job] {
				full++
			}
		}
		if s := fmt.Sprintf("%d of %d jobs", full, len(want)); s != last {
			last = s
			r.logf("job metrics: %s with every worker counted", s)
		}
		return full == len(want), nil
	}); err != nil {
		return err
	}
	iv := r.cfg.MetricsInterval
	if iv == 0 {
		iv = jobmetrics.DefaultInterval
	}
	r.rep.Metrics = &Metrics{IntervalSeconds: iv.Seconds(), SeriesPerWorker: r.cfg.MetricsSeries, Covered: round(time.Since(start).Seconds(), 2)}
	return nil
}

// settle waits until keys are all assigned and acknowledged, and returns the phase's times.
func (r *run) settle(ctx context.Context, what string, start time.Time, keys []cluster.WorkerKey, before sample) (Phase, error) {
	p := Phase{What: what, Workers: len(keys)}
	deadline := time.Now().Add(r.cfg.Settle)
	lastLog, lastChange, lastAcked := time.Now(), time.Now(), -1
	for {
		assigned, acked, lastA, lastK := r.tr.progress(keys)
		p.Assigned, p.Acked = round(lastA.Sub(start).Seconds(), 3), round(lastK.Sub(start).Seconds(), 3)
		if acked == len(keys) {
			break
		}
		if acked != lastAcked {
			lastAcked, lastChange = acked, time.Now()
		}
		// No progress for a while: if the master says the rest cannot be placed (the
		// loss took more capacity than was spare), the phase is over.
		if time.Since(lastChange) > 5*time.Second+5*r.cfg.Heartbeat {
			lastChange = time.Now()
			if js, err := r.cl.Jobs(ctx); err == nil {
				unplaced := 0
				for _, j := range js {
					unplaced += j.Unplaced
				}
				if unplaced >= len(keys)-acked {
					p.Left, p.Unplaced = len(keys)-acked, unplaced
					r.logf("%s: %d workers cannot be placed (the master reports %d unplaced): phase over", what, p.Left, unplaced)
					break
				}
			}
		}
		if time.Now().After(deadline) {
			p.Left = len(keys) - acked
			r.logf("%s: gave up after %s with %d of %d workers assigned, %d acknowledged", what, r.cfg.Settle, assigned, len(keys), acked)
			break
		}
		if time.Since(lastLog) > 5*time.Second {
			r.logf("%s: %d/%d assigned, %d acknowledged; agent sessions expired so far: %d", what, assigned, len(keys), acked, r.rep.AgentSessionsExpired+r.expired())
			lastLog = time.Now()
		}
		if err := ctxtime.Sleep(ctx, 20*time.Millisecond); err != nil {
			return p, err
		}
	}
	after, err := r.mark(ctx)
	if err != nil {
		return p, err
	}
	// The agents act on an assignment once the leader has written it, while its reconcile
	// still publishes: its duration, steps and cpu reach /metrics after. Reading them at
	// once reported no reconcile for some events.
	counted := func() bool {
		return after.reconciles != before.reconciles && after.metrics[reconcileCPU] != before.metrics[reconcileCPU]
	}
	for end := time.Now().Add(5 * time.Second); !counted() && time.Now().Before(end); {
		if err := ctxtime.Sleep(ctx, 50*time.Millisecond); err != nil {
			return p, err
		}
		if after, err = r.mark(ctx); err != nil {
			return p, err
		}
	}
	p.MasterCPU = round((after.cpu - before.cpu).Seconds(), 2)
	p.ZK = rates(before.zk, after.zk)
	if p.Reconciles = after.reconciles - before.reconciles; p.Reconciles > 0 {
		p.ReconcileMeanMs = round((after.reconcileSecs-before.reconcileSecs)/float64(p.Reconciles)*1000, 1)
	}
	p.ReconcileCPU = round(after.metrics[reconcileCPU]-before.metrics[reconcileCPU], 3)
	var steps []string
	for _, s := range sdmaster.ReconcilePhases {
		if d := after.metrics[reconcilePhase+"/"+s] - before.metrics[reconcilePhase+"/"+s]; d > 0 {
			if p.ReconcileSteps == nil {
				p.ReconcileSteps = map[string]float64{}
			}
			p.ReconcileSteps[s] = round(d, 3)
			steps = append(steps, fmt.Sprintf("%s %.2fs", s, d))
		}
	}
	if len(steps) > 0 {
		r.logf("%s: reconciles' steps: %s", what, strings.Join(steps, ", "))
	}
	r.logf("%s: %d workers assigned after %.2fs, acknowledged after %.2fs; master cpu %.1fs, %d reconciles of %.0fms on average (cpu %.2fs); ZooKeeper %.0f writes/s",
		what, len(keys)-p.Left, p.Assigned, p.Acked, p.MasterCPU, p.Reconciles, p.ReconcileMeanMs, p.ReconcileCPU, p.ZK.WritesPerSecond)
	return p, nil
}

// until polls cond every 250ms until it holds or Settle passes.
func (r *run) until(ctx context.Context, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(r.cfg.Settle)
	var last error
	for {
		ok, err := cond()
		if ok && err == nil {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not after %s (last error: %v)", what, r.cfg.Settle, last)
		}
		if err := ctxtime.Sleep(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}

// expired counts the live agents' expired sessions.
func (r *run) expired() int {
	r.agentMu.Lock()
	defer r.agentMu.Unlock()
	n := 0
	for _, a := range r.agents {
		n += a.Status().Expired
	}
	return n
}

func (r *run) agentWrites() int {
	r.agentMu.Lock()
	defer r.agentMu.Unlock()
	n := 0
	for _, a := range r.agents {
		n += a.Status().Writes
	}
	return n
}

// cleanup closes the agents and removes the run's chroot.
func (r *run) cleanup() {
	r.agentMu.Lock()
	agents := make([]*sim.Agent, 0, len(r.agents))
	for _, a := range r.agents {
		agents = append(agents, a)
	}
	r.agents = map[string]*sim.Agent{}
	r.agentMu.Unlock()
	_ = parallel(context.Background(), len(agents), 64, func(i int) error { return agents[i].Close() })
	if r.metrics != nil {
		_ = r.metrics.Close()
	}
	if r.master != nil {
		_ = r.master.stop()
		r.master = nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := deleteTree(ctx, r.admin, "/"); err != nil {
		r.logf("cleanup: %v", err)
	}
	r.admin.Close()
}

// deleteTree removes everything under key, the children of each directory in batches.
func deleteTree(ctx context.Context, s coord.Store, key string) error {
	kids, err := s.Children(ctx, key)
	if errors.Is(err, coord.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	var leaves []coord.Op
	for _, k := range kids {
		child := strings.TrimSuffix(key, "/") + "/" + k
		sub, err := s.Children(ctx, child)
		if err == nil && len(sub) > 0 {
			if err := deleteTree(ctx, s, child); err != nil {
				return err
			}
			continue
		}
		leaves = append(leaves, coord.DeleteOp(child, coord.AnyVersion))
	}
	for _, b := range coord.SplitOps(leaves, 0) {
		if _, err := s.Txn(ctx, b...); err != nil {
			// An entry gone meanwhile (an ephemeral one) fails the batch: delete one by one.
			for _, op := range b {
				if err := s.Delete(ctx, op.Key, coord.AnyVersion); err != nil && !errors.Is(err, coord.ErrNotFound) && !errors.Is(err, coord.ErrNotEmpty) {
					return err
				}
			}
		}
	}
	if key != "/" {
		if err := s.Delete(ctx, key, coord.AnyVersion); err != nil && !errors.Is(err, coord.ErrNotFound) {
			return err
		}
	}
	return nil
}

// parallel runs fn(0..n-1) on at most width goroutines and returns the first error.
func parallel(ctx context.Context, n, width int, fn func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  int
	)
	for range min(width, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				stop := first != nil || ctx.Err() != nil
				mu.Unlock()
				if i >= n || stop {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}

func ms(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 2) }

func round(v float64, digits int) float64 {
	p := 1.0
	for range digits {
		p *= 10
	}
	return float64(int64(v*p+0.5)) / p
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }
