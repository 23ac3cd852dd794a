package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/netlab"
)

// chaos is one chaos run's state.
type chaos struct {
	t        *testing.T
	lc       *labCluster
	rng      *rand.Rand
	job      string
	workers  int
	recovery time.Duration
	hold     time.Duration
	fence    *fenceWatch
	rep      *chaosReport
	broken   bool

	// The mirrored job: links in two data centers, the router outside them.
	mirror      *mirrorJob
	sink        *sinkWatch
	linkFence   *fenceWatch
	routerFence *fenceWatch
	// More mirrored jobs (-chaos.sinks), reading jsIn.
	extra       []*mirrorJob
	extraFences []*fenceWatch
	jsIn        *jsInput
}

// fault is one injected fault and how to heal it.
type fault struct {
	kind   string
	target string
	claims []string // what it holds: hosts and processes no other fault of the round may touch
	heal   func() error
	// note is said in the report about how it was healed, when that says something about
	// the system (a process the run had to restart).
	note string
}

func (f *fault) String() string { return f.kind + " " + f.target }

// faultKinds lists every fault the run injects, each a function returning nil when it has
// nothing to act on now (or its target is claimed by another fault of the round).
func (c *chaos) faultKinds() map[string]func(claimed map[string]bool) *fault {
	kinds := map[string]func(map[string]bool) *fault{
		"cut-worker-host": c.cutWorkerHost,
		"cut-dc":          c.cutDC,
		"cut-master-host": c.cutMasterHost,
		"cut-zk-follower": func(cl map[string]bool) *fault { return c.cutZK(cl, false) },
		"cut-zk-leader":   func(cl map[string]bool) *fault { return c.cutZK(cl, true) },
		"kill-agent":      func(cl map[string]bool) *fault { return c.signalAgent(cl, syscall.SIGKILL) },
		"stop-agent":      func(cl map[string]bool) *fault { return c.signalAgent(cl, syscall.SIGSTOP) },
		"kill-keeper":     func(cl map[string]bool) *fault { return c.signalKeeper(cl, syscall.SIGKILL) },
		"stop-keeper":     func(cl map[string]bool) *fault { return c.signalKeeper(cl, syscall.SIGSTOP) },
		"kill-master":     func(cl map[string]bool) *fault { return c.signalMaster(cl, syscall.SIGKILL) },
		"stop-master":     func(cl map[string]bool) *fault { return c.signalMaster(cl, syscall.SIGSTOP) },
		"kill-worker":     func(cl map[string]bool) *fault { return c.signalWorker(cl, syscall.SIGKILL) },
		"stop-worker":     func(cl map[string]bool) *fault { return c.signalWorker(cl, syscall.SIGSTOP) },
	}
	if c.mirror != nil {
		kinds["kill-router"] = func(cl map[string]bool) *fault { return c.signalRouter(cl, syscall.SIGKILL) }
		kinds["stop-router"] = func(cl map[string]bool) *fault { return c.signalRouter(cl, syscall.SIGSTOP) }
		kinds["kill-link-worker"] = func(cl map[string]bool) *fault { return c.signalJobWorker(cl, c.someMirror().name, syscall.SIGKILL) }
	}
	return kinds
}

// inject picks a fault kind at random and injects it; nil if none could be.
func (c *chaos) inject(claimed map[string]bool) *fault {
	kinds := c.faultKinds()
	names := keysOf(kinds)
	for range 10 {
		name := pick(c.rng, names)
		if f := kinds[name](claimed); f != nil {
			f.kind = name
			return f
		}
	}
	return nil
}

func free(claimed map[string]bool, rs ...string) bool {
	return !slices.ContainsFunc(rs, func(r string) bool { return claimed[r] })
}

func (c *chaos) cutHosts(hosts []*netlab.Host) func() error {
	ctx := context.Background()
	for i, h := range hosts {
		if err := h.Cut(ctx, slices.Delete(slices.Clone(hosts), i, i+1)...); err != nil {
			c.t.Fatalf("chaos: %v", err)
		}
	}
	return func() error {
		var err error
		for _, h := range hosts {
			if e := h.Heal(ctx); e != nil {
				err = e
			}
		}
		return err
	}
}

