package sim

import (
	"context"
	"encoding/hex"
	"fmt"
	"maps"
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

// Metrics serves the simulated agents' job metrics to the masters as real agents serve
// theirs (GET /v1/metrics?node=ID, signed with the cluster's agent key, binary): one HTTP
// server for every agent of the process, the node named in the signed query. Each answer is
// the node's running workers' series added up per job: Series series of each worker's own
// (half gauges, half counters) and the five an agent measures.
type Metrics struct {
	store  coord.KV
	series int
	ln     net.Listener
	srv    *http.Server

	mu       sync.Mutex
	agents   map[string]*Agent
	key      []byte
	requests int64
}

// Answers counts the answers served.
func (m *Metrics) Answers() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.requests
}

// NewMetrics listens on loopback for the masters' requests; series is how many series each
// simulated worker serves.
func NewMetrics(store coord.KV, series int) (*Metrics, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("sim: metrics: %w", err)
	}
	m := &Metrics{store: store, series: series, ln: ln, agents: map[string]*Agent{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/metrics", m.serve)
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go m.srv.Serve(ln) //nolint:errcheck // until Close
	return m, nil
}

// Endpoint is where the agents tell the masters to ask: the address for their nodes'
// records and the endpoint.
func (m *Metrics) Endpoint() (string, *cluster.LogsEndpoint) {
	a := m.ln.Addr().(*net.TCPAddr)
	return a.IP.String(), &cluster.LogsEndpoint{Port: a.Port}
}

// Close stops serving.
func (m *Metrics) Close() error { return m.srv.Close() }

func (m *Metrics) add(a *Agent) {
	m.mu.Lock()
	m.agents[a.node.ID] = a
	m.mu.Unlock()
}

func (m *Metrics) remove(a *Agent) {
	m.mu.Lock()
	if m.agents[a.node.ID] == a {
		delete(m.agents, a.node.ID)
	}
	m.mu.Unlock()
}

// agentKey reads the key masters sign with (made by the first master that needs it).
func (m *Metrics) agentKey(ctx context.Context) ([]byte, error) {
	m.mu.Lock()
	k := m.key
	m.mu.Unlock()
	if k != nil {
		return k, nil
	}
	e, err := m.store.Get(ctx, cluster.AgentKeyKey)
	if err != nil {
		return nil, err
	}
	k, err = hex.DecodeString(string(e.Value))
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.key = k
	m.mu.Unlock()
	return k, nil
}

func (m *Metrics) serve(w http.ResponseWriter, r *http.Request) {
	token, _ := cutBearer(r.Header.Get("Authorization"))
	key, err := m.agentKey(r.Context())
	if err == nil {
		err = api.VerifyAgentRequest(key, r.Method, r.URL.RequestURI(), token, time.Now())
	}
	if err != nil {
		api.Errorf(w, api.ErrUnauthorized, err.Error())
		return
	}
	node := r.URL.Query().Get("node")
	m.mu.Lock()
	a := m.agents[node]
	m.requests++
	m.mu.Unlock()
	if a == nil {
		api.Errorf(w, api.ErrNotFound, "no simulated node "+node)
		return
	}
	b := api.MarshalNodeMetrics(a.metrics(m.series))
	w.Header().Set("Content-Type", api.NodeMetricsContentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

func cutBearer(h string) (string, bool) {
	const p = "Bearer "
	if len(h) > len(p) && h[:len(p)] == p {
		return h[len(p):], true
	}
	return "", false
}

// metrics is the agent's answer: its running workers' series added up per job.
func (a *Agent) metrics(series int) api.NodeMetrics {
	now := time.Now()
	a.mu.Lock()
	type acc struct {
		tenant  string
		workers int
		series  map[string]*api.SeriesSample
	}
	jobs := map[string]*acc{}
	add := func(j *acc, name string, counter bool, v, rate float64) {
		s := j.series[name]
		if s == nil {
			s = &api.SeriesSample{Name: name, Counter: counter}
			j.series[name] = s
		}
		one := api.SeriesSample{Sum: v, Min: v, Max: v, N: 1}
		if counter {
			one = api.SeriesSample{Sum: rate, Min: rate, Max: rate, N: 1, Total: v}
		}
		s.Add(one)
	}
	up := now.Sub(a.started).Seconds()
	for k, s := range a.workers {
		if s.st.State != cluster.WorkerRunning {
			continue
		}
		j := jobs[k.Job]
		if j == nil {
			j = &acc{tenant: s.wa.Tenant, series: map[string]*api.SeriesSample{}}
			jobs[k.Job] = j
		}
		j.workers++
		w := float64(k.Worker)
		add(j, api.SeriesWorkers, false, 1, 0)
		add(j, api.SeriesCPU, true, up*0.1, 0.1)
		add(j, api.SeriesMemory, false, float64(s.st.Memory), 0)
		add(j, api.SeriesRestarts, true, float64(s.st.Restarts), 0)
		add(j, api.SeriesOOMKills, true, 0, 0)
		for i := range series {
			name := simSeries[i%len(simSeries)]
			if i >= len(simSeries) {
				name += strconv.Itoa(i / len(simSeries))
			}
			if i%2 == 0 {
				add(j, name, false, w+float64(i), 0)
			} else {
				add(j, name+"_total", true, up*float64(i), float64(i))
			}
		}
	}
	a.mu.Unlock()
	m := api.NodeMetrics{Node: a.node.ID, At: now.UTC(), Interval: time.Second}
	for _, name := range slices.Sorted(maps.Keys(jobs)) {
		j := jobs[name]
		nj := api.NodeJobMetrics{Job: name, Tenant: j.tenant, Workers: j.workers}
		for _, id := range slices.Sorted(maps.Keys(j.series)) {
			nj.Series = append(nj.Series, *j.series[id])
		}
		m.Jobs = append(m.Jobs, nj)
	}
	return m
}

// simSeries name the simulated workers' own series.
var simSeries = []string{"queue_depth", "records_processed", "lag_seconds", "bytes_read", "batch_size",
	"errors", "open_connections", "commits", "cache_entries", "retries"}
