package agents_test

import (
	"context"
	"encoding/hex"
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
		req, _ := http.NewRequest(http.MethodGet, srv.URL+uri, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
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
