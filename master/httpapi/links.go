package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/multidc"
)

// routerTimeout bounds a call to a job's router made on behalf of an API request.
const routerTimeout = 3 * time.Second

// mirroredJob finds the mirrored job named in the path in the mirror, as the caller may see
// it; it answers the request itself and returns false when it cannot.
func (a *API) mirroredJob(w http.ResponseWriter, r *http.Request) (cluster.JobRecord, bool) {
	name := r.PathValue("name")
	j, ok := a.m.CurrentJobs()[name]
	rec := j.Record()
	if !ok {
		fail(w, api.ErrNotFound, "no job %q (see `stormdock job list`)", name)
		return rec, false
	}
	if err := mayUse(principalOf(r.Context()), rec.Spec.Tenant); err != nil {
		failErr(w, err)
		return rec, false
	}
	if !rec.Spec.Mirrored() {
		fail(w, api.ErrBadInput, "job %s is not mirrored: it has no links (a job with `links:` has)", name)
		return rec, false
	}
	return rec, true
}

// getLinks answers GET /v1/jobs/{name}/links: the router's live status, or, when the router
// does not answer, the status it last wrote to the store.
func (a *API) getLinks(w http.ResponseWriter, r *http.Request) {
	rec, ok := a.mirroredJob(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), routerTimeout)
	defer cancel()
	url := a.leadingRouter(ctx, rec.Spec.Name)
	cl, err := a.routerClient(ctx, url)
	var st multidc.Status
	if err == nil {
		st, err = cl.Status(ctx)
	}
	if err == nil && st.Job != rec.Spec.Name {
		err = fmt.Errorf("the router at %s serves job %q", url, st.Job)
	}
	out := api.Links{Job: rec.Spec.Name, Router: url, Source: "router"}
	if err != nil {
		saved, found, rerr := multidc.ReadRecord(ctx, a.store, rec.Spec.Name)
		if rerr != nil || !found {
			fail(w, api.ErrUnavailable, "the router of job %s does not answer at %s (%v) and has left no status in the store; it may still be starting (see `stormdock job status %s.router`)",
				rec.Spec.Name, url, err, rec.Spec.Name)
			return
		}
		st, out.Source, out.Error = saved.Status, "store", err.Error()
	}
	reply(w, http.StatusOK, linksOf(out, st))
}

// failover answers POST /v1/jobs/{name}/failover: the job's router makes another link
// active, as `stormdock link failover` asks it.
func (a *API) failover(w http.ResponseWriter, r *http.Request) {
	var req api.FailoverRequest
	if r.ContentLength != 0 && !decodeJSON(w, r, &req) {
		return
	}
	rec, ok := a.mirroredJob(w, r)
	if !ok {
		return
	}
	if req.To != "" && !slices.Contains(rec.Spec.Links, req.To) {
		fail(w, api.ErrBadInput, "job %s has no link %q; its links are %v", rec.Spec.Name, req.To, rec.Spec.Links)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), routerTimeout)
	defer cancel()
	url := a.leadingRouter(ctx, rec.Spec.Name)
	cl, err := a.routerClient(ctx, url)
	if err != nil {
		fail(w, api.ErrUnavailable, "job %s has no router running yet: %v", rec.Spec.Name, err)
		return
	}
	// A failover is the job's to ask for: the router wants its sender token.
	key, err := multidc.EnsureOutputKey(ctx, a.store)
	if err != nil {
		failErr(w, fmt.Errorf("%w: %v", api.ErrUnavailable, err))
		return
	}
	cl.Token = multidc.SenderToken(key, rec.Spec.Name, rec.Submitted)
	st, err := cl.Failover(ctx, rec.Spec.Name, req.To)
	if err != nil {
		var ae *multidc.APIError
		switch {
		case errors.As(err, &ae) && ae.Code >= 400 && ae.Code < 500:
			fail(w, api.ErrBadInput, "router of job %s: %s", rec.Spec.Name, ae.Msg)
		default:
			fail(w, api.ErrUnavailable, "router of job %s at %s: %v", rec.Spec.Name, url, err)
		}
		return
	}
	a.log.Info("link failover", "job", rec.Spec.Name, "active", st.Active, "from", st.NextOffset)
	reply(w, http.StatusOK, linksOf(api.Links{Job: rec.Spec.Name, Router: url, Source: "router"}, st))
}

// leadingRouter is where a mirrored job's leading router serves: as its record in the store
// says, or, before any router has led, the first of the job's routers that runs.
func (a *API) leadingRouter(ctx context.Context, job string) string {
	if rec, ok, err := multidc.ReadRecord(ctx, a.store, job); err == nil && ok && rec.Router != "" {
		return rec.Router
	}
	if urls := a.m.Snapshot().View().RouterURLs(job); len(urls) > 0 {
		return urls[0]
	}
	return ""
}

func linksOf(out api.Links, st multidc.Status) api.Links {
	out.Active, out.Delivered, out.Checkpoint, out.Failovers, out.Updated = st.Active, st.Delivered, st.Checkpoint, st.Failovers, st.Updated
	if f := st.LastFailover; f != nil {
		out.LastFailover = &api.LinkFailover{From: f.From, To: f.To, Reason: f.Reason, At: f.At, NextOffset: f.NextOffset}
	}
	out.Links = make([]api.LinkView, 0, len(st.Links))
	for _, l := range st.Links {
		out.Links = append(out.Links, api.LinkView{Link: l.Link, Active: l.Active, Alive: l.Alive, Workers: l.Workers,
			WorkersAlive: l.WorkersAlive, LastProduced: l.LastProduced, LastDelivered: l.LastDelivered, Lag: l.Lag,
			HeartbeatAgeMs: l.HeartbeatAgeMs})
	}
	return out
}

// routerClient is a client of the router at url that trusts the router CA alone: the
// failover carries the job's sender token.
func (a *API) routerClient(ctx context.Context, url string) (*multidc.Client, error) {
	cl, err := multidc.NewClient(url)
	if err != nil {
		return nil, err
	}
	ca, err := multidc.EnsureRouterCA(ctx, a.store)
	if err != nil {
		return nil, err
	}
	pool, err := ca.Pool()
	if err != nil {
		return nil, err
	}
	cl.TrustRouterCA(pool)
	return cl, nil
}