func (c *chaos) cutWorkerHost(claimed map[string]bool) *fault {
	n := pick(c.rng, c.lc.nodes)
	if !free(claimed, n.id) {
		return nil
	}
	return &fault{target: n.id, claims: []string{n.id}, heal: c.cutHosts([]*netlab.Host{n.host})}
}

func (c *chaos) cutDC(claimed map[string]bool) *fault {
	dc := pick(c.rng, c.lc.spec.dcs)
	var ids []string
	var hosts []*netlab.Host
	for _, n := range c.lc.nodes {
		if n.dc == dc {
			ids, hosts = append(ids, n.id), append(hosts, n.host)
		}
	}
	if !free(claimed, ids...) {
		return nil
	}
	return &fault{target: dc, claims: ids, heal: c.cutHosts(hosts)}
}

func (c *chaos) cutMasterHost(claimed map[string]bool) *fault {
	id := pick(c.rng, c.lc.spec.masters)
	if !free(claimed, id) {
		return nil
	}
	return &fault{target: id, claims: []string{id}, heal: c.cutHosts([]*netlab.Host{c.lc.masterHost(id)})}
}

func (c *chaos) cutZK(claimed map[string]bool, leader bool) *fault {
	lead := c.lc.Ens.Leader()
	if lead == nil {
		return nil
	}
	s := lead
	if !leader {
		var fs []*netlab.Host
		for _, o := range c.lc.Ens.Servers() {
			if o != lead {
				fs = append(fs, o.Host().(*netlab.Host))
			}
		}
		h := pick(c.rng, fs)
		if !free(claimed, h.Name()) {
			return nil
		}
		return &fault{target: h.Name(), claims: []string{h.Name()}, heal: c.cutHosts([]*netlab.Host{h})}
	}
	h := s.Host().(*netlab.Host)
	if !free(claimed, h.Name()) {
		return nil
	}
	return &fault{target: h.Name(), claims: []string{h.Name()}, heal: c.cutHosts([]*netlab.Host{h})}
}

func (c *chaos) signalAgent(claimed map[string]bool, sig syscall.Signal) *fault {
	n := pick(c.rng, c.lc.nodes)
	if !free(claimed, n.id) {
		return nil
	}
	h := c.lc.harness
	p := h.Agent(n.id)
	if sig == syscall.SIGKILL {
		p.Kill()
		return &fault{target: n.id, claims: []string{n.id}, heal: func() error {
			c.lc.StartAgent(n)
			return nil
		}}
	}
	_ = p.Cmd.Process.Signal(sig)
	return &fault{target: n.id, claims: []string{n.id}, heal: func() error { return p.Cmd.Process.Signal(syscall.SIGCONT) }}
}

func (c *chaos) signalKeeper(claimed map[string]bool, sig syscall.Signal) *fault {
	n := pick(c.rng, c.lc.nodes)
	if !free(claimed, n.id) {
		return nil
	}
	pid := c.lc.KeeperPID(n.id)
	if pid == 0 {
		return nil
	}
	_ = syscall.Kill(pid, sig)
	f := &fault{target: n.id, claims: []string{n.id}}
	if sig == syscall.SIGSTOP {
		f.heal = func() error { return syscall.Kill(pid, syscall.SIGCONT) }
		return f
	}
	f.heal = func() error {
		if c.lc.KeeperPID(n.id) != 0 {
			return nil
		}
		// An agent does not start a keeper again while it runs: restarted, it does.
		h := c.lc.harness
		p := h.Agent(n.id)
		p.Kill()
		c.lc.StartAgent(n)
		f.note = "agent restarted by the run to get a keeper again"
		return nil
	}
	return f
}

func (c *chaos) signalMaster(claimed map[string]bool, sig syscall.Signal) *fault {
	id := pick(c.rng, c.lc.spec.masters)
	if !free(claimed, id) {
		return nil
	}
	h := c.lc.harness
	p := h.Master(id)
	if sig == syscall.SIGKILL {
		p.Kill()
		return &fault{target: id, claims: []string{id}, heal: func() error {
			c.lc.StartMaster(id)
			return nil
		}}
	}
	_ = p.Cmd.Process.Signal(sig)
	return &fault{target: id, claims: []string{id}, heal: func() error { return p.Cmd.Process.Signal(syscall.SIGCONT) }}
}

