package httpapi_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/profiling"
)

// TestProfilesNeedAdminToken: the master's Go profiles and runtime figures answer the admin
// token alone; no token, a wrong one and the scrape token get 401, a tenant's 403, each
// with a one-line error and no profile.
func TestProfilesNeedAdminToken(t *testing.T) {
	f := newAPIFixture(t)
	scrape := api.NewToken()
	if _, err := f.tc.Admin.Create(f.tc.Ctx, cluster.MetricsTokenKey, []byte(api.HashToken(scrape)), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	get := func(t *testing.T, path, token string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(f.tc.Ctx, http.MethodGet, f.srv.URL+path, nil)
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
		return resp.StatusCode, b
	}
	paths := []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/goroutine?debug=2", "/debug/pprof/profile?seconds=1", "/debug/runtime"}
	for _, tc := range []struct {
		name   string
		token  string
		status int
		code   string
	}{
		{"anonymous", "", http.StatusUnauthorized, "unauthorized"},
		{"wrong token", "sdt_forged", http.StatusUnauthorized, "unauthorized"},
		{"scrape token", scrape, http.StatusUnauthorized, "unauthorized"},
		{"tenant token", f.tokens["demo"], http.StatusForbidden, "forbidden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, p := range paths {
				status, body := get(t, p, tc.token)
				want, code := tc.status, tc.code
				if status == http.StatusTooManyRequests && tc.status == http.StatusUnauthorized {
					// The address used up its failures: refused all the same.
					want, code = http.StatusTooManyRequests, "rate_limited"
				}
				if status != want {
					t.Fatalf("GET %s: %d, want %d: %s", p, status, tc.status, clip(string(body)))
				}
				var eb api.ErrorBody
				if err := json.Unmarshal(body, &eb); err != nil || eb.Code != code || bytes.Count(bytes.TrimSpace(body), []byte("\n")) > 0 {
					t.Fatalf("GET %s: refusal %q (%v), want one line of code %s", p, clip(string(body)), err, code)
				}
			}
		})
	}
	t.Run("admin token", func(t *testing.T) {
		for _, p := range []string{"/debug/pprof/heap", "/debug/pprof/profile?seconds=1"} {
			status, body := get(t, p, f.admin)
			// A profile is gzipped protobuf.
			if status != http.StatusOK || !bytes.HasPrefix(body, []byte{0x1f, 0x8b}) {
				t.Fatalf("GET %s: %d, %d bytes %q", p, status, len(body), clip(string(body)))
			}
		}
		status, body := get(t, "/debug/runtime", f.admin)
		var rt profiling.Runtime
		if status != http.StatusOK || json.Unmarshal(body, &rt) != nil || rt.Goroutines == 0 || len(rt.Metrics) == 0 {
			t.Fatalf("GET /debug/runtime: %d %s", status, clip(string(body)))
		}
		if status, body := get(t, "/debug/pprof/profile?seconds=nine", f.admin); status != http.StatusBadRequest {
			t.Fatalf("a bad seconds: %d %s", status, clip(string(body)))
		}
	})
}
