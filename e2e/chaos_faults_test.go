package e2e

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents"
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

	// The docker job whose workers run their image's own command (nil: none).
	docker *dockerChaos

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
		// Issue 28: faults that only part of the system sees.
		"pause-zk-then-cut-worker-host":  c.pauseZKThenCutWorker,
		"cut-zk-follower-from-leader":    c.cutZKFollowerFromLeader,
		"cut-worker-host-from-zk-leader": c.cutWorkerFromZKLeader,
		"reject-master-host":             c.rejectMasterHost,
		"reject-zk-follower":             func(cl map[string]bool) *fault { return c.rejectZK(cl, false) },
		"reject-zk-leader":               func(cl map[string]bool) *fault { return c.rejectZK(cl, true) },
	}
	if c.mirror != nil {
		kinds["kill-router"] = func(cl map[string]bool) *fault { return c.signalRouter(cl, syscall.SIGKILL) }
		kinds["stop-router"] = func(cl map[string]bool) *fault { return c.signalRouter(cl, syscall.SIGSTOP) }
		kinds["kill-link-worker"] = func(cl map[string]bool) *fault { return c.signalJobWorker(cl, c.someMirror().name, syscall.SIGKILL) }
	}
	if *chaosFaults != "" {
		only := map[string]func(map[string]bool) *fault{}
		for _, k := range strings.Split(*chaosFaults, ",") {
			f, ok := kinds[k]
			if !ok {
				c.t.Fatalf("chaos: unknown fault kind %q (-chaos.faults); the kinds are %s", k, strings.Join(slices.Sorted(maps.Keys(kinds)), ", "))
			}
			only[k] = f
		}
		return only
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
		c.rep.exited = append(c.rep.exited, fmt.Sprintf("%s after round %d: %s", name, round, lastLogLine(b)))
		if i := strings.LastIndex(string(b), "panic: "); i >= 0 {
			c.violation(fmt.Sprintf("after round %d: %s crashed: %s", round, name, oneLine(string(b[i:]), 800)))
		} else {
			// A daemon waits for what it needs (the store) and stops only when told: one
			// that exits by itself is a violation now, started again so the run goes on.
			c.violation(fmt.Sprintf("after round %d: %s exited by itself (started again): %s", round, name, lastLogLine(b)))
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
	// linkTwice and routerTwice are the longest the mirrored job's link workers and its
	// routers ran twice.
	linkTwice, routerTwice time.Duration
	// avoidedEnd lists the nodes the masters avoid for a job at the end (healthy says which
	// of them are healthy); exited the daemons that exited by themselves.
	avoidedEnd []string
	avoidedOK  int
	exited     []string
	vouch      bool
	violations []string
}

// percentile is the p-th percentile (0 < p <= 100) of sorted durations, 0 when none.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p/100+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
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
	fmt.Fprintf(&b, "recovery after the heal (every desired worker running once): median %s, p99 %s of %d, worst %s (%s)\n",
		med.Round(time.Millisecond), percentile(r.recoveryTimes, 99).Round(time.Millisecond), len(r.recoveryTimes), r.worst.Round(time.Millisecond), r.worstRound)
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
	fmt.Fprintf(&b, "nodes avoided at the end: %d (%d of them healthy)\n", len(r.avoidedEnd), r.avoidedOK)
	for _, a := range r.avoidedEnd {
		fmt.Fprintf(&b, "  - %s\n", a)
	}
	fmt.Fprintf(&b, "daemons that exited by themselves: %d\n", len(r.exited))
	for _, e := range r.exited {
		fmt.Fprintf(&b, "  - %s\n", e)
	}
	// The figures of the issue, on one line each, for a note.
	vouch := "no vouching (nodes the masters avoid are left to heal by themselves)"
	if r.vouch {
		vouch = "--vouch (avoided nodes undrained by the run after each heal)"
	}
	fmt.Fprintf(&b, "figures: %s of faults, %s\n", r.elapsed.Round(time.Second), vouch)
	fmt.Fprintf(&b, "  rounds %d, faults %d, violations %d\n", r.rounds, r.faults, len(r.violations))
	fmt.Fprintf(&b, "  recovery after each heal: median %s, p99 %s, worst %s (%d rounds with workers to run again)\n",
		med.Round(time.Millisecond), percentile(r.recoveryTimes, 99).Round(time.Millisecond), r.worst.Round(time.Millisecond), len(r.recoveryTimes))
	fmt.Fprintf(&b, "  longest any index ran twice: %s (plain job %s, link workers %s, routers %s; bound %s)\n",
		max(r.longestTwice, r.linkTwice, r.routerTwice).Round(time.Millisecond), r.longestTwice.Round(time.Millisecond),
		r.linkTwice.Round(time.Millisecond), r.routerTwice.Round(time.Millisecond), r.bound)
	if r.sink != "" {
		fmt.Fprintf(&b, "  %s\n", strings.ReplaceAll(r.sink, "\n", "\n  "))
	}
	fmt.Fprintf(&b, "  nodes avoided at the end: %d, healthy ones among them: %d\n", len(r.avoidedEnd), r.avoidedOK)
	fmt.Fprintf(&b, "  daemons that exited: %d\n", len(r.exited))
	fmt.Fprintf(&b, "violations: %d\n", len(r.violations))
	for _, v := range r.violations {
		fmt.Fprintf(&b, "  - %s\n", v)
	}
	return b.String()
}

// zkHosts are the hosts of the ensemble's servers, by server, and the leader's (nil if none
// leads now).
func (c *chaos) zkHosts() (all []*netlab.Host, leader *netlab.Host) {
	lead := c.lc.Ens.Leader()
	for _, s := range c.lc.Ens.Servers() {
		h := s.Host().(*netlab.Host)
		all = append(all, h)
		if s == lead {
			leader = h
		}
	}
	return all, leader
}

