package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/console"
	"github.com/stormdock/stormdock/internal/profiling"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/desired"
)

// New returns the HTTP API of master m and the web console (at /ui/, package console).
// Every master serves them, leader or not: reads come from the master's snapshot and
// mirrors, and writes go to the store (package master/desired), where the leader picks
// them up.
func New(m *master.Master, cfg Config) *API {
	cfg.defaults()
	if cfg.Registry == nil {
		cfg.Registry = m.Registry()
	}
	a := &API{m: m, cfg: cfg, store: m.Store(), log: m.Logger(), authFails: api.NewFailLimiter(),
		logKey: m.Agents(), metrics: newMetrics(cfg.Registry)}
	a.block = newBlockHub(a)
	mux := http.NewServeMux()
	route := func(pattern string, need role, h http.HandlerFunc) {
		mux.HandleFunc(pattern, a.timed(pattern, a.secure(pattern, need, h)))
		a.routes = append(a.routes, pattern)
	}
	route("GET /v1/health", roleNone, a.getHealth)
	route("GET /v1/jobs", roleTenant, a.block.serve(a.listJobs))
	route("POST /v1/jobs", roleTenant, a.submitJob)
	route("GET /v1/jobs/{name}", roleTenant, a.block.serve(a.getJob))
	route("POST /v1/jobs/{name}/scale", roleTenant, a.scaleJob)
	route("POST /v1/jobs/{name}/autoscale", roleTenant, a.autoscaleJob)
	route("POST /v1/jobs/{name}/kill", roleTenant, a.killJob)
	route("POST /v1/jobs/{name}/update", roleTenant, a.updateJob)
	route("POST /v1/jobs/{name}/rollback", roleTenant, a.rollbackJob)
	route("POST /v1/jobs/{name}/restart", roleTenant, a.restartJob)
	route("POST /v1/jobs/{name}/pause", roleTenant, a.rolloutAction(desired.ActionPause))
	route("POST /v1/jobs/{name}/resume", roleTenant, a.rolloutAction(desired.ActionResume))
	route("POST /v1/jobs/{name}/promote", roleTenant, a.rolloutAction(desired.ActionPromote))
	route("GET /v1/jobs/{name}/history", roleTenant, a.jobHistory)
	route("GET /v1/jobs/{name}/spec", roleTenant, a.jobSpec)
	route("GET /v1/jobs/{name}/logs", roleTenant, a.jobLogs)
	route("GET /v1/jobs/{name}/metrics", roleTenant, a.jobMetrics)
	route("GET /v1/jobs/{name}/metrics/workers", roleTenant, a.jobWorkerMetrics)
	route("GET /v1/metrics/latest", roleTenant, a.latestMetrics)
	route("GET /v1/events", roleTenant, a.listEvents)
	route("POST /v1/events", roleAdmin, a.recordEvent)
	route("GET /v1/nodes", roleTenant, a.block.serve(a.listNodes))
	route("POST /v1/nodes/{id}/drain", roleAdmin, a.drainNode(true))
	route("POST /v1/nodes/{id}/undrain", roleAdmin, a.drainNode(false))
	route("GET /v1/dcs", roleTenant, a.block.serve(a.listDCs))
	route("POST /v1/dcs/{dc}/fail", roleAdmin, a.setDC(cluster.DCFailed))
	route("POST /v1/dcs/{dc}/restore", roleAdmin, a.setDC(cluster.DCActive))
	route("GET /v1/tenants", roleTenant, a.block.serve(a.listTenants))
	route("POST /v1/tenants", roleAdmin, a.createTenant)
	route("POST /v1/tenants/{name}/token", roleAdmin, a.tenantToken)
	route("POST /v1/tenants/{name}/update", roleAdmin, a.updateTenant)
	route("POST /v1/tenants/{name}/registry-auth", roleTenant, a.setRegistryAuth)
	route("POST /v1/tenants/{name}/registry-auth/clear", roleTenant, a.clearRegistryAuth)
	route("GET /v1/secrets", roleTenant, a.listSecrets)
	route("POST /v1/secrets/rewrap", roleAdmin, a.rewrapSecrets)
	route("POST /v1/tenants/{name}/secrets/{secret}", roleTenant, a.setSecret)
	route("POST /v1/tenants/{name}/secrets/{secret}/delete", roleTenant, a.deleteSecret)
	route("GET /v1/images/shared", roleAdmin, a.sharedImages)
	route("POST /v1/images/share", roleAdmin, a.shareImages(true))
	route("POST /v1/images/unshare", roleAdmin, a.shareImages(false))
	route("GET /v1/watch", roleTenant, newWatchHub(a).serve)
	route("GET /v1/jobs/{name}/links", roleTenant, a.getLinks)
	route("POST /v1/jobs/{name}/failover", roleTenant, a.failover)
	// Not one of a.routes: no API token opens it; the node signs it with its own key.
	mux.HandleFunc("POST /v1/nodes/{id}/secrets", a.nodeSecrets)
	mux.Handle("GET "+console.Prefix, console.Handler())
	mux.Handle("GET /{$}", http.RedirectHandler(console.Prefix, http.StatusFound))
	if cfg.Gatherer != nil {
		// Not one of a.routes: no API token opens it, and the scrape token opens nothing else.
		mux.HandleFunc("GET /metrics", a.guard(roleScrape, promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{}).ServeHTTP))
	}
	// The jobs' series for Prometheus federation: opened by the same tokens as /metrics.
	mux.HandleFunc("GET /v1/metrics/jobs", a.guard(roleScrape, a.federate))
	// The master's Go profiles and runtime figures (pprof), for the admin alone; not one of
	// a.routes either: no tenant reaches them.
	mux.HandleFunc("GET "+profiling.Prefix, a.guard(roleAdmin, profiling.Handler().ServeHTTP))
	mux.HandleFunc("/", notFound(mux))
	a.mux = mux
	return a
}

