package master

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stormdock/stormdock/placement"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/multidc"
)

// routerSuffix names a mirrored job's routers as a job of their own ("wordcount.router"):
// job names never hold a dot, so it cannot clash with a user's job.
const routerSuffix = ".router"

// Router resources: it holds bounded per-link buffers and little else.
var routerResources = cluster.Resources{Memory: 128 << 20, CPU: 200}

// routerListen is where a router listens: its node's advertised address and the port its
// agent gave it. The router expands it from its environment; a router can be placed on any
// node, so no address is known when the command line is written.
const routerListen = "$" + "STORMDOCK_ADDR:$" + "STORMDOCK_PORT"

// routerRecord is the job the master runs for a mirrored job's output routers: supervised
// workers placed like any other, spread over data centers (and nodes) so that the output
// survives the loss of any one of them. They elect one leader, which alone writes the job's
// output; the other stands by, ready. With one node there is one router.
func routerRecord(rec cluster.JobRecord, store string, nodes int) cluster.JobRecord {
	j := rec.Spec
	routers := min(2, max(nodes, 1))
	if strings.HasPrefix(store, "mem:") {
		// Routers that cannot share their store (a local cluster's, held by one process)
		// cannot elect one leader among them: one router, no standby.
		routers = 1
	}
	args := multidc.DefaultRouterArgs()
	args.Store, args.Job, args.Links, args.Sink, args.Listen = store, j.Name, j.Links, j.Output, routerListen
	args.TokenHash, args.LinkTokenHashes = rec.OutputTokenHash, rec.OutputLinkTokenHashes
	// The router's agent gives it the sink dir; the tenant is the job's.
	args.Tenant = j.Tenant
	// The output secret's value is a file its agent delivers (STORMDOCK_SECRETS_DIR).
	args.OutputSecret = j.OutputSecret
	r := cluster.JobSpec{
		Name:      j.Name + routerSuffix,
		Tenant:    j.Tenant,
		Workers:   routers,
		Resources: routerResources,
		Isolation: cluster.IsolationProcess,
		// "stormdock" is the agent's own binary (agents.SelfCommand).
		Command:  append([]string{"stormdock", multidc.RouterCommand}, args.Args()...),
		Priority: j.Priority,
		// The job's own grace: a router copy fenced off with its node stops within it, as
		// the job's workers do, and a router flushes in far less than the default.
		GracePeriod: routerGrace(j.GracePeriod),
		Placement: cluster.PlacementSpec{Spread: []string{"dc", "node"}, MaxPerNode: 1,
			DCs: j.Placement.DCs, NodeLabels: maps.Clone(j.Placement.NodeLabels)},
	}
	if j.OutputSecret != "" {
		r.Secrets = []string{j.OutputSecret}
	}
	return cluster.JobRecord{Spec: r, Generation: rec.Generation, State: rec.State, Submitted: rec.Submitted, Updated: rec.Updated}
}

// RouterJobName is the name of a mirrored job's router job ("wc.router"), whose workers 0 and
// 1 are its routers.
func RouterJobName(job string) string { return job + routerSuffix }

// LeadingRouter returns the worker index, in the job's router job, of the router that leads
// (the one its record names), as api.ErrNotFound when none does now.
func (m *Master) LeadingRouter(ctx context.Context, v *View, job string) (int, error) {
	rr, ok := v.routers[RouterJobName(job)]
	if !ok {
		return 0, fmt.Errorf("%w: job %s has no routers", api.ErrNotFound, job)
	}
	rec, found, err := multidc.ReadRecord(ctx, m.store, job)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	for _, k := range rr.Spec.Keys() {
		if u, ok := v.routerURL(k); ok && found && u == rec.Router {
			return k.Worker, nil
		}
	}
	return 0, fmt.Errorf("%w: no router of job %s leads now (see `stormdock job status %s`): name one with --worker 0 or --worker 1", api.ErrNotFound, job, job)
}

// routerGrace is a router's grace period: the mirrored job's, or the default.
func routerGrace(job cluster.Duration) cluster.Duration {
	if job > 0 {
		return job
	}
	return cluster.Duration(cluster.DefaultGracePeriod)
}

// addRouters adds the router job of every mirrored job to the view.
func (v *View) addRouters(store string) {
	for _, name := range slices.Sorted(maps.Keys(v.jobs)) {
		rec := v.jobs[name].rec
		if rec.Spec.Mirrored() {
			rr := routerRecord(rec, store, len(v.nodes))
			v.routers[rr.Spec.Name] = rr
		}
	}
}