// pauseZKThenCutWorker pauses two ZooKeeper servers (the store down for everyone) until a
// worker node's keeper has probed them (found them hung), resumes them, and once that
// keeper's renewals go through the store's leader again, cuts the node's host off: the
// keeper must judge the cut afresh (silence: its leases lapse after --store-silence), not
// as the store still down because two servers were hung before. Were the node cut before
// its keeper had an answer again, the two faults would overlap, and the keeper, unable to
// tell a paused server from an unreachable one, would rightly keep its workers: the node is
// then not cut, and the report says so.
func (c *chaos) pauseZKThenCutWorker(claimed map[string]bool) *fault {
	n := pick(c.rng, c.lc.nodes)
	hosts, _ := c.zkHosts()
	claims := []string{n.id}
	for _, h := range hosts {
		claims = append(claims, h.Name())
	}
	if !free(claimed, claims...) {
		return nil
	}
	servers := c.lc.Ens.Servers()
	skip := c.rng.IntN(len(servers))
	var paused []string
	for i, s := range servers {
		if i != skip && len(paused) < 2 {
			s.Pause()
			paused = append(paused, s.Host().(*netlab.Host).Name())
		}
	}
	probed := waitFor(15*time.Second, func() bool {
		st, ok := c.lc.keeperStatus(n.id)
		return ok && st.State != agents.KeeperLive
	})
	for i, s := range servers {
		if i != skip {
			s.Resume()
		}
	}
	resumed := time.Now()
	target := fmt.Sprintf("%s paused and resumed, then %s", strings.Join(paused, "+"), n.id)
	answered := waitFor(60*time.Second, func() bool {
		st, ok := c.lc.keeperStatus(n.id)
		return ok && st.State == agents.KeeperLive && c.lc.leaseStamp(n.id).After(resumed)
	})
	if !answered {
		return &fault{target: target, claims: claims, heal: func() error { return nil },
			note: fmt.Sprintf("%s not cut: its keeper had no answer within 60s of the resume (probed during the pause: %v)", n.id, probed)}
	}
	f := &fault{target: target, claims: claims, heal: c.cutHosts([]*netlab.Host{n.host})}
	if !probed {
		f.note = n.id + "'s keeper did not probe the paused servers (its renewals went on)"
	}
	return f
}

// cutZKFollowerFromLeader cuts a ZooKeeper follower off from its leader alone: it still
// reaches the other follower, and every client still reaches it. It goes on answering its
// clients' reads for syncLimit ticks while the leader expires the sessions it no longer hears
// of; keepers renew only on syncs answered through the leader.
func (c *chaos) cutZKFollowerFromLeader(claimed map[string]bool) *fault {
	hosts, leader := c.zkHosts()
	if leader == nil {
		return nil
	}
	var fs []*netlab.Host
	for _, h := range hosts {
		if h != leader {
			fs = append(fs, h)
		}
	}
	h := pick(c.rng, fs)
	if !free(claimed, h.Name(), leader.Name()) {
		return nil
	}
	if err := h.CutFrom(context.Background(), leader); err != nil {
		c.t.Fatalf("chaos: %v", err)
	}
	return &fault{target: h.Name() + " from " + leader.Name(), claims: []string{h.Name(), leader.Name()},
		heal: func() error { return h.Heal(context.Background()) }}
}

// cutWorkerFromZKLeader cuts a worker node's host off from the ZooKeeper leader's host alone:
// the node still reaches the followers (its client moves to one), the masters and the other
// nodes.
func (c *chaos) cutWorkerFromZKLeader(claimed map[string]bool) *fault {
	_, leader := c.zkHosts()
	if leader == nil {
		return nil
	}
	n := pick(c.rng, c.lc.nodes)
	if !free(claimed, n.id, leader.Name()) {
		return nil
	}
	if err := n.host.CutFrom(context.Background(), leader); err != nil {
		c.t.Fatalf("chaos: %v", err)
	}
	return &fault{target: n.id + " from " + leader.Name(), claims: []string{n.id, leader.Name()},
		heal: func() error { return n.host.Heal(context.Background()) }}
}

// rejectHost cuts a host off as a REJECT firewall does: refused at once, both ways.
func (c *chaos) rejectHost(h *netlab.Host) func() error {
	if err := h.Reject(context.Background()); err != nil {
		c.t.Fatalf("chaos: %v", err)
	}
	return func() error { return h.Heal(context.Background()) }
}

func (c *chaos) rejectMasterHost(claimed map[string]bool) *fault {
	id := pick(c.rng, c.lc.spec.masters)
	if !free(claimed, id) {
		return nil
	}
	return &fault{target: id, claims: []string{id}, heal: c.rejectHost(c.lc.masterHost(id))}
}

// rejectZK cuts a ZooKeeper server's host off with REJECT rules: to every keeper it looks
// like a server that is down (refused), which with the others serving is no verdict of
// "store down". (A worker host cut off with REJECT rules is not among the faults: to its
// keeper every server refuses, as when the whole store is stopped, and it keeps its workers:
// see docs/operations.md.)
func (c *chaos) rejectZK(claimed map[string]bool, leader bool) *fault {
	hosts, lead := c.zkHosts()
	if lead == nil {
		return nil
	}
	h := lead
	if !leader {
		var fs []*netlab.Host
		for _, o := range hosts {
			if o != lead {
				fs = append(fs, o)
			}
		}
		h = pick(c.rng, fs)
	}
	if !free(claimed, h.Name()) {
		return nil
	}
	return &fault{target: h.Name(), claims: []string{h.Name()}, heal: c.rejectHost(h)}
}

// waitFor polls cond every 100ms until it holds (true) or d passes (false).
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}
