package agents_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
)

// TestLogsHandler serves a running worker's log to a request signed with the cluster's agent
// key, and to nothing else.
func TestLogsHandler(t *testing.T) {
	h := newHarness(t, "mem")
	key := []byte("0123456789abcdef0123456789abcdef")
	if _, err := h.store.Create(context.Background(), cluster.AgentKeyKey, []byte(hex.EncodeToString(key)), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	ra := h.start(h.cfg, h.agentStore())
	h.assign(h.wa("wc", 0, 1, "run"))
	h.waitRecord("worker running", 20*time.Second, func(rec cluster.NodeRecord) bool {
		return len(rec.Workers) == 1 && rec.Workers[0].State == cluster.WorkerRunning
	})
	srv := httptest.NewServer(ra.a.LogsHandler())
	t.Cleanup(srv.Close)
	get := func(uri, token string) (int, string) {
		t.Helper()
		code, b := getWith(t, srv.URL+uri, token)
		return code, string(b)
	}
	uri := "/v1/logs?job=wc&tail=-1&worker=0"
	sign := func(k []byte, u string) string {
		return api.SignAgentRequest(k, http.MethodGet, u, time.Now(), api.AgentTokenTTL)
	}
	var body string
	testenv.EventuallyWith(t, "the worker's log through a signed request", 10*time.Second, func() (bool, string) {
		code, b := get(uri, sign(key, uri))
		body = b
		return code == http.StatusOK && strings.Contains(b, "helper pid"), fmt.Sprintf("%d %q", code, b)
	})
	t.Logf("log: %q", body)
	for _, tc := range []struct {
		name, uri, token string
		want             int
	}{
		{"unsigned", uri, "", http.StatusUnauthorized},
		{"another key", uri, sign([]byte("fedcba9876543210fedcba9876543210"), uri), http.StatusUnauthorized},
		{"signed for another worker", uri, sign(key, "/v1/logs?job=wc&tail=-1&worker=1"), http.StatusUnauthorized},
		{"a worker the node does not run", "/v1/logs?job=wc&worker=1", sign(key, "/v1/logs?job=wc&worker=1"), http.StatusNotFound},
		{"no previous run", "/v1/logs?job=wc&previous=true&worker=0", sign(key, "/v1/logs?job=wc&previous=true&worker=0"), http.StatusNotFound},
		{"a bad job name", "/v1/logs?job=..&worker=0", sign(key, "/v1/logs?job=..&worker=0"), http.StatusBadRequest},
	} {
		if code, b := get(tc.uri, tc.token); code != tc.want || strings.Contains(b, "helper pid") {
			t.Errorf("%s: %d %q, want %d", tc.name, code, b, tc.want)
		}
	}
}

// TestMetricsHandler: the node's job metrics (its workers' series added up per job, with
// what the agent measures) go to a request signed with the cluster's agent key for this
// node, and to nothing else; each worker's detail likewise.
func TestMetricsHandler(t *testing.T) {
	h := newHarness(t, "mem")
	key := []byte("0123456789abcdef0123456789abcdef")
	if _, err := h.store.Create(context.Background(), cluster.AgentKeyKey, []byte(hex.EncodeToString(key)), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	cfg := h.cfg
	cfg.MetricsInterval = 200 * time.Millisecond
	ra := h.start(cfg, h.agentStore())
	h.assign(h.wa("wc", 0, 1, "run"), h.wa("wc", 1, 1, "run"))
	h.waitRecord("workers running", 20*time.Second, allRunning("wc/0", "wc/1"))
	srv := httptest.NewServer(ra.a.LogsHandler())
	t.Cleanup(srv.Close)
	get := func(uri, token string) (int, []byte) {
		t.Helper()
		return getWith(t, srv.URL+uri, token)
	}
	sign := func(k []byte, u string) string {
		return api.SignAgentRequest(k, http.MethodGet, u, time.Now(), api.AgentTokenTTL)
	}
	uri := "/v1/metrics?node=" + nodeID
	testenv.EventuallyWith(t, "the node's job metrics", 20*time.Second, func() (bool, string) {
		code, b := get(uri, sign(key, uri))
		if code != http.StatusOK {
			return false, fmt.Sprintf("%d %s", code, b)
		}
		m, err := api.UnmarshalNodeMetrics(b)
		if err != nil {
			return false, err.Error()
		}
		var got []string
		ok := map[string]bool{}
		for _, j := range m.Jobs {
			for _, s := range j.Series {
				got = append(got, fmt.Sprintf("%s/%s=%v(%d)", j.Job, s.Name, s.Sum, s.N))
				switch {
				case s.Name == "helper_up" && s.Sum == 2 && s.N == 2,
					s.Name == api.SeriesWorkers && s.Sum == 2,
					s.Name == api.SeriesMemory && s.Sum > 0 && s.N == 2,
					s.Name == "helper_ticks_total" && s.Counter && s.N == 2:
					ok[s.Name] = true
				}
			}
			if j.Job != "wc" || j.Tenant != "search" || j.Workers != 2 || j.Failed != 0 {
				return false, fmt.Sprintf("job %+v", j)
			}
		}
		return m.Node == nodeID && len(ok) == 4, strings.Join(got, " ")
	})
	wuri := "/v1/metrics/workers?job=wc&node=" + nodeID
	code, b := get(wuri, sign(key, wuri))
	var ws []api.WorkerMetrics
	if err := json.Unmarshal(b, &ws); code != http.StatusOK || err != nil || len(ws) != 2 || ws[0].State != "ok" || ws[1].State != "ok" || ws[1].Worker != 1 {
		t.Errorf("workers' detail: %d %s", code, b)
	}
	for _, tc := range []struct {
		name, uri, token string
		want             int
	}{
		{"unsigned", uri, "", http.StatusUnauthorized},
		{"another key", uri, sign([]byte("fedcba9876543210fedcba9876543210"), uri), http.StatusUnauthorized},
		{"signed for the workers' detail", uri, sign(key, wuri), http.StatusUnauthorized},
		{"for another node", "/v1/metrics?node=n9", sign(key, "/v1/metrics?node=n9"), http.StatusNotFound},
		{"a bad job name", "/v1/metrics/workers?job=..&node=" + nodeID, sign(key, "/v1/metrics/workers?job=..&node="+nodeID), http.StatusBadRequest},
	} {
		if code, b := get(tc.uri, tc.token); code != tc.want || strings.Contains(string(b), "helper_up") {
			t.Errorf("%s: %d %q, want %d", tc.name, code, b, tc.want)
		}
	}
}

// getWith GETs url with a bearer token ("" sends none): the status and the body.
func getWith(t *testing.T, url, token string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}