// RouterURLs are where a mirrored job's routers serve, as their agents report them running,
// in worker order: what the job's link workers send to.
func (v *View) RouterURLs(job string) []string {
	rr, ok := v.routers[job+routerSuffix]
	if !ok {
		return nil
	}
	var out []string
	for _, k := range rr.Spec.Keys() {
		if u, ok := v.routerURL(k); ok {
			out = append(out, u)
		}
	}
	return out
}

// routerURL is where the router k serves, as its agent reports it running.
func (v *View) routerURL(k cluster.WorkerKey) (string, bool) {
	s, ok := v.statuses[k]
	if !ok || s.status.State != cluster.WorkerRunning || s.status.Port == 0 {
		return "", false
	}
	addr := v.nodes[s.node].Node.Addr
	if addr == "" {
		addr = "127.0.0.1" // an agent from before advertised addresses: one host
	}
	// Routers serve HTTPS with a certificate from the router CA (see multidc).
	return fmt.Sprintf("https://%s", net.JoinHostPort(addr, strconv.Itoa(s.status.Port))), true
}

// staleRouter is how old a router's record may be before the sink counts as not fed: a
// leading router rewrites it at least every second (multidc.Config.StatusInterval).
const staleRouter = 5 * time.Second

// SinkView says where a mirrored job's output stands, from its routers' record.
func (m *Master) SinkView(ctx context.Context, v *View, job string) *api.SinkView {
	sv := &api.SinkView{Routers: v.RouterURLs(job)}
	rec, ok, err := multidc.ReadRecord(ctx, m.store, job)
	switch {
	case err != nil:
		sv.Problem = fmt.Sprintf("cannot read the router's record: %v", err)
	case !ok:
		sv.Problem = "no router has led yet"
	default:
		sv.Leader, sv.Active, sv.Delivered, sv.Updated = rec.Router, rec.Active, rec.Delivered, rec.Updated
		sv.Leading, sv.Epoch, sv.Failovers, sv.SpuriousFailovers = rec.Leading, rec.Epoch, rec.Failovers, rec.SpuriousFailovers
		switch age := time.Since(rec.Updated); {
		case age > staleRouter:
			sv.Problem = fmt.Sprintf("the leading router (%s) has not recorded anything for %s: it is down or cut off", rec.Router, age.Round(time.Second))
		case rec.SinkError != "" && (rec.Active == "" || rec.SinkErrorSince == nil || time.Since(*rec.SinkErrorSince) > sinkErrorGrace):
			since := ""
			if rec.SinkErrorSince != nil {
				since = fmt.Sprintf(" for %s", time.Since(*rec.SinkErrorSince).Round(time.Second))
			}
			sv.Problem = fmt.Sprintf("the router (%s) cannot write the sink%s: %s", rec.Router, since, rec.SinkError)
		case rec.Active == "":
			sv.Problem = "no link is active: no link's workers heartbeat to the router"
		case len(sv.Routers) == 0:
			sv.Problem = "no router of the job runs"
		}
	}
	sv.Fed = sv.Problem == ""
	sv.SharedDC = v.routersSharedDC(job)
	return sv
}

// sinkErrorGrace is how long a leading router's writes may fail before `job status` says
// the sink is not fed: a write retried at once is not worth a word. A sink the router cannot
// open is said at once.
const sinkErrorGrace = 2 * time.Second

// routersSharedDC returns the data center both of a job's running routers are in, "" when
// they are in two (or fewer than two run).
func (v *View) routersSharedDC(job string) string {
	rr, ok := v.routers[job+routerSuffix]
	if !ok || rr.Spec.Workers < 2 {
		return ""
	}
	dcs := map[string]int{}
	n := 0
	for _, k := range rr.Spec.Keys() {
		s, ok := v.statuses[k]
		if !ok || s.status.State != cluster.WorkerRunning {
			continue
		}
		if rec, ok := v.nodes[s.node]; ok {
			dcs[rec.Node.DC]++
			n++
		}
	}
	if n < 2 || len(dcs) != 1 {
		return ""
	}
	for dc := range dcs {
		return dc
	}
	return ""
}

// record finds a job, or a router job, by name.
func (v *View) record(name string) (cluster.JobRecord, bool) {
	if j, ok := v.jobs[name]; ok {
		return j.rec, true
	}
	r, ok := v.routers[name]
	return r, ok
}

