package metricsauth_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/metricsauth"
)

// TestGuard: the scrape token and the admin token read the figures; no token, a wrong one or
// a tenant's gets 401 with a one-line error naming no job.
func TestGuard(t *testing.T) {
	ctx := context.Background()
	s, err := coord.Open(ctx, "mem://metricsauth", coord.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	scrape, admin := api.NewToken(), api.NewToken()
	for key, tok := range map[string]string{cluster.MetricsTokenKey: scrape, cluster.AdminTokenKey: admin} {
		if _, err := s.Create(ctx, key, []byte(api.HashToken(tok)), coord.Persistent); err != nil {
			t.Fatal(err)
		}
	}
	figures := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `stormdock_agent_worker_restarts_total{job="secret-job"} 1`+"\n")
	})
	srv := httptest.NewServer(metricsauth.New(s, slog.New(slog.NewTextHandler(io.Discard, nil))).Wrap(figures))
	defer srv.Close()
	for _, tc := range []struct {
		name   string
		header string
		status int
	}{
		{"anonymous", "", http.StatusUnauthorized},
		{"not bearer", "Basic " + scrape, http.StatusUnauthorized},
		{"wrong token", "Bearer sdt_forged", http.StatusUnauthorized},
		{"tenant token", "Bearer " + api.NewToken(), http.StatusUnauthorized},
		{"scrape token", "Bearer " + scrape, http.StatusOK},
		{"scrape token again (cached)", "Bearer " + scrape, http.StatusOK},
		{"admin token", "Bearer " + admin, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/metrics", nil)
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if tc.status == http.StatusOK {
				if !strings.Contains(string(b), "secret-job") {
					t.Errorf("figures not served: %s", b)
				}
				return
			}
			var eb api.ErrorBody
			if err := json.Unmarshal(b, &eb); err != nil || eb.Code != "unauthorized" || strings.Count(strings.TrimSpace(string(b)), "\n") > 0 {
				t.Fatalf("refusal %q: %v", b, err)
			}
			if strings.Contains(string(b), "secret-job") {
				t.Errorf("the refusal names the job: %s", b)
			}
		})
	}
}

// TestGuardAdmin: Admin (an agent's profiles) answers the admin token alone; the scrape
// token, a wrong one or none get 401 (429 once the address failed too often).
func TestGuardAdmin(t *testing.T) {
	ctx := context.Background()
	s, err := coord.Open(ctx, "mem://metricsauth-admin", coord.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	scrape, admin := api.NewToken(), api.NewToken()
	for key, tok := range map[string]string{cluster.MetricsTokenKey: scrape, cluster.AdminTokenKey: admin} {
		if _, err := s.Create(ctx, key, []byte(api.HashToken(tok)), coord.Persistent); err != nil {
			t.Fatal(err)
		}
	}
	profile := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "the heap") })
	srv := httptest.NewServer(metricsauth.New(s, slog.New(slog.NewTextHandler(io.Discard, nil))).Admin(profile))
	defer srv.Close()
	for _, tc := range []struct {
		name  string
		token string
		ok    bool
	}{
		{"admin token", admin, true},
		{"anonymous", "", false},
		{"wrong token", "sdt_forged", false},
		{"scrape token", scrape, false},
		{"scrape token again (cached)", scrape, false},
		{"admin token again", admin, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/debug/pprof/heap", nil)
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			switch {
			case tc.ok && (resp.StatusCode != http.StatusOK || string(b) != "the heap"):
				t.Fatalf("%d %q, want the profile", resp.StatusCode, b)
			case !tc.ok && resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusTooManyRequests:
				t.Fatalf("%d %q, want a refusal", resp.StatusCode, b)
			case !tc.ok && strings.Contains(string(b), "the heap"):
				t.Fatalf("the refusal carries the profile: %q", b)
			}
		})
	}
}
