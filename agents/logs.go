package agents

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/isolation"
)

// An agent serves its workers' logs to the masters, which relay them to the CLI (see
// master/logs.go): GET /v1/logs?job=J&worker=N[&link=L][&follow=true][&tail=N]
// [&previous=true], signed by a master with the cluster's agent key
// (api.VerifyAgentRequest). The agent answers with the worker's output as plain text,
// streamed while it follows.

// agentKey reads the key masters sign with from the store, again when a signature does
// not check out (a key made after the last read), at most every keyRetry.
type agentKey struct {
	a *Agent

	mu   sync.Mutex
	key  []byte
	read time.Time
}

const keyRetry = time.Second

func (k *agentKey) get(ctx context.Context, again bool) ([]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.key != nil && (!again || time.Since(k.read) < keyRetry) {
		return k.key, nil
	}
	e, err := k.a.store.Get(ctx, cluster.AgentKeyKey)
	if err != nil {
		return k.key, fmt.Errorf("read the agent key: %w", err)
	}
	key, err := hex.DecodeString(string(e.Value))
	if err != nil || len(key) < 16 {
		return k.key, fmt.Errorf("the agent key at %s is not readable", cluster.AgentKeyKey)
	}
	k.key, k.read = key, time.Now()
	return key, nil
}

// LogsHandler serves the workers' logs (see above) and the job metrics (jobmetrics.go) to
// the masters. Serve it with api.NewServer.
func (a *Agent) LogsHandler() http.Handler {
	keys := &agentKey{a: a}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/logs", func(w http.ResponseWriter, r *http.Request) {
		if a.signed(keys, w, r) {
			a.serveLogs(w, r)
		}
	})
	a.metricsRoutes(mux, keys)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		api.Errorf(w, api.ErrNotFound, "no such path on an agent: "+r.Method+" "+r.URL.Path)
	})
	return mux
}

// signed answers 401 unless a master signed the request with the agent key.
func (a *Agent) signed(keys *agentKey, w http.ResponseWriter, r *http.Request) bool {
	token, _ := cutBearer(r.Header.Get("Authorization"))
	key, err := keys.get(r.Context(), false)
	if err == nil {
		err = api.VerifyAgentRequest(key, r.Method, r.URL.RequestURI(), token, time.Now())
		if err != nil {
			if key, kerr := keys.get(r.Context(), true); kerr == nil {
				err = api.VerifyAgentRequest(key, r.Method, r.URL.RequestURI(), token, time.Now())
			}
		}
	}
	if err != nil {
		a.log.Warn("master request refused", "remote", r.RemoteAddr, "path", r.URL.Path, "err", err)
		api.Errorf(w, api.ErrUnauthorized, err.Error())
		return false
	}
	return true
}

func cutBearer(h string) (string, bool) {
	const p = "Bearer "
	if len(h) > len(p) && h[:len(p)] == p {
		return h[len(p):], true
	}
	return "", false
}

func (a *Agent) serveLogs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	req, err := api.ParseLogRequest(q)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	job := q.Get("job")
	for name, v := range map[string]string{"job": job, "link": req.Link} {
		if v == "" && name == "link" {
			continue
		}
		if err := cluster.CheckName(v); err != nil && !(name == "job" && isRouterName(v)) {
			api.Errorf(w, api.ErrBadInput, fmt.Sprintf("%s: %v", name, err))
			return
		}
	}
	k := cluster.WorkerKey{Job: job, Link: req.Link, Worker: req.Worker}
	id := workerID(a.cfg.Node.ID, k)
	var mode string
	if err := a.call(r.Context(), func(r *run) {
		if s := r.workers[id]; s != nil {
			mode = s.mode
		}
	}); err != nil {
		api.Errorf(w, api.ErrUnavailable, fmt.Sprintf("agent of node %s: %v", a.cfg.Node.ID, err))
		return
	}
	if mode == "" {
		api.Errorf(w, api.ErrNotFound, fmt.Sprintf("worker %s does not run on node %s", k, a.cfg.Node.ID))
		return
	}
	lr, ok := a.driver(mode).(isolation.LogReader)
	if !ok {
		api.Errorf(w, api.ErrNotFound, fmt.Sprintf("the %s driver of node %s reads no logs", mode, a.cfg.Node.ID))
		return
	}
	rc, err := lr.Logs(r.Context(), id, isolation.LogOptions{Follow: req.Follow, Tail: req.Tail, Previous: req.Previous})
	if errors.Is(err, isolation.ErrNoLogs) {
		api.Errorf(w, api.ErrNotFound, fmt.Sprintf("%v (node %s)", err, a.cfg.Node.ID))
		return
	}
	if err != nil {
		api.Errorf(w, api.ErrInternal, fmt.Sprintf("read the log of worker %s on node %s: %v", k, a.cfg.Node.ID, err))
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	sw := api.NewStreamWriter(w)
	defer sw.Stop()
	buf := make([]byte, 32<<10)
	for {
		n, err := rc.Read(buf)
		if n > 0 && sw.Write(buf[:n]) != nil {
			return
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && r.Context().Err() == nil {
				a.log.Warn("reading a worker's log", "worker", id, "err", err)
			}
			return
		}
	}
}

// isRouterName reports whether job names a mirrored job's output routers (JOB.router):
// the only job names with a dot.
func isRouterName(job string) bool {
	const suffix = ".router"
	return len(job) > len(suffix) && job[len(job)-len(suffix):] == suffix && cluster.CheckName(job[:len(job)-len(suffix)]) == nil
}