func fail(w http.ResponseWriter, sentinel error, format string, args ...any) {
	api.Errorf(w, sentinel, fmt.Sprintf(format, args...))
}

func failErr(w http.ResponseWriter, err error) { api.WriteError(w, err) }

func reply(w http.ResponseWriter, status int, v any) { api.WriteJSON(w, status, v) }

// readBody reads a bounded request body.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, api.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			fail(w, api.ErrTooLarge, "request body over %d bytes", api.MaxBodyBytes)
		} else {
			fail(w, api.ErrBadInput, "read request body: %v", err)
		}
		return nil, false
	}
	return data, true
}

// decodeJSON reads a JSON body strictly (see decodeStrict); optional bodies may be empty.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any, optional ...bool) bool {
	data, ok := readBody(w, r)
	if !ok {
		return false
	}
	if err := decodeStrict(data, v, len(optional) > 0 && optional[0]); err != nil {
		fail(w, api.ErrBadInput, "bad request body: %v", err)
		return false
	}
	return true
}

func (a *API) getHealth(w http.ResponseWriter, _ *http.Request) {
	h := api.Health{ID: a.m.ID(), Leader: a.m.Leader(), Waiting: a.m.Waiting()}
	if h.Waiting != "" {
		reply(w, http.StatusServiceUnavailable, h)
		return
	}
	reply(w, http.StatusOK, h)
}

func (a *API) submitJob(w http.ResponseWriter, r *http.Request) {
	data, ok := readBody(w, r)
	if !ok {
		return
	}
	spec, err := cluster.ParseJobSpec(data)
	if err != nil {
		failErr(w, fmt.Errorf("%w: %w", api.ErrBadInput, err))
		return
	}
	noteObject(r, "job/"+spec.Name)
	noteTenant(r, spec.Tenant)
	if err := mayUse(principalOf(r.Context()), spec.Tenant); err != nil {
		failErr(w, err)
		return
	}
	if err := a.m.CheckSinkDir(spec); err != nil {
		failErr(w, err)
		return
	}
	if err := a.m.CheckSecrets(spec); err != nil {
		failErr(w, err)
		return
	}
	if err := a.m.CheckScaling(spec); err != nil {
		failErr(w, err)
		return
	}
	// The registry is asked before the store, outside its retries: a slow registry delays
	// this submit only.
	pin := a.m.PinImage(r.Context(), spec, 1)
	if err := a.m.CheckImageCommand(r.Context(), spec, pin); err != nil {
		failErr(w, err)
		return
	}
	rec, err := desired.SubmitJobAs(r.Context(), a.store, spec, pin, principalOf(r.Context()).String())
	if err != nil {
		failErr(w, err)
		return
	}
	a.log.Info("job submitted", "job", spec.Name, "tenant", spec.Tenant, "workers", spec.TotalWorkers())
	if pin != nil && pin.Ref != "" {
		a.log.Info("image pinned", "job", spec.Name, "generation", pin.Generation, "ref", pin.Ref)
	} else if pin != nil {
		a.log.Warn("image not pinned yet; workers pull the tag meanwhile", "job", spec.Name, "image", pin.Image, "err", pin.Error)
	}
	reply(w, http.StatusCreated, rec)
}

