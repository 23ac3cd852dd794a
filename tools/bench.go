package tools

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/placement"
	"github.com/stormdock/stormdock/placement/placementtest"
)

// BenchCommand measures parts of stormdock on synthetic input.
var BenchCommand = &cli.Command{
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
	}},
}

func runBenchPlacement(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("stormdock bench placement: unexpected argument %q (flags go first)", c.Args().First()), 2)
	}
	cfg := placementtest.Config{
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
	lostDC, lostRack := placementtest.DCName(min(1, cfg.DCs-1)), placementtest.RackName(min(1, cfg.RacksPerDC-1))
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