// CheckSinkDir refuses a spec whose file sink is not confined to the cluster's sink dir
// (cluster.JobSpec.CheckSinkDir), as api.ErrBadInput.
func (m *Master) CheckSinkDir(spec *cluster.JobSpec) error {
	if err := spec.CheckSinkDir(m.cfg.SinkDir); err != nil {
		return fmt.Errorf("%w: %v", api.ErrBadInput, err)
	}
	return nil
}

// apartRetry is how long routersApart waits before planning a standby router's move again
// after a plan found it no other data center.
const apartRetry = 10 * time.Second

// routersApart moves a mirrored job's standby router to another data center when both of its
// routers are in one (a data center was lost, and has come back or another has room again):
// the loss of that one data center would stop the output. The standby holds no state, so
// moving it costs no output; the leader stays. It plans once more without the standby's
// current node, and takes that plan only if it puts the standby in another data center than
// the leader's, changing nothing else.
func (r *reconciler) routersApart(ctx context.Context, v *View, in placement.Input, res *placement.Result, held map[cluster.WorkerKey]string) (*placement.Result, map[cluster.WorkerKey]string, error) {
	dcOf := func(node string) string { return v.nodes[node].Node.DC }
	byJob := map[string][]cluster.Placement{}
	for _, p := range res.Placements {
		if isRouterJob(p.Job) {
			byJob[p.Job] = append(byJob[p.Job], p)
		}
	}
	liveDCs := map[string]bool{}
	for _, n := range in.Nodes {
		liveDCs[n.DC] = true
	}
	for _, name := range slices.Sorted(maps.Keys(byJob)) {
		ps := byJob[name]
		rr := v.routers[name]
		if len(ps) != 2 || dcOf(ps[0].Node) == "" || dcOf(ps[0].Node) != dcOf(ps[1].Node) {
			continue
		}
		shared := dcOf(ps[0].Node)
		other := false
		for dc := range liveDCs {
			other = other || dc != shared && (len(rr.Spec.Placement.DCs) == 0 || slices.Contains(rr.Spec.Placement.DCs, dc))
		}
		if !other || time.Since(r.apartTried[name]) < apartRetry {
			continue
		}
		// Both placements must be where the routers run now: a router just placed is not
		// moved again.
		standby := r.standbyRouter(ctx, v, strings.TrimSuffix(name, routerSuffix), ps)
		if standby < 0 {
			continue
		}
		trial := in
		trial.Current = slices.DeleteFunc(slices.Clone(in.Current), func(p cluster.Placement) bool { return p.Key() == ps[standby].Key() })
		tres, theld, err := r.planWhole(v, trial)
		if err != nil {
			return res, held, err
		}
		to := ""
		for _, p := range tres.Placements {
			if p.Key() == ps[standby].Key() {
				to = p.Node
			}
		}
		// The trial plans the standby afresh (it is not in the trial's Current), so its new
		// place is no Move there: nothing else may move (the check used to want one more
		// move, which a trial never has, and no standby was ever moved back).
		if to == "" || dcOf(to) == shared || len(tres.Moves) != len(res.Moves) {
			if r.apartTried == nil {
				r.apartTried = map[string]time.Time{}
			}
			r.apartTried[name] = time.Now()
			continue
		}
		r.m.log.Info("moving a standby router to another data center: both of the job's routers were in one",
			"router", ps[standby].Key().String(), "dc", shared, "from", ps[standby].Node, "to", to)
		delete(r.apartTried, name)
		tres.Moves = append(tres.Moves, placement.Move{Job: ps[standby].Job, Worker: ps[standby].Worker, Link: ps[standby].Link,
			From: ps[standby].Node, To: to, Reason: "routers apart: both of the job's routers were in " + shared})
		res, held = tres, theld
	}
	return res, held, nil
}

// standbyRouter returns which of a job's two router placements is the standby (the one the
// router record does not name as leading), -1 when it cannot tell or a router does not run
// where it is placed.
func (r *reconciler) standbyRouter(ctx context.Context, v *View, job string, ps []cluster.Placement) int {
	rec, ok, err := multidc.ReadRecord(ctx, r.m.store, job)
	if err != nil {
		return -1
	}
	leaders, standby := 0, -1
	for i, p := range ps {
		s, reported := v.statuses[p.Key()]
		if !reported || s.node != p.Node || s.status.State != cluster.WorkerRunning {
			return -1
		}
		if url, _ := v.routerURL(p.Key()); ok && url == rec.Router {
			leaders++
		} else {
			standby = i
		}
	}
	if !ok {
		return 1 // no router has led yet: either will do
	}
	if leaders != 1 {
		return -1 // the record names neither (a leader that is gone): not now
	}
	return standby
}