func (a *API) scaleJob(w http.ResponseWriter, r *http.Request) {
	var req api.ScaleRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	if !a.mayUseJob(w, r) {
		return
	}
	rec, err := desired.ScaleJobAs(r.Context(), a.store, r.PathValue("name"), req.Workers, principalOf(r.Context()).String())
	if err != nil {
		failErr(w, err)
		return
	}
	a.autoscaleEvent(r, rec)
	reply(w, http.StatusOK, rec)
}

func (a *API) killJob(w http.ResponseWriter, r *http.Request) {
	var req api.KillRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	if !a.mayUseJob(w, r) {
		return
	}
	rec, err := desired.KillJob(r.Context(), a.store, r.PathValue("name"), req.Grace.Std())
	if err != nil {
		failErr(w, err)
		return
	}
	reply(w, http.StatusOK, rec)
}

// mayUseJob answers 404 or 403 unless the caller may act on the job named in the path.
func (a *API) mayUseJob(w http.ResponseWriter, r *http.Request) bool {
	rec, _, err := desired.ReadJob(r.Context(), a.store, r.PathValue("name"))
	if err == nil {
		noteTenant(r, rec.Spec.Tenant)
		err = mayUse(principalOf(r.Context()), rec.Spec.Tenant)
	}
	if err != nil {
		failErr(w, err)
		return false
	}
	return true
}

func (a *API) listJobs(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r.Context())
	st := a.m.Snapshot()
	jobs, gen := a.m.CurrentJobsGen()
	body := st.List(p.String(), gen, func() []byte {
		out := []api.JobSummary{}
		for _, name := range slices.Sorted(maps.Keys(jobs)) {
			if mayUse(p, jobs[name].Record().Spec.Tenant) == nil {
				out = append(out, st.Summary(jobs[name]))
			}
		}
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
		return b.Bytes()
	})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// getJob answers a job's status; with ?workers=false only its record and summary, which is
