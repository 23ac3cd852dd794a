package httpapi

import (
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/master"
)

// Workers' logs reach the CLI through the master: GET /v1/jobs/{name}/logs finds the node
// that runs the worker and relays its agent's answer (GET /v1/logs there), signed with the
// cluster's agent key (api.SignAgentRequest). Through the master, because the CLI already
// has its URL, token and CA; the tenant check stays in one place; nodes often sit on
// networks the operator's machine does not reach; and agents need no credential of users.
// The cost: the log's bytes pass through the master, and a follower holds a connection to
// it and one from it to the agent (stormdock_master_log_streams counts them).

// jobLogs relays a worker's log from its agent.
func (a *API) jobLogs(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	st := a.m.Snapshot()
	v := st.View()
	j, ok := a.m.CurrentJobs()[name]
	if !ok {
		fail(w, api.ErrNotFound, "no job %q (see `stormdock job list`)", name)
		return
	}
	if err := mayUse(principalOf(r.Context()), j.Record().Spec.Tenant); err != nil {
		failErr(w, err)
		return
	}
	req, err := api.ParseLogRequest(r.URL.Query())
	if err != nil {
		failErr(w, err)
		return
	}
	if req.Link != "" {
		if err := cluster.CheckName(req.Link); err != nil {
			fail(w, api.ErrBadInput, "link: %v", err)
			return
		}
	}
	spec := j.Record().Spec
	if req.Router {
		if !spec.Mirrored() {
			fail(w, api.ErrBadInput, "job %s is not mirrored: it has no output routers", name)
			return
		}
		rr := v.Routers()[master.RouterJobName(name)]
		switch {
		case req.Worker == api.LeadingRouter:
			lead, err := a.m.LeadingRouter(r.Context(), v, name)
			if err != nil {
				failErr(w, err)
				return
			}
			req.Worker = lead
		case req.Worker >= rr.Spec.Workers:
			fail(w, api.ErrBadInput, "job %s has routers 0 to %d, not %d", name, rr.Spec.Workers-1, req.Worker)
			return
		}
		name, spec = master.RouterJobName(name), rr.Spec
		req.Router = false
	}
	k := cluster.WorkerKey{Job: name, Link: req.Link, Worker: req.Worker}
	switch {
	case spec.Mirrored() && req.Link == "":
		fail(w, api.ErrBadInput, "job %s is mirrored: name the link with --link (one of %v)", name, spec.Links)
		return
	case req.Link != "" && !slices.Contains(spec.Links, req.Link):
		fail(w, api.ErrBadInput, "job %s has no link %q (its links: %v)", name, req.Link, spec.Links)
		return
	case req.Worker >= spec.Workers:
		fail(w, api.ErrBadInput, "job %s has workers 0 to %d, not %d", name, spec.Workers-1, req.Worker)
		return
	}
	node := st.Assigned(k.Job)[k]
	if at, _, ok := v.Status(k); ok && (node == "" || at != node && v.Nodes()[node].Node.ID == "") {
		node = at
	}
	rec, alive := v.Nodes()[node]
	switch {
	case node == "":
		fail(w, api.ErrNotFound, "worker %s runs on no node (see `stormdock job status %s`)", k, name)
		return
	case !alive:
		fail(w, api.ErrNotFound, "worker %s was on node %s, which is lost: its log is on that machine", k, node)
		return
	case rec.Logs == nil:
		fail(w, api.ErrNotFound, "the agent of node %s serves no logs (it runs without --logs-listen, or predates it)", node)
		return
	}
	key, err := a.logKey.Key(r.Context())
	if err != nil {
		fail(w, api.ErrUnavailable, "%v", err)
		return
	}
	host := rec.Node.Addr
	if host == "" {
		// Guessing would reach the master's own host, not the node's.
		fail(w, api.ErrNotFound, "node %s advertises no address its logs can be read at: restart its agent with --advertise-addr (agents set one by default)", node)
		return
	}
	scheme := "http"
	if rec.Logs.TLS {
		scheme = "https"
	}
	q := req.Query()
	q.Set("job", k.Job)
	uri := "/v1/logs?" + q.Encode()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go func() {
		select {
		case <-a.m.Stopped():
			cancel()
		case <-ctx.Done():
		}
	}()
	areq, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+net.JoinHostPort(host, strconv.Itoa(rec.Logs.Port))+uri, nil)
	if err != nil {
		failErr(w, err)
		return
	}
	areq.Header.Set("Authorization", "Bearer "+api.SignAgentRequest(key, http.MethodGet, uri, time.Now(), api.AgentTokenTTL))
	resp, err := (&http.Client{Transport: a.logKey.Transport(host, rec.Logs)}).Do(areq)
	if err != nil {
		fail(w, api.ErrUnavailable, "cannot reach the agent of node %s at %s: %v", node, areq.URL.Host, err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// The agent's error body is an api.ErrorBody: pass it on as it is.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, io.LimitReader(resp.Body, 64<<10))
		return
	}
	a.metrics.logStreams.Inc()
	defer a.metrics.logStreams.Dec()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Stormdock-Node", node)
	w.WriteHeader(http.StatusOK)
	relay(w, resp.Body)
}

// relay copies a stream to w as it comes, flushing every piece.
func relay(w http.ResponseWriter, body io.Reader) {
	sw := api.NewStreamWriter(w)
	defer sw.Stop()
	buf := make([]byte, 32<<10)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if sw.Write(buf[:n]) != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
