// Package bench is `stormdock bench`: the placement engine on a synthetic cluster (package
// placement/synth), and a whole cluster of simulated agents (package agents/sim, through
// internal/clusterbench) against a real master and ZooKeeper.
package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/clusterbench"
	"github.com/stormdock/stormdock/placement"
	"github.com/stormdock/stormdock/placement/synth"
	"github.com/stormdock/stormdock/tools/commands"
)

// Command measures parts of stormdock on synthetic input.
var Command = &cli.Command{
	Name:  "bench",
	Usage: "measure stormdock's components on synthetic input",
	Subcommands: []*cli.Command{{
		Name:  "placement",
		Usage: "time a full plan and the re-plan after a rack is lost, on a synthetic cluster",
		UsageText: "stormdock bench placement [--nodes N --jobs J --workers W --dcs D --racks R --slots S]\n" +
			"   1,000,000 workers: stormdock bench placement --nodes 50000 --jobs 10000 --workers 1000000 --slots 32",
		Description: "Nodes are spread evenly over dcs x racks; jobs vary in size (half to one and a half times\n" +
			"the mean), memory, cpu and priority, and spread over dc and rack. Times are the best of\n" +
			"--runs runs on --procs cores. Peak heap is measured in a separate run with the garbage\n" +
			"collector off, so it is every byte the plan allocates: the most heap it can need at once.",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "nodes", Usage: "nodes in the cluster", Value: 10000},
			&cli.IntFlag{Name: "jobs", Usage: "jobs", Value: 1000},
			&cli.IntFlag{Name: "workers", Usage: "workers over all jobs", Value: 100000},
			&cli.IntFlag{Name: "dcs", Usage: "data centers", Value: 4},
			&cli.IntFlag{Name: "racks", Usage: "racks per data center", Value: 25},
			&cli.IntFlag{Name: "slots", Usage: "slots per node (memory is 4Gi and cpu 2 per slot)", Value: 16},
			&cli.Uint64Flag{Name: "seed", Usage: "random seed for the jobs", Value: 1},
			&cli.IntFlag{Name: "runs", Usage: "timed runs of each plan; the best is reported", Value: 3},
			&cli.IntFlag{Name: "procs", Usage: "GOMAXPROCS while measuring (the planner uses one core)", Value: 1},
		},
		Action: runBenchPlacement,
	}, {
		Name:  "cluster",
		Usage: "measure a real master and ZooKeeper with thousands of simulated agents: submit, steady state, API latency, rack and dc loss",
		UsageText: "stormdock bench cluster --nodes N --workers W --store zk://HOST:PORT [--jobs J] [--dcs D --racks R --slots S] [-o json]\n" +
			"   stormdock bench cluster --nodes 10000 --workers 100000 --store zk://127.0.0.1:2181",
		Description: "Runs a master (a process of this binary, or in this process with --master in-process) on a fresh\n" +
			"chroot of the given ZooKeeper, and --nodes simulated agents as goroutines of this process, each\n" +
			"with its own ZooKeeper session: they register session-bound node entries, watch their\n" +
			"assignments, start workers at once (no processes) and write one record per heartbeat when it\n" +
			"changed. ZooKeeper must allow that many connections from one address (maxClientCnxns=0 in\n" +
			"zoo.cfg) and answer mntr and conf (4lw.commands.whitelist=mntr,conf,srvr). It reports submit to\n" +
			"every worker assigned and acknowledged running, ZooKeeper's writes at steady state and in each\n" +
			"event (from mntr), what the store holds, job list and job status latency under --pollers\n" +
			"clients, the loss of one rack and of one dc (their agents' sessions closed) until their workers\n" +
			"run elsewhere, and the master's peak RSS and cpu seconds.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "store", Usage: "ZooKeeper `URL` (zk://HOST:PORT[/CHROOT], zks:// for TLS); the run works under a fresh chroot below it and removes it", Required: true},
			commands.StoreTLSFlags[0], commands.StoreTLSFlags[1], commands.StoreTLSFlags[2],
			&cli.IntFlag{Name: "nodes", Usage: "simulated nodes", Value: 10000},
			&cli.IntFlag{Name: "workers", Usage: "workers over all jobs", Value: 100000},
			&cli.IntFlag{Name: "jobs", Usage: "jobs (default: one per 100 workers)"},
			&cli.IntFlag{Name: "dcs", Usage: "data centers", Value: 4},
			&cli.IntFlag{Name: "racks", Usage: "racks per data center", Value: 25},
			&cli.IntFlag{Name: "slots", Usage: "slots per node (memory is 4Gi and cpu 2 per slot)", Value: 16},
			&cli.IntFlag{Name: "nodes-per-session", Usage: "simulated nodes of one rack sharing a ZooKeeper session (a connection, an open file in this process and in the server: where either cannot open one per node)", Value: 1},
			&cli.DurationFlag{Name: "heartbeat", Usage: "simulated agents' heartbeat", Value: time.Second},
			&cli.Float64Flag{Name: "churn", Usage: "share of heartbeats on which a node's record changes (a memory reading): 0.2 is a real agent sampling memory every 5th heartbeat with every sample changed", Value: 0.2},
			&cli.DurationFlag{Name: "session-timeout", Usage: "the master's and the agents' store session timeout", Value: 10 * time.Second},
			&cli.DurationFlag{Name: "steady", Usage: "how long steady state is measured", Value: 10 * time.Second},
			&cli.IntFlag{Name: "pollers", Usage: "clients polling job list and job status", Value: 10},
			&cli.DurationFlag{Name: "poll", Usage: "how long the pollers poll", Value: 10 * time.Second},
			&cli.DurationFlag{Name: "settle", Usage: "how long each phase may take before the run reports what is left", Value: 5 * time.Minute},
			&cli.StringFlag{Name: "master", Usage: "run the master as a `process` of its own (its memory and cpu alone) or in-process", Value: "process"},
			&cli.StringFlag{Name: "master-memory-limit", Usage: "the master's --memory-limit `SIZE` (768Mi): its Go runtime's soft memory limit (default: none)"},
			&cli.BoolFlag{Name: "pin", Usage: "pin the master to a core of its own, and the simulated agents and a ZooKeeper of this machine to the other cores (with one core free, nothing is pinned and the report says so)"},
			&cli.BoolFlag{Name: "no-dc-loss", Usage: "skip the loss of a data center"},
			&cli.IntFlag{Name: "metrics-series", Usage: "series each simulated worker serves (half gauges, half counters, and the agent's five on top): the agents serve job metrics and the master pulls them; 0: none"},
			&cli.DurationFlag{Name: "metrics-interval", Usage: "the master's --metrics-interval (default its own, 10s; 0 turns job metrics off)"},
			&cli.StringFlag{Name: "profiles", Usage: "write the master's heap profile when each phase settles and a cpu profile over each event to `DIR` (default: a new directory under $TMPDIR, kept; \"off\" takes none)"},
			&cli.DurationFlag{Name: "profile-span", Usage: "span of each cpu profile, from the event's start", Value: 10 * time.Second},
			&cli.StringFlag{Name: "log", Usage: "write the simulated agents' and their store clients' warnings to `FILE` (sessions lost, writes failed)"},
			&cli.Uint64Flag{Name: "seed", Usage: "random seed for the jobs", Value: 1},
			commands.OutputFlag,
		},
		Action: runBenchCluster,
	}, clientCommand(clusterbench.PollCommand, "poll job list and job status as `bench cluster` asks on stdin, and write each request's latency to stdout"),
		clientCommand(clusterbench.SubmitCommand, "submit the jobs `bench cluster` gives on stdin, and write how long it took to stdout"),
	},
}