// what `--wait` polls: the same cost for a job of one worker and of a hundred thousand.
func (a *API) getJob(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	withWorkers := true
	switch q := r.URL.Query().Get("workers"); q {
	case "", "true":
	case "false":
		withWorkers = false
	default:
		fail(w, api.ErrBadInput, "workers=%q: want true or false", q)
		return
	}
	j, ok := a.m.CurrentJobs()[name]
	if !ok {
		fail(w, api.ErrNotFound, "no job %q (see `stormdock job list`)", name)
		return
	}
	rec := j.Record()
	if err := mayUse(principalOf(r.Context()), rec.Spec.Tenant); err != nil {
		failErr(w, err)
		return
	}
	st := a.m.Snapshot()
	assigned := st.Assigned(name)
	v, unplaced := st.View(), st.Unplaced()
	out := api.JobStatus{Job: rec, Summary: st.Summary(j), Workers: []api.WorkerView{}}
	if withWorkers {
		for _, k := range rec.Spec.Keys() {
			wv := api.WorkerView{Job: k.Job, Link: k.Link, Worker: k.Worker, State: api.WorkerPending}
			if reason, ok := unplaced[k]; ok {
				wv.State, wv.Reason = api.WorkerUnplaced, reason
			} else if node, ok := assigned[k]; ok {
				wv.Node = node
				if rec, ok := v.Nodes()[node]; ok {
					wv.DC, wv.Rack = rec.Node.DC, rec.Node.Rack
				}
			}
			if node, s, ok := v.Status(k); ok && (wv.Node == "" || node == wv.Node) {
				wv.State, wv.PID, wv.Restarts, wv.LastExit, wv.Memory = s.State, s.PID, s.Restarts, s.LastExit, s.Memory
				wv.Generation, wv.ExitReason, wv.Lapses = s.Generation, s.ExitReason, s.Lapses
				if wv.Node == "" {
					wv.Node = node
				}
			}
			out.Workers = append(out.Workers, wv)
		}
	}
	if rec.Spec.Mirrored() {
		out.Sink = a.m.SinkView(r.Context(), v, rec.Spec.Name)
	}
	now := time.Now()
	for _, id := range slices.Sorted(maps.Keys(v.Confs())) {
		c := v.Confs()[id]
		if !c.Avoiding(rec.Spec.Name, now) {
			continue
		}
		na := api.NodeAvoidance{Node: id}
		if av, ok := c.Avoidance(rec.Spec.Name); ok {
			na.Since, na.Until, na.Strikes = av.Since, av.Until, av.Strikes
		}
		out.Avoided = append(out.Avoided, na)
	}
	out.Why = unplacedWhy(st, rec.Spec, unplaced)
	reply(w, http.StatusOK, out)
}

// unplacedWhy groups a job's unplaced workers by link and reason, with the placement
// engine's explanation of each group.
func unplacedWhy(st *master.Snapshot, spec cluster.JobSpec, unplaced map[cluster.WorkerKey]string) []api.UnplacedWhy {
	var out []api.UnplacedWhy
	at := map[[2]string]int{}
	for _, k := range spec.Keys() { // in link, then worker order
		reason, ok := unplaced[k]
		if !ok {
			continue
		}
		i, ok := at[[2]string{k.Link, reason}]
		if !ok {
			i = len(out)
			at[[2]string{k.Link, reason}] = i
			u := api.UnplacedWhy{Link: k.Link, Reason: reason}
			if e := st.Why(k); e != nil {
				u.Fit, u.Total = e.Fit, e.Total
				for _, r := range e.Rejected {
					u.Rejected = append(u.Rejected, api.Rejection{Check: r.Check, Text: r.Text, Nodes: r.Nodes, Failing: r.Failing})
				}
			}
			out = append(out, u)
		}
		out[i].Workers = append(out[i].Workers, k.Worker)
	}
	return out
}

func (a *API) listNodes(w http.ResponseWriter, _ *http.Request) {
	st := a.m.Snapshot()
	v := st.View()
	perNode := st.PerNode()
	out := []api.NodeView{}
	for _, id := range slices.Sorted(maps.Keys(v.Nodes())) {
		rec := v.Nodes()[id]
		n := rec.Node
		used := perNode[id]
		health := rec.Health.State
		if health == "" {
			health = cluster.HealthHealthy
		}
		nv := api.NodeView{ID: id, Host: n.Host, DC: n.DC, Rack: n.Rack, Slots: n.Slots, SlotsUsed: used,
			SlotsThrottled: rec.Health.Throttled, SlotsFree: max(n.Slots-used-rec.Health.Throttled, 0),
			Memory: n.Memory, CPU: n.CPU, Health: health, Reason: rec.Health.Reason, Labels: n.Labels,
			Workers: len(rec.Workers), Isolation: rec.Isolation, Started: rec.Started,
			SessionTimeout: rec.SessionTimeout, SessionRequested: rec.SessionRequested}
		if c, ok := v.Confs()[id]; ok {
			nv.Draining = c.Draining
			now := time.Now()
			for _, job := range c.Avoid {
				if c.Avoiding(job, now) {
					nv.Avoid = append(nv.Avoid, job)
					if a, ok := c.Avoidance(job); ok {
						nv.Avoided = append(nv.Avoided, a)
					}
				}
			}
		}
		if nv.Draining {
			nv.SlotsFree = 0
		}
		out = append(out, nv)
	}
	reply(w, http.StatusOK, out)
}

