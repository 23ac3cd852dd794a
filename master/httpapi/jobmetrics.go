package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/master/jobmetrics"
)

// The jobs' metrics, from this master's own history (package master/jobmetrics): every
// master collects them, so any answers.
//
//	GET /v1/jobs/{name}/metrics[?series=S[,S...]&since=30m|RFC3339&detail=true]  a job's series (tenant-scoped)
//	GET /v1/jobs/{name}/metrics/workers                          each worker's latest values, from its agent
//	GET /v1/metrics/latest                                       every job's latest values (`job top`)
//	GET /v1/metrics/jobs                                         Prometheus federation (scrape token)

// maxSeriesAsked bounds the series one query names.
const maxSeriesAsked = 64

// parseSince reads since: a duration back from now ("30m") or a time (RFC 3339).
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return time.Time{}, fmt.Errorf("since=%q: want a duration back from now, more than 0 (like 30m)", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("since=%q: want a duration (30m) or a time (2006-01-02T15:04:05Z)", clipPath(s))
	}
	return t, nil
}

func (a *API) jobMetrics(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
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
	q := r.URL.Query()
	since, err := parseSince(q.Get("since"), time.Now())
	if err != nil {
		fail(w, api.ErrBadInput, "%v", err)
		return
	}
	var asked []string
	for _, v := range q["series"] {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				asked = append(asked, s)
			}
		}
	}
	if len(asked) > maxSeriesAsked {
		fail(w, api.ErrBadInput, "%d series asked for: at most %d at once", len(asked), maxSeriesAsked)
		return
	}
	detail := false
	switch q.Get("detail") {
	case "", "false":
	case "true":
		detail = true
	default:
		fail(w, api.ErrBadInput, "detail=%q: want true or false", clipPath(q.Get("detail")))
		return
	}
	h := a.m.JobMetrics().History()
	out, ok := h.Job(name, jobmetrics.Query{Series: asked, Since: since, Detail: detail})
	if !ok || out.Tenant != rec.Spec.Tenant {
		// Not collected yet (a job submitted within the last interval, or a master that
		// just started): an empty answer, not an error.
		out = api.JobMetrics{Job: name, Tenant: rec.Spec.Tenant, Step: h.Step().Seconds(), Workers: rec.Spec.TotalWorkers(), Series: []api.SeriesHistory{}}
	}
	if len(asked) > 0 {
		all, _ := h.Job(name, jobmetrics.Query{})
		for _, s := range asked {
			if !slices.ContainsFunc(all.Series, func(sh api.SeriesHistory) bool { return sh.Name == s || sh.ID() == s }) {
				var have []string
				for _, sh := range all.Series {
					if !slices.Contains(have, sh.Name) {
						have = append(have, sh.Name)
					}
				}
				fail(w, api.ErrNotFound, "job %s has no series %q (it has: %s)", name, clipPath(s), strings.Join(have, ", "))
				return
			}
		}
	}
	reply(w, http.StatusOK, out)
}

// jobWorkerMetrics fetches each worker's latest values from the agents that run the job.
func (a *API) jobWorkerMetrics(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	j, ok := a.m.CurrentJobs()[name]
	if !ok {
		fail(w, api.ErrNotFound, "no job %q (see `stormdock job list`)", name)
		return
	}
	if err := mayUse(principalOf(r.Context()), j.Record().Spec.Tenant); err != nil {
		failErr(w, err)
		return
	}
	v := a.m.Snapshot().View()
	var nodes []cluster.NodeRecord
	for _, rec := range v.Nodes() {
		if slices.ContainsFunc(rec.Workers, func(ws cluster.WorkerStatus) bool { return ws.Key.Job == name }) {
			nodes = append(nodes, rec)
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	var mu sync.Mutex
	out := []api.WorkerMetrics{}
	var problems []string
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, rec := range nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ws, err := a.fetchWorkers(ctx, rec, name)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				problems = append(problems, fmt.Sprintf("node %s: %v", rec.Node.ID, err))
				return
			}
			for _, wm := range ws {
				if wm.Job == name && wm.Node == rec.Node.ID {
					out = append(out, wm)
				}
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(out, func(x, y api.WorkerMetrics) int {
		return cluster.WorkerKey{Job: x.Job, Link: x.Link, Worker: x.Worker}.Compare(cluster.WorkerKey{Job: y.Job, Link: y.Link, Worker: y.Worker})
	})
	slices.Sort(problems)
	reply(w, http.StatusOK, api.JobWorkerMetrics{Job: name, Workers: out, Problems: problems})
}

func (a *API) fetchWorkers(ctx context.Context, rec cluster.NodeRecord, job string) ([]api.WorkerMetrics, error) {
	resp, err := a.m.Agents().Get(ctx, rec, "/v1/metrics/workers?node="+url.QueryEscape(rec.Node.ID)+"&job="+url.QueryEscape(job))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("answered %s: %s", resp.Status, strings.TrimSpace(string(body[:min(len(body), 300)])))
	}
	var ws []api.WorkerMetrics
	if err := json.Unmarshal(body, &ws); err != nil {
		return nil, fmt.Errorf("unreadable answer: %w", err)
	}
	return ws, nil
}

// latestMetrics is every job's latest values the caller may see.
func (a *API) latestMetrics(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r.Context())
	reply(w, http.StatusOK, a.m.JobMetrics().History().LatestJobs(func(tenant string) bool { return mayUse(p, tenant) == nil }))
}

// federate serves the job-level series to Prometheus (the scrape token or the admin's).
func (a *API) federate(w http.ResponseWriter, r *http.Request) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(a.m.JobMetrics().History().Federation(func(string) bool { return true })); err != nil {
		fail(w, api.ErrInternal, "federation: %v", err)
		return
	}
	// A series of one name with other labels in another job (workers' choice) cannot be in
	// one family: what can be is served, the rest is left out.
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}).ServeHTTP(w, r)
}

// autoscaleJob pauses or resumes a job's scaling policy.
func (a *API) autoscaleJob(w http.ResponseWriter, r *http.Request) {
	var req api.AutoscaleRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	if !a.mayUseJob(w, r) {
		return
	}
	if req.Pause == req.Resume {
		fail(w, api.ErrBadInput, "give exactly one of pause and resume")
		return
	}
	rec, err := desired.SetAutoscale(r.Context(), a.store, r.PathValue("name"), req.Pause, principalOf(r.Context()).String())
	if err != nil {
		failErr(w, err)
		return
	}
	a.autoscaleEvent(r, rec)
	reply(w, http.StatusOK, rec)
}

// autoscaleEvent records a pause (by a manual scale, or asked for) or a resume of a job's
// policy.
func (a *API) autoscaleEvent(r *http.Request, rec cluster.JobRecord) {
	if rec.Spec.Scaling == nil || rec.Autoscale == nil {
		return
	}
	ev := api.Event{Object: "job/" + rec.Spec.Name, Job: rec.Spec.Name, Tenant: rec.Spec.Tenant, Principal: principalOf(r.Context()).String()}
	if rec.Autoscale.Paused {
		ev.Kind = api.EventJobAutoscalePaused
		ev.Reason = fmt.Sprintf("the scaling policy decides nothing at %d workers until `stormdock job autoscale %s --resume`", rec.Spec.Workers, rec.Spec.Name)
	} else {
		ev.Kind = api.EventJobAutoscaleResumed
		ev.Reason = fmt.Sprintf("the scaling policy decides again from %d workers: %s", rec.Spec.Workers, rec.Spec.Scaling)
	}
	a.m.Emit(ev)
}