// clientCommand is a hidden subcommand that `bench cluster` runs as a process of its own
// for one of its API clients (see clusterbench.SubmitCommand).
func clientCommand(name, usage string) *cli.Command {
	return &cli.Command{
		Name:      name,
		Hidden:    true,
		Usage:     usage,
		UsageText: "stormdock bench " + name + " < TASK.json",
		Action: func(c *cli.Context) error {
			if err := clusterbench.ServeClient(c.Context, name, os.Stdin, c.App.Writer); err != nil {
				return cli.Exit("stormdock bench "+name+": "+err.Error(), 1)
			}
			return nil
		},
	}
}

func runBenchCluster(c *cli.Context) error {
	const cmd = "stormdock bench cluster"
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("%s: unexpected argument %q (flags go first)", cmd, c.Args().First()), 2)
	}
	out := c.String("output")
	if out != "table" && out != "json" {
		return cli.Exit(fmt.Sprintf("%s: -o must be table or json, not %q", cmd, out), 2)
	}
	storeTLS, err := commands.StoreTLS(c)
	if err != nil {
		return err
	}
	cfg := clusterbench.Config{
		Store: c.String("store"), StoreTLS: storeTLS, Nodes: c.Int("nodes"), Workers: c.Int("workers"), Jobs: c.Int("jobs"),
		DCs: c.Int("dcs"), Racks: c.Int("racks"), Slots: c.Int("slots"), Heartbeat: c.Duration("heartbeat"),
		Churn: c.Float64("churn"), SessionTimeout: c.Duration("session-timeout"), Steady: c.Duration("steady"),
		Pollers: c.Int("pollers"), Poll: c.Duration("poll"), Settle: c.Duration("settle"),
		NodesPerSession: c.Int("nodes-per-session"), SkipDC: c.Bool("no-dc-loss"), Pin: c.Bool("pin"), Seed: c.Uint64("seed"), Progress: c.App.ErrWriter,
		MetricsSeries: c.Int("metrics-series"), MetricsInterval: c.Duration("metrics-interval"), MasterMemoryLimit: c.String("master-memory-limit"),
	}
	if c.IsSet("metrics-interval") && cfg.MetricsInterval == 0 {
		cfg.MetricsInterval = -1
	}
	self, selfErr := os.Executable()
	// The API's clients run as processes of this binary whichever way the master runs: a
	// user's client is not among the simulated agents.
	cfg.ClientBinary = self
	switch c.String("master") {
	case "process":
		if selfErr != nil {
			return cli.Exit(fmt.Sprintf("%s: find this binary to run the master: %v (use --master in-process)", cmd, selfErr), 1)
		}
		cfg.MasterBinary = self
	case "in-process":
	default:
		return cli.Exit(fmt.Sprintf("%s: --master must be process or in-process, not %q", cmd, c.String("master")), 2)
	}
	switch dir := c.String("profiles"); dir {
	case "off":
	case "":
		if cfg.ProfileDir, err = os.MkdirTemp("", "stormdock-bench-profiles-"); err != nil {
			return cli.Exit(fmt.Sprintf("%s: --profiles: %v", cmd, err), 1)
		}
	default:
		cfg.ProfileDir = dir
	}
	cfg.ProfileSpan = c.Duration("profile-span")
	if cfg.ProfileSpan < time.Second || cfg.ProfileSpan > 300*time.Second {
		return cli.Exit(cmd+": --profile-span must be from 1s to 300s", 2)
	}
	if cfg.Churn < 0 || cfg.Churn > 1 {
		return cli.Exit(cmd+": --churn must be between 0 and 1", 2)
	}
	if f := c.String("log"); f != "" {
		lf, err := os.Create(f)
		if err != nil {
			return cli.Exit(fmt.Sprintf("%s: --log: %v", cmd, err), 2)
		}
		defer lf.Close()
		cfg.Logger = slog.New(slog.NewTextHandler(lf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if err := clusterbench.Check(cfg); err != nil {
		return cli.Exit(cmd+": "+strings.ReplaceAll(err.Error(), "\n", "\n"+cmd+": "), 2)
	}
	rep, err := clusterbench.Run(c.Context, cfg)
	if err != nil {
		return cli.Exit(cmd+": "+err.Error(), 1)
	}
	if out == "json" {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printClusterReport(c.App.Writer, rep)
	return nil
}

// printClusterReport writes the report as text.
func printClusterReport(w io.Writer, r *clusterbench.Report) {
	fmt.Fprintf(w, "cluster: %d nodes (%d dcs x %d racks, %d slots each), %d jobs, %d workers; master %s\n",
		r.Nodes, r.DCs, r.Racks, r.Slots, r.Jobs, r.Workers, r.Master)
	fmt.Fprintf(w, "agents: %s; registered in %.1fs; bench process peak RSS %s, cpu %.0fs over the run\n", r.Hosting, r.Register, mib(r.BenchRSS), r.BenchCPU)
	if r.Pinning != "" {
		fmt.Fprintf(w, "cores: %s\n", r.Pinning)
	}
	phase := func(p clusterbench.Phase) {
		fmt.Fprintf(w, "%s: %d workers assigned after %.2fs, acknowledged running after %.2fs", p.What, p.Workers-p.Left, p.Assigned, p.Acked)
		if p.Acked > 0 {
			fmt.Fprintf(w, " (%.0f workers/s)", float64(p.Workers-p.Left)/p.Acked)
		}
		if p.Closed > 0 {
			fmt.Fprintf(w, "; its sessions closed after %.2fs", p.Closed)
		}
		fmt.Fprintln(w)
		if p.Left > 0 {
			fmt.Fprintf(w, "  %d of its %d workers not running elsewhere: %d reported unplaced by the master (no capacity)\n", p.Left, p.Workers, p.Unplaced)
		}
		fmt.Fprintf(w, "  master cpu %.2fs (reconciles' own %.2fs), %d reconciles of %.0fms on average; ZooKeeper %.0f write requests/s (%.0f writes under the chroot, %.0f KiB/s)",
			p.MasterCPU, p.ReconcileCPU, p.Reconciles, p.ReconcileMeanMs, p.ZK.WritesPerSecond, p.ZK.NamespaceWritesPerSecond, p.ZK.NamespaceBytesPerSecond/1024)
		if p.What != "submit" {
			fmt.Fprintf(w, "; other workers moved %d, restarted %d", p.OthersMoved, p.OthersRestarted)
		}
		fmt.Fprintln(w)
	}
	phase(r.Submit)
	fmt.Fprintf(w, "  job list reports every worker running after %.2fs; workers started twice: %d\n", r.APIRunning, r.StartedTwice)
	s := r.Steady
	fmt.Fprintf(w, "steady state (%.0fs, heartbeat %.1fs): ZooKeeper %.0f writes/s, %.3f per node per heartbeat (agents' own %.3f); master cpu %.2fs\n",
		s.ZK.Seconds, r.Heartbeat, s.ZK.WritesPerSecond, s.WritesPerNodePerHeartbeat, s.AgentWritesPerNodePerHeartbeat, s.MasterCPU)
	st := r.Store
	fmt.Fprintf(w, "store: %d znodes, %s (%s of assignments); %d watches, %d connections, %d ephemerals; largest assignment %d B, node record %d B, job record %d B\n",
		st.Znodes, mib(st.DataBytes), mib(st.AssignmentBytes), st.Watches, st.Connections, st.Ephemerals, st.LargestAssign, st.LargestNode, st.LargestJob)
	p := r.Poll
	fmt.Fprintf(w, "API under %d pollers %s (%.0fs, %d requests, %d errors): job list p50 %.1fms p99 %.1fms; job status p50 %.1fms p99 %.1fms; master cpu %.1fs\n",
		p.Clients, p.Where, p.Seconds, p.Requests, p.Errors, p.ListP50, p.ListP99, p.StatusP50, p.StatusP99, p.MasterCPU)
	fmt.Fprintf(w, "  as the master measured them (its handlers, within a bucket's precision): job list p50 %.1fms p99 %.1fms; job status p50 %.1fms p99 %.1fms\n",
		p.ServerListP50, p.ServerListP99, p.ServerStatusP50, p.ServerStatusP99)
	if m := r.Metrics; m != nil {
		fmt.Fprintf(w, "job metrics (%d series per worker, every %.0fs): every job's in the history %.1fs after the submission; %d series kept, %s of history (%.0f B a series); %d rounds of %.2fs on average over the steady state, %d node failures, %d agent answers; job metrics p50 %.1fms p99 %.1fms\n",
			m.SeriesPerWorker, m.IntervalSeconds, m.Covered, m.Series, mib(m.HistoryBytes), m.BytesPerSeries, m.Rounds, m.RoundMeanSeconds, m.NodeFailures, m.Answers, p.MetricsP50, p.MetricsP99)
	}
	phase(r.Rack)
	if r.DC != nil {
		phase(*r.DC)
	}
	fmt.Fprintf(w, "master: peak RSS %s, cpu %.1fs over the run (%.0fs)\n", mib(r.MasterPeakRSS), r.MasterCPU, r.Total)
	if p := r.Profiles; p != nil {
		fmt.Fprintf(w, "master profiles in %s (go tool pprof -top FILE; heap: -sample_index=inuse_space):\n", p.Dir)
		for _, f := range p.Files {
			switch f.Kind {
			case "heap":
				fmt.Fprintf(w, "  heap after %s: live heap %s, RSS %s: %s\n", f.What, mib(f.HeapBytes), mib(f.RSSBytes), f.File)
			default:
				fmt.Fprintf(w, "  cpu over %s (%.0fs from its start): %s\n", f.What, f.Seconds, f.File)
			}
		}
		if p.Heap != "" {
			fmt.Fprintf(w, "  at the peak (largest live heap): %s\n", p.Heap)
		}
		for _, e := range p.Errors {
			fmt.Fprintf(w, "  not taken: %s\n", e)
		}
	}
	if r.AgentSessionsExpired > 0 {
		fmt.Fprintf(w, "WARNING: %d simulated agents' sessions expired during the run: this machine could not hold %d agents; nodes came and went\n",
			r.AgentSessionsExpired, r.Nodes)
	}
}

func runBenchPlacement(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("stormdock bench placement: unexpected argument %q (flags go first)", c.Args().First()), 2)
	}
	cfg := synth.Config{
		DCs: c.Int("dcs"), RacksPerDC: c.Int("racks"), Slots: c.Int("slots"),
		Jobs: c.Int("jobs"), Workers: c.Int("workers"), Seed: c.Uint64("seed"),
		Spread: []string{cluster.DomainDC, cluster.DomainRack},
	}
	var bad []string
	for _, f := range []string{"nodes", "jobs", "workers", "dcs", "racks", "slots", "runs", "procs"} {
		if c.Int(f) < 1 {
			bad = append(bad, fmt.Sprintf("stormdock bench placement: --%s must be at least 1", f))
		}
	}
	if cfg.Workers < cfg.Jobs {
		bad = append(bad, "stormdock bench placement: --workers must be at least --jobs")
	}
	if len(bad) > 0 {
		return cli.Exit(strings.Join(bad, "\n"), 2)
	}
	domains := cfg.DCs * cfg.RacksPerDC
	cfg.NodesPerRack = max(1, (c.Int("nodes")+domains-1)/domains)
	cfg.Memory = cluster.Bytes(cfg.Slots) * 4 << 30
	cfg.CPU = cluster.CPU(cfg.Slots * 2000)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(c.Int("procs")))

	nodes, jobs := cfg.Nodes(), cfg.JobSpecs()
	w := c.App.Writer
	fmt.Fprintf(w, "cluster: %d nodes (%d dcs x %d racks x %d nodes, %d slots each), %d jobs, %d workers, GOMAXPROCS=%d\n",
		len(nodes), cfg.DCs, cfg.RacksPerDC, cfg.NodesPerRack, cfg.Slots, len(jobs), cfg.Workers, runtime.GOMAXPROCS(0))

	full, err := benchPlan(w, "full plan", placement.Input{Nodes: nodes, Jobs: jobs}, c.Int("runs"))
	if err != nil {
		return cli.Exit("stormdock bench placement: "+err.Error(), 1)
	}

	// Lose one rack: the second rack of the second dc (or the first there is).
	lostDC, lostRack := synth.DCName(min(1, cfg.DCs-1)), synth.RackName(min(1, cfg.RacksPerDC-1))
	lost := map[string]bool{}
	var left []cluster.Node
	for _, n := range nodes {
		if n.DC == lostDC && n.Rack == lostRack {
			lost[n.ID] = true
		} else {
			left = append(left, n)
		}
	}
	onRack := 0
	for _, p := range full.Placements {
		if lost[p.Node] {
			onRack++
		}
	}
	re, err := benchPlan(w, fmt.Sprintf("re-plan after losing rack %s/%s", lostDC, lostRack),
		placement.Input{Nodes: left, Jobs: jobs, Current: full.Placements}, c.Int("runs"))
	if err != nil {
		return cli.Exit("stormdock bench placement: "+err.Error(), 1)
	}
	outside := 0
	for _, m := range re.Moves {
		if !lost[m.From] {
			outside++
		}
	}
	fmt.Fprintf(w, "  moves: %d (workers on the lost rack: %d, moves of other workers: %d)\n", len(re.Moves), onRack, outside)
	if hwm := peakRSS(); hwm != "" {
		fmt.Fprintf(w, "process peak RSS (VmHWM, everything including the input): %s\n", hwm)
	}
	return nil
}