func (a *API) drainNode(drain bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		var req api.UndrainRequest
		if !drain && !decodeJSON(w, r, &req, true) {
			return
		}
		if req.Job != "" {
			if err := cluster.CheckName(req.Job); err != nil {
				fail(w, api.ErrBadInput, "job: %v", err)
				return
			}
		}
		if !a.m.NodeRegistered(id) {
			if !a.m.NodeConfigured(id) || drain {
				fail(w, api.ErrNotFound, "no live node %q (see `stormdock node list`)", id)
				return
			}
		}
		if req.Job != "" {
			c := a.m.Snapshot().View().Confs()[id]
			if _, ok := c.Avoidance(req.Job); !ok && !slices.Contains(c.Avoid, req.Job) {
				fail(w, api.ErrNotFound, "node %s does not avoid job %s (see `stormdock node list`)", id, req.Job)
				return
			}
		}
		if err := desired.UpdateNodeConf(r.Context(), a.store, id, func(c *cluster.NodeConf) {
			switch {
			case req.Job != "":
				// One job's avoidance ends: the operator vouches for the node for that job.
				c.Avoid = slices.DeleteFunc(slices.Clone(c.Avoid), func(j string) bool { return j == req.Job })
				c.Avoided = slices.DeleteFunc(slices.Clone(c.Avoided), func(e cluster.Avoidance) bool { return e.Job == req.Job })
			case !drain:
				// An operator who undrains a node vouches for it again: its avoidances
				// end, and their strikes are forgotten.
				c.Draining, c.Avoid, c.Avoided = false, nil, nil
			default:
				c.Draining = true
			}
		}); err != nil {
			failErr(w, err)
			return
		}
		out := map[string]any{"node": id, "draining": drain, "at": time.Now().UTC()}
		if req.Job != "" {
			out = map[string]any{"node": id, "job": req.Job, "avoided": false, "at": time.Now().UTC()}
		}
		reply(w, http.StatusOK, out)
	}
}

func (a *API) listTenants(w http.ResponseWriter, r *http.Request) {
	names, err := a.store.Children(r.Context(), cluster.TenantsKey)
	if err != nil {
		failErr(w, err)
		return
	}
	jobs := a.m.CurrentJobs()
	p := principalOf(r.Context())
	out := []api.TenantView{}
	for _, name := range names {
		if !p.admin && p.tenant != name {
			continue
		}
		t, _, err := desired.ReadTenant(r.Context(), a.store, name)
		if err != nil {
			continue
		}
		tv := master.TenantView(jobs, t.Tenant)
		// Whether it has registry credentials, and for which hosts: never what they are.
		if hosts, ok, err := desired.TenantRegistryHosts(r.Context(), a.store, name); err == nil && ok {
			tv.RegistryAuth, tv.RegistryHosts = true, hosts
		}
		out = append(out, tv)
	}
	reply(w, http.StatusOK, out)
}

// setRegistryAuth stores a tenant's registry credentials: the body is Docker's config.json.
// The admin may set any tenant's, a tenant's token only its own. Neither the answer, nor an
// error, nor the audit line carries a value of the body.
func (a *API) setRegistryAuth(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := mayUse(principalOf(r.Context()), name); err != nil {
		failErr(w, fmt.Errorf("%w: the token of tenant %s cannot set tenant %s's registry credentials", api.ErrForbidden, principalOf(r.Context()).tenant, name))
		return
	}
	data, ok := readBody(w, r)
	if !ok {
		return
	}
	ring, err := a.m.Keyring()
	if err != nil {
		failErr(w, fmt.Errorf("%w: the masters' keyring: %v", api.ErrInternal, err))
		return
	}
	hosts, err := desired.SetTenantRegistryAuth(r.Context(), a.store, ring, name, data)
	if err != nil {
		failErr(w, err)
		return
	}
	a.log.Info("tenant registry credentials set", "tenant", name, "hosts", hosts)
	reply(w, http.StatusOK, api.RegistryAuthReply{Tenant: name, Hosts: hosts})
}

