package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/natstest"
	"github.com/stormdock/stormdock/internal/pgtest"
)

// The chaos run (issue 14): a cluster across lab hosts, a plain job on it, and for a given
// time random faults (host, data-center, master and ZooKeeper partitions; SIGKILL and SIGSTOP
// of agents, keepers, masters and workers), each healed after a random hold. All the time it
// checks, from /proc and not through the project's API, that no worker runs twice beyond the
// fencing bound; after each round that every desired worker runs again within the recovery
// bound; and now and then that the control plane still scales the job. It prints a report
// and fails on any violation. scripts/chaos runs it for as long as asked; the suite runs it
// briefly.
var (
	chaosDuration   = flag.Duration("chaos.duration", 75*time.Second, "how long TestChaos injects faults")
	chaosSeed       = flag.Uint64("chaos.seed", 0, "seed of TestChaos's fault sequence (0: from the clock; the report says which)")
	chaosRecovery   = flag.Duration("chaos.recovery", 60*time.Second, "bound within which every desired worker must run again after a round's faults are healed")
	chaosReportFile = flag.String("chaos.report", "", "also write TestChaos's report to this file")
	chaosHold       = flag.Duration("chaos.hold", 6*time.Second, "longest a fault is held before it is healed (holds are random, from 500ms)")
	chaosFaults     = flag.String("chaos.faults", "", "inject only these fault kinds (comma-separated names, as in the report); default every kind")
	chaosVouch      = flag.Bool("chaos.vouch", false, "after each heal, undrain every node the masters avoid for the job after a crash loop, as an operator who knows the faults were injected would")
	chaosSinks      = flag.String("chaos.sinks", "file", "the mirrored jobs beside the plain one, by sink, comma-separated: file (a growing file in), postgres and jetstream (a JetStream stream in; PostgreSQL and nats-server on lab hosts of their own)")
)

func TestChaos(t *testing.T) {
	seed := *chaosSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	spec := plainLabSpec()
	if *chaosSinks != "file" {
		// Each mirrored job more is 4 link workers bound to their data centers and 2 routers:
		// with dc-a cut, the plain job, the docker job, dc-b's link workers and every router
		// must fit on the 4 nodes left (26 workers with all three sinks).
		spec.slots = 8
	}
	dockerOn, noDocker := chaosDockerAvailable(t)
	if dockerOn {
		spec.agentArgs = []string{"--isolation", "process,docker"}
	}
	lc := newLabCluster(t, spec)
	c := &chaos{
		t: t, lc: lc, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), job: "wc", workers: 12,
		recovery: *chaosRecovery, hold: *chaosHold,
		rep: &chaosReport{seed: seed, duration: *chaosDuration, byKind: map[string]*kindStats{}, vouch: *chaosVouch},
	}
	c.rep.setup = fmt.Sprintf("job %s (%d workers, spread over dc and rack) on %d nodes in %d data centers (%s), masters %v, %d ZooKeeper servers, session timeout %s",
		c.job, c.workers, len(lc.nodes), len(spec.dcs), strings.Join(spec.dcs, ", "), spec.masters, spec.zkServers, spec.session)
	lc.submit(t, jobSpec(c.job, c.workers))
	waitRunning(t, c.job, c.workers, 60*time.Second)
	c.fence = watchFence(t, c.job, fencingBound(lc.Session, labJobGrace))
	c.rep.bound = c.fence.bound
	c.mirror = startMirror(t, lc, "mirror", 50)
	waitMirrorRunning(t, c.mirror)
	c.sink = watchSink(t, c.mirror.sink)
	c.routerFence = watchFence(t, c.mirror.name+routerJobSuffix, fencingBound(lc.Session, labJobGrace))
	c.linkFence = watchFence(t, c.mirror.name, fencingBound(lc.Session, labJobGrace))
	c.rep.setup += fmt.Sprintf("; mirrored job %s (links dc-a and dc-b, %d workers each, router outside them, 50 input lines/s)", c.mirror.name, c.mirror.workers)
	if dockerOn {
		c.docker = startDockerChaos(t, lc, 2)
		c.rep.setup += fmt.Sprintf("; docker job %s (%d workers running their image's own CMD)", c.docker.job, c.docker.workers)
	} else {
		c.rep.note(noDocker)
	}
	c.startFencingMirrors()
	t.Logf("chaos: seed %d, %s", seed, c.rep.setup)

	start := time.Now()
	deadline := start.Add(*chaosDuration)
	for round := 1; time.Now().Before(deadline); round++ {
		c.round(round)
		if round%10 == 0 {
			c.controlPlane(round)
		}
		if c.broken {
			break
		}
	}
	if !c.broken {
		c.controlPlane(-1)
	}
	c.avoidedAtEnd()
	if c.mirror != nil {
		c.finishMirror()
	}
	if c.docker != nil {
		v, longest, key, _ := c.docker.fence.report()
		for _, s := range v {
			c.violation("ran twice beyond the fencing bound: " + s)
		}
		c.rep.note(fmt.Sprintf("%s (docker, the image's own CMD): longest a worker ran twice: %s (worker %q)", c.docker.job, longest.Round(time.Millisecond), key))
	}
	c.rep.elapsed = time.Since(start)
	v, longest, key, samples := c.fence.report()
	c.rep.longestTwice, c.rep.longestKey, c.rep.samples = longest, key, samples
	c.rep.longestDetail = c.fence.longestDetail()
	for _, s := range v {
		c.violation("ran twice beyond the fencing bound: " + s)
	}
	report := c.rep.String()
	t.Log("\n" + report)
	if *chaosReportFile != "" {
		if err := os.WriteFile(*chaosReportFile, []byte(report), 0o644); err != nil {
			t.Errorf("chaos report: %v", err)
		}
	}
	for _, v := range c.rep.violations {
		t.Error(v)
	}
}