// benchPlan times in.Plan, measures its memory, and prints one block of figures.
func benchPlan(w io.Writer, name string, in placement.Input, runs int) (*placement.Result, error) {
	var best, bestCPU time.Duration
	for i := range runs {
		runtime.GC()
		start, startCPU := time.Now(), cpuTime()
		_, err := placement.Plan(in)
		took, tookCPU := time.Since(start), cpuTime()-startCPU
		if err != nil {
			return nil, err
		}
		if i == 0 || took < best {
			best = took
		}
		if i == 0 || tookCPU < bestCPU {
			bestCPU = tookCPU
		}
	}
	// Memory: with the collector off nothing is freed, so the heap's growth over the plan
	// is every byte it allocated, an upper bound of its peak live heap.
	runtime.GC()
	old := debug.SetGCPercent(-1)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	res, err := placement.Plan(in)
	runtime.ReadMemStats(&after)
	debug.SetGCPercent(old)
	if err != nil {
		return nil, err
	}
	allocated := after.TotalAlloc - before.TotalAlloc
	runtime.GC()
	var kept runtime.MemStats
	runtime.ReadMemStats(&kept)
	live := int64(kept.HeapAlloc) - int64(before.HeapAlloc)

	skew, err := placement.MaxSkew(in.Nodes, in.Jobs, res.Placements)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "%s:\n", name)
	fmt.Fprintf(w, "  time %v (best of %d; process cpu time %v), %.0f placements/s (placements in the plan / time)\n",
		best.Round(10*time.Microsecond), runs, bestCPU.Round(10*time.Microsecond), float64(len(res.Placements))/best.Seconds())
	fmt.Fprintf(w, "  placed %d, unplaced %d, moves %d, max skew %d\n", len(res.Placements), len(res.Unplaced), len(res.Moves), skew)
	fmt.Fprintf(w, "  peak heap %s (all bytes allocated, GC off), %d allocations; heap kept by the result %s\n",
		mib(int64(allocated)), after.Mallocs-before.Mallocs, mib(live))
	runtime.KeepAlive(res)
	return res, nil
}

// cpuTime is the processor time the process has used, all threads, user and system: on a
// busy machine it shows what the plan costs when wall time also counts waiting for a core.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// peakRSS reads the process's resident high-water mark on Linux, or returns "".
func peakRSS() string {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return ""
}
