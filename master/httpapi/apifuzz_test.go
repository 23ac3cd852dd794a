package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/master/httpapi"
)

// fuzzMaster is a master that serves its API but never leads: another candidate holds the
// election, so nothing but the request under test writes to the store, and a refused
// request can be checked to have changed nothing.
type fuzzMaster struct {
	h      http.Handler
	admin  coord.Store
	tokens []string // "", admin, tenant demo, tenant other, garbage
	ctx    context.Context
}

func newFuzzMaster(tb testing.TB) *fuzzMaster {
	tb.Helper()
	srv, err := coord.NewServer(coord.ServerOptions{Logger: quiet})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	connect := func() *coord.Embedded {
		c, err := srv.Connect(coord.Options{SessionTimeout: -1, Logger: quiet})
		if err != nil {
			tb.Fatal(err)
		}
		return c
	}
	admin := connect()
	if err := master.EnsureDirs(ctx, admin); err != nil {
		tb.Fatal(err)
	}
	holder, err := coord.NewElection(connect(), cluster.ElectionKey, "holder")
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := holder.Campaign(ctx); err != nil {
		tb.Fatal(err)
	}
	m, err := master.New(connect(), master.Config{ID: "fuzzed", Logger: quiet})
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = m.Run(ctx)
	}()
	tb.Cleanup(func() {
		cancel()
		<-done
		srv.Close()
	})
	f := &fuzzMaster{h: httpapi.New(m, httpapi.Config{}), admin: admin, ctx: ctx}
	adminToken := api.NewToken()
	if _, err := admin.Create(ctx, cluster.AdminTokenKey, []byte(api.HashToken(adminToken)), coord.Persistent); err != nil {
		tb.Fatal(err)
	}
	f.tokens = []string{"", adminToken}
	for _, tenant := range []string{"demo", "other"} {
		if err := desired.CreateTenant(ctx, admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: tenant, MaxWorkers: 50}}); err != nil {
			tb.Fatal(err)
		}
		tok, err := desired.SetTenantToken(ctx, admin, tenant)
		if err != nil {
			tb.Fatal(err)
		}
		f.tokens = append(f.tokens, tok)
		if _, err := desired.SubmitJob(ctx, admin, testSpecFor(tenant+"-job", tenant, 2)); err != nil {
			tb.Fatal(err)
		}
	}
	f.tokens = append(f.tokens, "sdt_garbage")
	if err := desired.PutDC(ctx, admin, cluster.DCRecord{Name: "dc-a", State: cluster.DCActive}); err != nil {
		tb.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !bytes.Contains(f.serve(tb, "GET /v1/jobs", 1, nil, "127.0.0.1:1").Body.Bytes(), []byte("other-job")) {
		if time.Now().After(deadline) {
			tb.Fatal("the fuzzed master's mirrors never showed the jobs")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return f
}

func testSpecFor(name, tenant string, workers int) *cluster.JobSpec {
	s := clustertest.Spec(name, workers)
	s.Tenant = tenant
	return s
}

// serve parses a request line as the server would and serves it; nil when net/http itself
// would refuse the request before any handler.
func (f *fuzzMaster) serve(tb testing.TB, line string, token int, body []byte, remote string) *httptest.ResponseRecorder {
	var raw bytes.Buffer
	fmt.Fprintf(&raw, "%s HTTP/1.1\r\nHost: master\r\nContent-Length: %d\r\n", line, len(body))
	if tok := f.tokens[token%len(f.tokens)]; tok != "" {
		fmt.Fprintf(&raw, "Authorization: Bearer %s\r\n", tok)
	}
	raw.WriteString("\r\n")
	raw.Write(body)
	req, err := http.ReadRequest(bufio.NewReader(&raw))
	if err != nil {
		return nil
	}
	req.RemoteAddr = remote
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, req)
	return w
}

var fuzzExec atomic.Int64

// FuzzMasterAPI sends arbitrary requests (method, path, body, any of the tokens) to the
// master's handler. Whatever comes in: no panic, no 5xx, every error is a one-line JSON
// ErrorBody with a code, and a request that is refused changes nothing in the store.
func FuzzMasterAPI(f *testing.F) {
	seeds := []struct {
		line  string
		token int
		body  string
	}{
		{"POST /v1/jobs/..%2Ftenants%2Fdemo/kill", 1, `{}`},
		{"POST /v1/jobs/..%2Fdcs%2Fdc-a/kill", 1, `{}`},
		{"POST /v1/jobs/demo-job/scale", 2, `{"workers": 3}`},
		{"POST /v1/jobs/demo-job/scale", 3, `{"workers": 1, "workers": 2}`},
		{"POST /v1/jobs/demo-job/kill", 1, `{"grace": "-1s"}`},
		{"POST /v1/jobs", 2, `{"name": "x", "tenant": "demo", "workers": 1, "resources": {"memory": "64Mi", "cpu": 0.1}, "command": ["sleep", "1"]}`},
		{"POST /v1/jobs", 1, "name: a\ntenant: demo\nworkers: 1e9\n"},
		{"POST /v1/tenants", 1, `{"name": "t1", "maxWorkers": 3}`},
		{"POST /v1/tenants/demo/token", 3, ``},
		{"POST /v1/tenants/demo/update", 2, `{"maxPriority": 1000}`},
		{"POST /v1/tenants/demo/registry-auth", 3, `{"auths": {"127.0.0.1:5055": {"auth": "dTpw"}}}`},
		{"POST /v1/tenants/demo/registry-auth", 2, `{"auths": {"h": {"auth": "%%%"}}}`},
		{"POST /v1/tenants/demo/registry-auth/clear", 3, ``},
		{"POST /v1/images/share", 2, `{"prefix": "127.0.0.1:5055/base/"}`},
		{"POST /v1/images/unshare", 1, `{"prefix": "base:1"}`},
		{"POST /v1/dcs/dc-a/restore", 1, `{"rebalance": true}`},
		{"POST /v1/nodes/%2e%2e/drain", 1, ``},
		{"GET /v1/jobs/other-job", 2, ``},
		{"DELETE /v1/tenants", 1, ``},
		{"GET /v1/../v1/jobs", 0, ``},
	}
	for _, s := range seeds {
		f.Add(s.line, byte(s.token), []byte(s.body))
	}
	fm := newFuzzMaster(f)
	f.Fuzz(func(t *testing.T, line string, token byte, body []byte) {
		n := fuzzExec.Add(1)
		remote := fmt.Sprintf("10.%d.%d.%d:%d", n>>16&255, n>>8&255, n&255, 1024+n%50000)
		before := dump(fm.ctx, t, fm.admin)
		w := fm.serve(t, line, int(token), body, remote)
		if w == nil {
			return // net/http refuses it before any handler
		}
		status := w.Code
		if status >= 500 {
			t.Fatalf("%q token %d body %q: %d %s", line, token, body, status, w.Body)
		}
		if status >= 400 {
			var eb api.ErrorBody
			if err := json.Unmarshal(w.Body.Bytes(), &eb); err != nil || eb.Error == "" || eb.Code == "" || strings.Contains(eb.Error, "\n") {
				t.Fatalf("%q: %d with body %q: want a one-line JSON error with a code", line, status, w.Body)
			}
		}
		if status >= 300 {
			if after := dump(fm.ctx, t, fm.admin); !maps.Equal(before, after) {
				t.Fatalf("%q token %d body %q was refused (%d) but changed the store:\n%s", line, token, body, status, diffDumps(before, after))
			}
		}
	})
}