func (c *chaos) signalWorker(claimed map[string]bool, sig syscall.Signal) *fault {
	return c.signalJobWorker(claimed, c.job, sig)
}

func (c *chaos) signalRouter(claimed map[string]bool, sig syscall.Signal) *fault {
	return c.signalJobWorker(claimed, c.someMirror().name+routerJobSuffix, sig)
}

// someMirror picks one of the run's mirrored jobs.
func (c *chaos) someMirror() *mirrorJob {
	ms := c.mirrors()
	return ms[c.rng.IntN(len(ms))]
}

func (c *chaos) signalJobWorker(claimed map[string]bool, job string, sig syscall.Signal) *fault {
	ps := procsOf(job)
	if len(ps) == 0 {
		return nil
	}
	k := pick(c.rng, keysOf(ps))
	p := ps[k]
	if !free(claimed, job+"/"+k, p.node) {
		return nil
	}
	_ = syscall.Kill(p.pid, sig)
	f := &fault{target: fmt.Sprintf("%s/%s on %s", job, k, p.node), claims: []string{job + "/" + k}, heal: func() error { return nil }}
	if sig == syscall.SIGSTOP {
		f.heal = func() error {
			err := syscall.Kill(p.pid, syscall.SIGCONT)
			if err == syscall.ESRCH {
				return nil // stopped by its launcher meanwhile (a lease that lapsed)
			}
			return err
		}
	}
	return f
}

// checkProcesses starts again every agent or master that exited by itself (not killed by a
// fault: the heal restarted those), as systemd would, so that the run goes on. A crash is a
// violation; an exit with an error (a process started while the store had no quorum, say) is
// noted in the report with the error.
func (c *chaos) checkProcesses(round int) {
	h := c.lc.harness
	procs := map[string]*clustertest.Proc{}
	for id, p := range h.Agents() {
		procs["agent-"+id] = p
	}
	for id, p := range h.Masters() {
		procs["master-"+id] = p
	}
	for _, name := range keysOf(procs) {
		select {
		case <-procs[name].Done:
		default:
			continue
		}
		b, _ := os.ReadFile(filepath.Join(h.Dir, name+".log"))
		if i := strings.LastIndex(string(b), "panic: "); i >= 0 {
			c.violation(fmt.Sprintf("after round %d: %s crashed: %s", round, name, oneLine(string(b[i:]), 800)))
		} else {
			c.rep.note(fmt.Sprintf("%s exited by itself and was started again: %s", strings.SplitN(name, "-", 2)[0], lastLogLine(b)))
		}
		if id, ok := strings.CutPrefix(name, "agent-"); ok {
			c.lc.StartAgent(c.lc.node(id))
		} else {
			c.lc.StartMaster(strings.TrimPrefix(name, "master-"))
		}
	}
}

func oneLine(s string, n int) string {
	if len(s) > n {
		s = s[:n]
	}
	return strings.ReplaceAll(strings.TrimSpace(s), "\n", " | ")
}

// lastLogLine is a log's last line, with its timestamp and node fields cut short.
func lastLogLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	l := lines[len(lines)-1]
	if i := strings.Index(l, "msg="); i >= 0 {
		l = l[i:]
	}
	return oneLine(l, 200)
}

// chaosReport is what a chaos run found.
type chaosReport struct {
	seed     uint64
	duration time.Duration
	elapsed  time.Duration
	setup    string
	bound    time.Duration

	rounds, faults, recoveries int
	byKind                     map[string]*kindStats
	worst                      time.Duration
	worstRound                 string
	recoveryTimes              []time.Duration
	notes                      map[string]int
	controlChecks              int
	worstControl               time.Duration
	longestTwice               time.Duration
	longestKey                 string
	longestDetail              string
	samples                    int
	sink                       string
	worstOutage                time.Duration
	worstOutageRound           string
	outages                    []time.Duration
	violations                 []string
}

type kindStats struct {
	injected   int
	recoveries int           // rounds with this fault in which some worker had to run again after the heal
	worst      time.Duration // the longest of those
	down       int           // rounds with this fault in which a desired worker stopped running
	worstDown  time.Duration // the longest a desired worker was down in them
}

func (r *chaosReport) note(s string) {
	if r.notes == nil {
		r.notes = map[string]int{}
	}
	r.notes[s]++
}

