package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/master/httpapi"
)

// TestMetricsNeedScrapeToken: /metrics answers the scrape token and the admin token; a
// tenant's token gets 403, no token or a wrong one 401 with a one-line error that names no job
// and no tenant; and the scrape token opens no other route.
func TestMetricsNeedScrapeToken(t *testing.T) {
	f := newAPIFixture(t)
	scrape := api.NewToken()
	if _, err := f.tc.Admin.Create(f.tc.Ctx, cluster.MetricsTokenKey, []byte(api.HashToken(scrape)), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	// The fixture's API serves no /metrics; this one serves the master's figures, which
	// name both tenants' jobs.
	h := httpapi.New(f.m, httpapi.Config{Gatherer: f.tc.Registry(f.m), Registry: prometheus.NewRegistry()})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	names := []string{"demo", "other", "demo-job", "other-job"}

	get := func(t *testing.T, method, path, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(f.tc.Ctx, method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
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
	for _, tc := range []struct {
		name   string
		token  string
		status int
		code   string // the api error table's code of a refusal
	}{
		{"anonymous", "", http.StatusUnauthorized, "unauthorized"},
		{"wrong token", "sdt_forged", http.StatusUnauthorized, "unauthorized"},
		{"tenant token", f.tokens["demo"], http.StatusForbidden, "forbidden"},
		{"scrape token", scrape, http.StatusOK, ""},
		{"admin token", f.admin, http.StatusOK, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := get(t, http.MethodGet, "/metrics", tc.token)
			if status != tc.status {
				t.Fatalf("GET /metrics: %d, want %d: %s", status, tc.status, clip(body))
			}
			if tc.status == http.StatusOK {
				for _, want := range []string{"stormdock_master_job_workers_desired", `job="demo-job"`, `tenant="other"`} {
					if !strings.Contains(body, want) {
						t.Errorf("the metrics lack %s", want)
					}
				}
				return
			}
			var eb api.ErrorBody
			if err := json.Unmarshal([]byte(body), &eb); err != nil || eb.Code != tc.code || eb.Error == "" {
				t.Fatalf("refusal body %q: %+v, %v; want code %s", body, eb, err, tc.code)
			}
			if strings.Count(strings.TrimSpace(body), "\n") > 0 {
				t.Errorf("refusal not one line: %q", body)
			}
			if tc.status == http.StatusUnauthorized {
				for _, n := range names {
					if regexp.MustCompile(`\b` + regexp.QuoteMeta(n) + `\b`).MatchString(eb.Error) {
						t.Errorf("the anonymous refusal names %s: %q", n, eb.Error)
					}
				}
			}
		})
	}
	// The scrape token is no API token: every route that takes one refuses it, before any
	// handler runs (401, or 429 once the address used up its failures).
	for _, pattern := range h.Routes() {
		method, path, _ := strings.Cut(pattern, " ")
		if pattern == "GET /v1/health" {
			continue // needs no token
		}
		path = regexp.MustCompile(`\{[a-z]+\}`).ReplaceAllString(path, "demo-job")
		status, body := get(t, method, path, scrape)
		if status != http.StatusUnauthorized && status != http.StatusTooManyRequests {
			t.Errorf("%s with the scrape token: %d %s", pattern, status, clip(body))
		}
	}
}

func clip(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}