func (a *API) clearRegistryAuth(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := mayUse(principalOf(r.Context()), name); err != nil {
		failErr(w, fmt.Errorf("%w: the token of tenant %s cannot clear tenant %s's registry credentials", api.ErrForbidden, principalOf(r.Context()).tenant, name))
		return
	}
	if err := desired.ClearTenantRegistryAuth(r.Context(), a.store, name); err != nil {
		failErr(w, err)
		return
	}
	a.log.Info("tenant registry credentials cleared", "tenant", name)
	reply(w, http.StatusOK, api.RegistryAuthReply{Tenant: name, Hosts: []string{}})
}

func (a *API) sharedImages(w http.ResponseWriter, r *http.Request) {
	ps, err := desired.SharedImages(r.Context(), a.store)
	if err != nil {
		failErr(w, err)
		return
	}
	reply(w, http.StatusOK, api.SharedImages{Prefixes: ps})
}

// shareImages adds or removes a shared repository prefix: images under it are fetched with
// the nodes' and masters' own registry credentials, for every tenant.
func (a *API) shareImages(share bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req api.SharePrefix
		if !decodeJSON(w, r, &req) {
			return
		}
		noteObject(r, "image/"+req.Prefix)
		ps, err := desired.ShareImages(r.Context(), a.store, req.Prefix, share)
		if err != nil {
			failErr(w, err)
			return
		}
		a.log.Info("shared images changed", "prefix", req.Prefix, "shared", share)
		reply(w, http.StatusOK, api.SharedImages{Prefixes: ps})
	}
}

func (a *API) createTenant(w http.ResponseWriter, r *http.Request) {
	var t cluster.Tenant
	if !decodeJSON(w, r, &t) {
		return
	}
	noteObject(r, "tenant/"+t.Name)
	t, err := desired.CreateTenantIn(r.Context(), a.store, cluster.TenantRecord{Tenant: t}, a.m.TenantUIDs())
	if err != nil {
		failErr(w, err)
		return
	}
	reply(w, http.StatusCreated, t)
}

// updateTenant changes what the admin sets on a tenant: its caps, the priority cap among
// them (admin only: a tenant cannot raise its own).
func (a *API) updateTenant(w http.ResponseWriter, r *http.Request) {
	var c api.TenantChange
	if !decodeJSON(w, r, &c) {
		return
	}
	name := r.PathValue("name")
	noteObject(r, "tenant/"+name)
	t, err := desired.UpdateTenant(r.Context(), a.store, name, c)
	if err != nil {
		failErr(w, err)
		return
	}
	reply(w, http.StatusOK, t)
}

func (a *API) tenantToken(w http.ResponseWriter, r *http.Request) {
	token, err := desired.SetTenantToken(r.Context(), a.store, r.PathValue("name"))
	if err != nil {
		failErr(w, err)
		return
	}
	reply(w, http.StatusOK, api.TokenReply{Tenant: r.PathValue("name"), Token: token})
}

func (a *API) listDCs(w http.ResponseWriter, _ *http.Request) {
	st := a.m.Snapshot()
	v := st.View()
	perNode := st.PerNode()
	out := []api.DCView{}
	for _, name := range slices.Sorted(maps.Keys(v.DCs())) {
		d := api.DCView{Name: name, State: v.DCState(name), Since: v.DCs()[name].Since}
		for id, rec := range v.Nodes() {
			if rec.Node.DC != name {
				continue
			}
			d.Nodes++
			d.Slots += rec.Node.Slots
			d.Workers += perNode[id]
			d.SlotsFree += max(rec.Node.Slots-perNode[id]-rec.Health.Throttled, 0)
		}
		out = append(out, d)
	}
	reply(w, http.StatusOK, out)
}

func (a *API) setDC(state string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req api.DCRequest
		if !decodeJSON(w, r, &req, true) {
			return
		}
		if req.Rebalance && state != cluster.DCActive {
			fail(w, api.ErrBadInput, "--rebalance goes with restore only")
			return
		}
		rec, err := desired.SetDCState(r.Context(), a.store, r.PathValue("dc"), state, req.Rebalance)
		if err != nil {
			failErr(w, err)
			return
		}
		reply(w, http.StatusOK, rec)
	}
}