// round records a round: its faults, how long every worker took to run again after the heal
// (about 0 when none had stopped) and how long some desired worker was not running (0: never).
func (r *chaosReport) round(names []string, faults []*fault, took, outage time.Duration, ok bool) {
	r.rounds++
	r.faults += len(faults)
	if outage > 0 {
		r.outages = append(r.outages, outage)
		if outage > r.worstOutage {
			r.worstOutage, r.worstOutageRound = outage, strings.Join(names, " + ")
		}
	}
	disrupted := took > 100*time.Millisecond
	if disrupted {
		r.recoveries++
		r.recoveryTimes = append(r.recoveryTimes, took)
	}
	if took > r.worst {
		r.worst, r.worstRound = took, strings.Join(names, " + ")
	}
	for _, f := range faults {
		ks := r.byKind[f.kind]
		if ks == nil {
			ks = &kindStats{}
			r.byKind[f.kind] = ks
		}
		ks.injected++
		if disrupted {
			ks.recoveries++
		}
		ks.worst = max(ks.worst, took)
		if outage > 0 {
			ks.down++
			ks.worstDown = max(ks.worstDown, outage)
		}
		if f.note != "" {
			r.note(f.kind + ": " + f.note)
		}
	}
}

func (r *chaosReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos run: %s of %s planned, seed %d (-chaos.seed=%d repeats the fault sequence)\n", r.elapsed.Round(time.Second), r.duration, r.seed, r.seed)
	fmt.Fprintf(&b, "cluster: %s\n", r.setup)
	fmt.Fprintf(&b, "rounds: %d, faults injected: %d, rounds after which workers had to run again: %d\n", r.rounds, r.faults, r.recoveries)
	fmt.Fprintf(&b, "%-16s %8s %12s %14s %10s %14s\n", "fault", "injected", "worker down", "longest down", "recovered", "worst recovery")
	fmt.Fprintf(&b, "%-16s %8s %12s %14s %10s %14s\n", "", "", "(rounds)", "", "after heal", "after heal")
	for _, k := range keysOf(r.byKind) {
		ks := r.byKind[k]
		fmt.Fprintf(&b, "%-16s %8d %12d %14s %10d %14s\n", k, ks.injected, ks.down, ks.worstDown.Round(time.Millisecond), ks.recoveries, ks.worst.Round(time.Millisecond))
	}
	sort.Slice(r.recoveryTimes, func(i, j int) bool { return r.recoveryTimes[i] < r.recoveryTimes[j] })
	med := time.Duration(0)
	if n := len(r.recoveryTimes); n > 0 {
		med = r.recoveryTimes[n/2]
	}
	fmt.Fprintf(&b, "recovery after the heal (every desired worker running once): median %s of %d, worst %s (%s)\n",
		med.Round(time.Millisecond), len(r.recoveryTimes), r.worst.Round(time.Millisecond), r.worstRound)
	sort.Slice(r.outages, func(i, j int) bool { return r.outages[i] < r.outages[j] })
	medDown := time.Duration(0)
	if n := len(r.outages); n > 0 {
		medDown = r.outages[n/2]
	}
	fmt.Fprintf(&b, "a desired worker not running, from the first sample missing it to all running again: %d rounds, median %s, worst %s (%s)\n",
		len(r.outages), medDown.Round(time.Millisecond), r.worstOutage.Round(time.Millisecond), r.worstOutageRound)
	fmt.Fprintf(&b, "control plane (scale out by one and back): %d checks, worst %s\n", r.controlChecks, r.worstControl.Round(time.Millisecond))
	fmt.Fprintf(&b, "longest a worker ran twice: %s (worker %q; fencing bound %s; %d samples of /proc) %s\n", r.longestTwice.Round(time.Millisecond), r.longestKey, r.bound, r.samples, r.longestDetail)
	if r.sink != "" {
		fmt.Fprintln(&b, r.sink)
	}
	for _, n := range keysOf(r.notes) {
		fmt.Fprintf(&b, "note: %s (%d times)\n", n, r.notes[n])
	}
	fmt.Fprintf(&b, "violations: %d\n", len(r.violations))
	for _, v := range r.violations {
		fmt.Fprintf(&b, "  - %s\n", v)
	}
	return b.String()
}
