package httpapi

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// Workers' logs reach the CLI through the master: GET /v1/jobs/{name}/logs finds the node
// that runs the worker and relays its agent's answer (GET /v1/logs there), signed with the
// cluster's agent key (api.SignAgentRequest). Through the master, because the CLI already
// has its URL, token and CA; the tenant check stays in one place; nodes often sit on
// networks the operator's machine does not reach; and agents need no credential of users.
// The cost: the log's bytes pass through the master, and a follower holds a connection to
// it and one from it to the agent (stormdock_master_log_streams counts them).

// logKeyCache reads the agent key, making it at the first use.
type logKeyCache struct {
	store coord.KV

	mu  sync.Mutex
	key []byte
	tr  map[string]*http.Transport // by node address and certificate
}

func (c *logKeyCache) get(ctx context.Context) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.key != nil {
		return c.key, nil
	}
	for range 3 {
		e, err := c.store.Get(ctx, cluster.AgentKeyKey)
		if err == nil {
			key, err := hex.DecodeString(string(e.Value))
			if err != nil || len(key) < 16 {
				return nil, fmt.Errorf("the agent key at %s is not readable", cluster.AgentKeyKey)
			}
			c.key = key
			return key, nil
		}
		if !errors.Is(err, coord.ErrNotFound) {
			return nil, fmt.Errorf("read the agent key: %w", err)
		}
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		if _, err := c.store.Create(ctx, cluster.AgentKeyKey, []byte(hex.EncodeToString(key)), coord.Persistent); err == nil {
			c.key = key
			return key, nil
		} else if !errors.Is(err, coord.ErrExists) {
			return nil, fmt.Errorf("store the agent key: %w", err)
		}
	}
	return nil, errors.New("the agent key keeps changing")
}

// transport is the HTTP transport to one agent: for TLS, it trusts the certificate the
// node record names, and no other.
func (c *logKeyCache) transport(addr string, ep *cluster.LogsEndpoint) *http.Transport {
	id := addr + "|" + ep.CertSHA256
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.tr[id]; ok {
		return t
	}
	if c.tr == nil || len(c.tr) > 1000 {
		c.tr = map[string]*http.Transport{} // nodes come and go: start over now and then
	}
	t := &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		TLSHandshakeTimeout: 5 * time.Second, ResponseHeaderTimeout: 10 * time.Second, MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute}
	if ep.TLS {
		want := ep.CertSHA256
		t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12,
			// The name check is replaced by the pin below: the certificate is the agent's own.
			InsecureSkipVerify: true, //nolint:gosec // verified by VerifyConnection
			VerifyConnection: func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) == 0 {
					return errors.New("the agent sent no certificate")
				}
				sum := sha256.Sum256(cs.PeerCertificates[0].Raw)
				if got := hex.EncodeToString(sum[:]); got != want {
					return x509.UnknownAuthorityError{Cert: cs.PeerCertificates[0]}
				}
				return nil
			}}
	}
	c.tr[id] = t
	return t
}

// jobLogs relays a worker's log from its agent.
func (a *API) jobLogs(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	st := a.m.Snapshot()
	v := st.View()
	assigned, _ := st.Where()
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
	k := cluster.WorkerKey{Job: name, Link: req.Link, Worker: req.Worker}
	switch {
	case req.Router && !spec.Mirrored():
		fail(w, api.ErrBadInput, "job %s is not mirrored: it has no output routers", name)
		return
	case req.Router:
		// The routers run as a job of their own (JOB.router), one worker per router.
		rr, ok := v.Router(name)
		if !ok || req.Worker >= rr.Spec.Workers {
			fail(w, api.ErrBadInput, "job %s has routers 0 to %d, not %d", name, max(rr.Spec.Workers, 1)-1, req.Worker)
			return
		}
		k.Job = rr.Spec.Name
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
	node := assigned[k]
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
	key, err := a.logKey.get(r.Context())
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
	req.Router = false // the agent knows the routers by their job's name
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
	resp, err := (&http.Client{Transport: a.logKey.transport(host, rec.Logs)}).Do(areq)
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
