package scheduler

import (
	"fmt"
	"maps"
	"slices"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/multidc"
)

// routerSuffix names a mirrored job's router as a job of its own ("wordcount.router"):
// job names never hold a dot, so it cannot clash with a user's job.
const routerSuffix = ".router"

// Router resources: it holds bounded per-link buffers and little else.
var routerResources = cluster.Resources{Memory: 128 << 20, CPU: 200}

// routerURL is where a mirrored job's link workers send their output. Routers listen on
// loopback: every stormdock node of a cluster here shares one host.
func routerURL(rec cluster.JobRecord) string {
	return fmt.Sprintf("http://127.0.0.1:%d", rec.RouterPort)
}

// routerRecord is the job the master runs for a mirrored job's output router: one
// supervised worker placed like any other, outside the job's link data centers when the
// cluster has others, writing to the job's output.
func routerRecord(rec cluster.JobRecord, store string, dcs []string) cluster.JobRecord {
	j := rec.Spec
	args := multidc.DefaultRouterArgs()
	args.Store, args.Job, args.Links, args.Sink = store, j.Name, j.Links, j.Output
	args.Listen = fmt.Sprintf("127.0.0.1:%d", rec.RouterPort)
	args.TokenHash = rec.OutputTokenHash
	r := cluster.JobSpec{
		Name:      j.Name + routerSuffix,
		Tenant:    j.Tenant,
		Workers:   1,
		Resources: routerResources,
		Isolation: cluster.IsolationProcess,
		// "stormdock" is the agent's own binary (agents.SelfCommand).
		Command:     append([]string{"stormdock", multidc.RouterCommand}, args.Args()...),
		Priority:    j.Priority,
		GracePeriod: cluster.Duration(cluster.DefaultGracePeriod),
	}
	for _, dc := range dcs {
		if !slices.Contains(j.Links, dc) && (len(j.Placement.DCs) == 0 || slices.Contains(j.Placement.DCs, dc)) {
			r.Placement.DCs = append(r.Placement.DCs, dc)
		}
	}
	return cluster.JobRecord{Spec: r, Generation: rec.Generation, State: rec.State, Submitted: rec.Submitted, Updated: rec.Updated}
}

// addRouters adds the router job of every mirrored job to the view.
func (v *view) addRouters(store string) {
	dcs := slices.Sorted(maps.Keys(v.dcs))
	for _, name := range slices.Sorted(maps.Keys(v.jobs)) {
		rec := v.jobs[name].rec
		if rec.Spec.Mirrored() && rec.RouterPort != 0 {
			rr := routerRecord(rec, store, dcs)
			v.routers[rr.Spec.Name] = rr
		}
	}
}

// record finds a job, or a router job, by name.
func (v *view) record(name string) (cluster.JobRecord, bool) {
	if j, ok := v.jobs[name]; ok {
		return j.rec, true
	}
	r, ok := v.routers[name]
	return r, ok
}