// round injects one fault, or now and then two at once, holds them, heals them and waits for
// every desired worker to run again.
func (c *chaos) round(n int) {
	t := c.t
	count := 1
	if c.rng.IntN(10) < 3 {
		count = 2
	}
	var active []*fault
	claimed := map[string]bool{}
	for range count {
		f := c.inject(claimed)
		if f == nil {
			continue
		}
		active = append(active, f)
		for _, r := range f.claims {
			claimed[r] = true
		}
	}
	if len(active) == 0 {
		return
	}
	names := make([]string, len(active))
	for i, f := range active {
		names[i] = f.String()
	}
	hold := 500*time.Millisecond + time.Duration(c.rng.Int64N(int64(c.hold-500*time.Millisecond)+1))
	t.Logf("chaos: round %d: %s, held %s", n, strings.Join(names, " + "), hold.Round(time.Millisecond))
	// The fault's length is what is under test, not a wait for evidence: meanwhile, note
	// when a desired worker first stopped running.
	injected := time.Now()
	var missing time.Time
	for time.Since(injected) < hold {
		if missing.IsZero() && !c.allRunning() {
			missing = time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, f := range active {
		if err := f.heal(); err != nil {
			c.violation(fmt.Sprintf("round %d: healing %s: %v", n, f, err))
		}
	}
	if *chaosVouch {
		c.vouch()
	}
	took, ok := c.recover(fmt.Sprintf("round %d (%s)", n, strings.Join(names, " + ")))
	if missing.IsZero() && took > 100*time.Millisecond {
		missing = time.Now().Add(-took)
	}
	var outage time.Duration
	if !missing.IsZero() {
		outage = time.Since(missing)
	}
	c.rep.round(names, active, took, outage, ok)
	if ok {
		t.Logf("chaos: round %d: every worker running %s after the heal; a worker was down for %s", n, took.Round(time.Millisecond), outage.Round(time.Millisecond))
	}
	c.checkProcesses(n)
}

// allRunning reports whether every desired worker runs as one process (the mirrored job's
// link workers and router included).
func (c *chaos) allRunning() bool {
	ps, all := procsOf(c.job), workerProcs(c.job)
	if len(ps) != c.workers || len(all) != c.workers {
		return false
	}
	if c.docker != nil && !c.docker.running() {
		return false
	}
	for _, m := range c.mirrors() {
		ps, all := procsOf(m.name), workerProcs(m.name)
		if ok, _ := routersRunning(m); !ok || len(ps) != 2*m.workers || len(all) != 2*m.workers {
			return false
		}
	}
	return true
}

// mirrors are the run's mirrored jobs.
func (c *chaos) mirrors() []*mirrorJob {
	if c.mirror == nil {
		return nil
	}
	return append([]*mirrorJob{c.mirror}, c.extra...)
}

// startFencingMirrors starts the mirrored jobs -chaos.sinks asks for beside the file one:
// reading a JetStream stream (on a lab host of its own, 50 lines/s), writing PostgreSQL (on
// a lab host of its own) or a JetStream subject.
func (c *chaos) startFencingMirrors() {
	t, lc := c.t, c.lc
	sinks := strings.Split(*chaosSinks, ",")
	pgWanted, jsWanted := slices.Contains(sinks, "postgres"), slices.Contains(sinks, "jetstream")
	if !pgWanted && !jsWanted {
		return
	}
	ns := natstest.Start(t, natstest.Options{Host: lc.lab.AddHosts(t, "nats")[0], Dial: lc.lab.DialContext})
	c.jsIn = startJSInput(t, ns, "IN", 50)
	if pgWanted {
		pg := pgtest.Start(t, pgtest.Options{Host: lc.lab.AddHosts(t, "pg")[0], Dial: lc.lab.DialContext})
		m := submitMirror(t, lc, "mirrorpg", ns.URL()+"/IN", fmt.Sprintf("postgres://%s@%s/postgres?table=mirrorpg&sslmode=disable", pgtest.Superuser, pg.Addr()))
		waitMirrorRunning(t, m)
		m.watch = watchPG(t, pg, "postgres", "mirrorpg")
		c.extra = append(c.extra, m)
	}
	if jsWanted {
		m := submitMirror(t, lc, "mirrorjs", ns.URL()+"/IN", ns.URL()+"/mirrorjs.out")
		waitMirrorRunning(t, m)
		m.watch = watchJetStream(t, ns, "mirrorjs.out")
		c.extra = append(c.extra, m)
	}
	for _, m := range c.extra {
		c.extraFences = append(c.extraFences, watchFence(t, m.name, fencingBound(lc.Session, labJobGrace)),
			watchFence(t, m.name+routerJobSuffix, fencingBound(lc.Session, labJobGrace)))
		c.rep.setup += fmt.Sprintf("; mirrored job %s (a JetStream stream in, 50 lines/s, into %s)", m.name, strings.TrimPrefix(m.name, "mirror"))
	}
}

// finishMirror stops the mirrored job's input and checks that the sink receives all of it,
// every offset once.
func (c *chaos) finishMirror() {
	total := c.mirror.stop()
	deadline := time.Now().Add(2 * c.recovery)
	for {
		n, _, _ := c.sink.delivered()
		if n >= total {
			break
		}
		if time.Now().After(deadline) {
			c.violation(fmt.Sprintf("the sink holds %d of the %d input lines %s after the input stopped", n, total, 2*c.recovery))
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.sink.end()
	for _, v := range c.sink.report() {
		c.violation("sink: " + v)
	}
	for _, f := range []*fenceWatch{c.linkFence, c.routerFence} {
		v, longest, key, _ := f.report()
		for _, s := range v {
			c.violation("ran twice beyond the fencing bound: " + s)
		}
		c.rep.note(fmt.Sprintf("%s: longest a worker ran twice: %s (worker %q)", f.job, longest.Round(time.Millisecond), key))
		if f == c.linkFence {
			c.rep.linkTwice = longest
		} else {
			c.rep.routerTwice = longest
		}
	}
	n, _, _ := c.sink.delivered()
	gap, end := c.sink.longestGap()
	c.rep.sink = fmt.Sprintf("sink: %d of %d offsets, each once and in order; longest without a record: %s (until %s); %s",
		n, total, gap.Round(time.Millisecond), end.Format("15:04:05"), stallFigure(c.sink, &c.mirror.written))
	if c.jsIn == nil {
		return
	}
	total = c.jsIn.stop()
	for _, m := range c.extra {
		deadline := time.Now().Add(2 * c.recovery)
		for {
			n, _, _ := m.watch.delivered()
			if n >= total || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		m.watch.end()
		for _, v := range m.watch.report() {
			c.violation(m.name + " sink: " + v)
		}
		n, _, _ := m.watch.delivered()
		if n < total {
			c.violation(fmt.Sprintf("the %s sink holds %d of the %d input lines %s after the input stopped", m.name, n, total, 2*c.recovery))
		}
		gap, end := m.watch.longestGap()
		c.rep.sink += fmt.Sprintf("\n%s sink: %d of %d offsets, each once and in order, no write of a fenced router kept (fencing epoch at the end %d); longest without a record: %s (until %s); %s",
			m.name, n, total, m.watch.epochs(), gap.Round(time.Millisecond), end.Format("15:04:05"), stallFigure(m.watch, &c.jsIn.written))
	}
	for _, f := range c.extraFences {
		v, longest, key, _ := f.report()
		for _, s := range v {
			c.violation("ran twice beyond the fencing bound: " + s)
		}
		c.rep.note(fmt.Sprintf("%s: longest a worker ran twice: %s (worker %q)", f.job, longest.Round(time.Millisecond), key))
	}
}

// stallFigure is the sink's longest gap while its input kept flowing (longestStall), for the
// report's sink lines.
func stallFigure(s *sinkWatch, in *inputLog) string {
	d, o, end := s.longestStall(in)
	return fmt.Sprintf("longest gap in the sink while input kept flowing: %s (until offset %d at %s)", d.Round(time.Millisecond), o, end.Format("15:04:05"))
}

// recover waits until every desired worker runs, once, and reports how long that took after
// the heal; past the recovery bound it records a violation and waits on (a run that does not
// recover at all is over).
func (c *chaos) recover(what string) (time.Duration, bool) {
	start := time.Now()
	flagged := false
	var vouched time.Time
	for {
		if c.allRunning() {
			return time.Since(start), !flagged
		}
		// Crash loops a fault caused can be counted after its heal (a worker stopped at its
		// lease's lapse, started again, stopped): the operator vouches while waiting too.
		if *chaosVouch && time.Since(vouched) > time.Second {
			c.vouch()
			vouched = time.Now()
		}
		ps, all := procsOf(c.job), workerProcs(c.job)
		d := time.Since(start)
		if d > c.recovery && !flagged {
			flagged = true
			mirror := ""
			if m := c.mirror; m != nil {
				_, why := routersRunning(m)
				mirror = fmt.Sprintf("; mirrored job: %d of %d link workers running once, %s", len(procsOf(m.name)), 2*m.workers, why)
			}
			if c.docker != nil {
				mirror += fmt.Sprintf("; docker job: %v", containerProcs(c.docker.job))
			}
			c.violation(fmt.Sprintf("%s: %d of %d workers running once (%d with a process)%s %s after the heal, beyond the recovery bound %s%s",
				what, len(ps), c.workers, len(all), mirror, d.Round(time.Millisecond), c.recovery, c.unplaced()))
		}
		if d > 5*c.recovery {
			c.violation(fmt.Sprintf("%s: the cluster did not recover in %s: run stopped", what, d.Round(time.Second)))
			c.broken = true
			return d, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// vouch undrains every node that the masters avoid for the job after a crash loop (the
// operator's way to vouch for a node again), and notes it in the report.
func (c *chaos) vouch() {
	for _, id := range c.lc.spec.masters {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		cl := c.lc.client(id)
		ns, err := cl.Nodes(ctx)
		if err != nil {
			cancel()
			continue
		}
		jobs := []string{c.job}
		for _, m := range c.mirrors() {
			jobs = append(jobs, m.name, m.name+routerJobSuffix)
		}
		if c.docker != nil {
			jobs = append(jobs, c.docker.job)
		}
		for _, n := range ns {
			for _, job := range jobs {
				if !slices.Contains(n.Avoid, job) {
					continue
				}
				if err := cl.DrainNode(ctx, n.ID, false); err == nil {
					c.rep.note(fmt.Sprintf("node avoided for %s after a crash loop, undrained by the run (-chaos.vouch)", job))
					c.t.Logf("chaos: node %s avoided for %s after a crash loop: undrained", n.ID, job)
				}
				break // an undrain vouches for the node for every job
			}
		}
		cancel()
		return
	}
}

// avoidedAtEnd notes, for the report, every node a master avoids for a job when the run
// ends, and whether it is healthy (the goal: none that is). Avoidance ends by itself after
// --avoid-period; a healthy node still avoided is one a fault's stops were counted against.
func (c *chaos) avoidedAtEnd() {
	for _, id := range c.lc.spec.masters {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ns, err := c.lc.client(id).Nodes(ctx)
		cancel()
		if err != nil {
			continue
		}
		for _, n := range ns {
			if len(n.Avoid) == 0 {
				continue
			}
			var until []string
			for _, a := range n.Avoided {
				if !slices.Contains(n.Avoid, a.Job) {
					continue
				}
				until = append(until, fmt.Sprintf("%s until %s (%d strikes)", a.Job, a.Until.Format("15:04:05"), a.Strikes))
			}
			c.rep.avoidedEnd = append(c.rep.avoidedEnd, fmt.Sprintf("%s (%s) avoids %s: %s", n.ID, n.Health, strings.Join(n.Avoid, ", "), strings.Join(until, "; ")))
			if n.Health == cluster.HealthHealthy {
				c.rep.avoidedOK++
			}
		}
		return
	}
	c.rep.note("no master answered at the end: nodes avoided unknown")
}

// unplaced says, for a violation's message, why the masters leave workers unplaced (their
// API is asked only to explain, never to judge).
func (c *chaos) unplaced() string {
	jobs := []string{c.job}
	for _, m := range c.mirrors() {
		jobs = append(jobs, m.name)
	}
	if c.docker != nil {
		jobs = append(jobs, c.docker.job)
	}
	var why []string
	for _, job := range jobs {
		for _, id := range c.lc.spec.masters {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			js, err := c.lc.client(id).Job(ctx, job)
			cancel()
			if err != nil {
				continue
			}
			for _, w := range js.Workers {
				if w.State == "unplaced" {
					key := fmt.Sprint(w.Worker)
					if w.Link != "" {
						key = w.Link + "/" + key
					}
					why = append(why, fmt.Sprintf("%s worker %s: %s", job, key, w.Reason))
				}
			}
			if js.Sink != nil && js.Sink.Problem != "" {
				why = append(why, fmt.Sprintf("%s sink: %s", job, js.Sink.Problem))
			}
			break
		}
	}
	if len(why) > 0 {
		return " (the master says: " + strings.Join(why, "; ") + ")"
	}
	return ""
}

// controlPlane checks that a master still places work: the job scaled out by one runs, and
// scaled back, within the recovery bound.
func (c *chaos) controlPlane(round int) {
	start := time.Now()
	c.lc.tryScale(c.job, c.workers+1)
	ok := c.waitCount(c.workers+1, c.recovery)
	c.lc.tryScale(c.job, c.workers)
	ok = c.waitCount(c.workers, c.recovery) && ok
	took := time.Since(start)
	c.rep.controlChecks++
	if !ok {
		c.violation(fmt.Sprintf("after round %d: scaling %s out by one and back did not run within %s", round, c.job, c.recovery))
		return
	}
	c.rep.worstControl = max(c.rep.worstControl, took)
	c.t.Logf("chaos: after round %d: scaled out and back in %s", round, took.Round(time.Millisecond))
}

func (c *chaos) waitCount(n int, bound time.Duration) bool {
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		if ps, all := procsOf(c.job), workerProcs(c.job); len(ps) == n && len(all) == n {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

func (c *chaos) violation(s string) {
	c.t.Log("chaos: VIOLATION: " + s)
	c.rep.violations = append(c.rep.violations, s)
}

// pick returns a random element.
func pick[T any](rng *rand.Rand, xs []T) T { return xs[rng.IntN(len(xs))] }

// keys returns a map's keys sorted, for a deterministic pick from a seed.
func keysOf[V any](m map[string]V) []string {
	out := sortedKeys(m)
	slices.Sort(out)
	return out
}
