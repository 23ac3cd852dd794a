package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/master/httpapi"
)

// The tests in this file attack the master's API as a client would that owes it nothing:
// raw requests, names that try to leave their directory, bodies that are wrong in every way
// a JSON decoder lets through, and other tenants' tokens. Whatever they send, the store
// stays as it was.

// apiFixture is a running master with two nodes, two tenants with a job each, the admin
// token and one token per tenant, served over a real listener.
type apiFixture struct {
	tc       *clustertest.Sim
	m        *master.Master
	srv      *httptest.Server
	patterns []string
	admin    string
	tokens   map[string]string // tenant -> token
}

func newAPIFixture(t *testing.T) *apiFixture {
	t.Helper()
	tc := clustertest.NewSim(t)
	m, _, _ := tc.Master("m1")
	for _, n := range clustertest.Nodes(2, 1, 1) {
		tc.Node(n)
	}
	testenv.Eventually(t, "the master sees 2 nodes", testenv.Timeout(5*time.Second), func() bool { return len(m.NodeEntries()) == 2 })
	h := httpapi.New(m, httpapi.Config{})
	f := &apiFixture{tc: tc, m: m, srv: httptest.NewServer(h), patterns: h.Routes(), tokens: map[string]string{}}
	t.Cleanup(f.srv.Close)
	f.admin = api.NewToken()
	if _, err := tc.Admin.Create(tc.Ctx, cluster.AdminTokenKey, []byte(api.HashToken(f.admin)), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	cl, _ := api.NewClient(f.srv.URL, f.admin)
	for _, tenant := range []string{"demo", "other"} {
		if err := cl.CreateTenant(tc.Ctx, cluster.Tenant{Name: tenant, MaxWorkers: 6}); err != nil {
			t.Fatal(err)
		}
		tok, err := cl.TenantToken(tc.Ctx, tenant)
		if err != nil {
			t.Fatal(err)
		}
		f.tokens[tenant] = tok
		spec := fmt.Sprintf("name: %s-job\ntenant: %s\nworkers: 2\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [sleep, '1000']\n", tenant, tenant)
		if _, err := cl.SubmitJob(tc.Ctx, []byte(spec)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, "both jobs run", testenv.Timeout(5*time.Second), func() bool {
		jobs, err := cl.Jobs(tc.Ctx)
		return err == nil && len(jobs) == 2 && jobs[0].Running == 2 && jobs[1].Running == 2
	})
	return f
}

// dump reads every persistent entry of the store with its version. Ephemeral entries (node
// records, the election, the master's address) belong to sessions, not to requests; the
// event log is left out too: every request, refused or not, is an event of the audit, and
// the log flushes in batches, whenever its writer gets to them.
func dump(ctx context.Context, t testing.TB, s coord.KV) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(key string)
	walk = func(key string) {
		if key == cluster.EventsKey {
			return
		}
		e, err := s.Get(ctx, key)
		if err != nil {
			t.Fatalf("dump %s: %v", key, err)
		}
		if e.Owner == 0 {
			out[key] = fmt.Sprintf("v%d %s", e.Version, e.Value)
		}
		kids, err := s.Children(ctx, key)
		if err != nil {
			t.Fatalf("dump %s: %v", key, err)
		}
		for _, k := range kids {
			walk(path.Join(key, k))
		}
	}
	walk("/")
	return out
}

// settled waits until two dumps a moment apart agree: the leader has nothing left to write.
func (f *apiFixture) settled(t *testing.T) map[string]string {
	t.Helper()
	var last map[string]string
	testenv.Eventually(t, "the store settles", testenv.Timeout(10*time.Second), func() bool {
		d := dump(f.tc.Ctx, t, f.tc.Admin)
		same := maps.Equal(d, last)
		last = d
		if !same {
			time.Sleep(150 * time.Millisecond)
		}
		return same
	})
	return last
}

func diffDumps(a, b map[string]string) string {
	var out []string
	keys := maps.Clone(a)
	maps.Copy(keys, b)
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if a[k] != b[k] {
			out = append(out, fmt.Sprintf("%s: %q -> %q", k, a[k], b[k]))
		}
	}
	return strings.Join(out, "\n")
}

// raw sends one request exactly as written (no client-side cleaning or escaping of the
// path) and returns the answer's status and body.
func (f *apiFixture) raw(t testing.TB, method, target, token string, body []byte) (int, string, http.Header) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(f.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(testenv.Timeout(10 * time.Second)))
	var req bytes.Buffer
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: master\r\nConnection: close\r\n", method, target)
	if token != "" {
		fmt.Fprintf(&req, "Authorization: Bearer %s\r\n", token)
	}
	if body != nil {
		fmt.Fprintf(&req, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	req.WriteString("\r\n")
	req.Write(body)
	if _, err := conn.Write(req.Bytes()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		// A stream runs until the connection's deadline: its first event with data (the
		// snapshot, after the stream's retry setting) is the answer.
		var ev strings.Builder
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			ev.WriteString(line)
			if err != nil || (line == "\n" && strings.Contains(ev.String(), "data: ")) {
				conn.Close() // or closing the body reads the stream to its end
				return resp.StatusCode, ev.String(), resp.Header
			}
		}
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// escapes are ways to write a name that is not one: traversal (plain, encoded, double
// encoded), relative segments, control and non-ASCII characters, case, and length.
var escapes = []string{
	"..%2Ftenants%2Fdemo", "..%2Fdcs%2Fdc-a", "..%2F..%2Fmaster%2Fadmin", "..%252Ftenants%252Fdemo",
	"%2E%2E%2Ftenants%2Fdemo", "%2e%2e", "demo-job%2F..%2F..%2Ftenants%2Fdemo", "..%5Ctenants%5Cdemo",
	"%2Fjobs%2Fdemo-job", "a%00b", "a%0Ab", "%C3%A9", "%E2%80%AEjob", "Demo-job", "demo_job", "a.router",
	"-a", strings.Repeat("a", 64), strings.Repeat("%41", 300), "%20",
}

// fill puts name into every wildcard of a route pattern's path.
func fill(pattern, name string) (method, target string) {
	method, p, _ := strings.Cut(pattern, " ")
	return method, httpapi.PathParam.ReplaceAllString(p, name)
}

// bodyFor is a valid body for a route, so that only the path can be wrong.
func bodyFor(method, target string) []byte {
	switch {
	case method != http.MethodPost:
		return nil
	case strings.HasSuffix(target, "/scale"):
		return []byte(`{"workers": 1}`)
	case strings.HasSuffix(target, "/kill"):
		return []byte(`{"grace": "1s"}`)
	default:
		return []byte(`{}`)
	}
}

// TestAPITraversalChangesNothing: every route with every escaping name, with the admin
// token, is answered 400 (or, for a name the path's own cleaning changes, a redirect or
// 404) and the store is byte for byte what it was.
func TestAPITraversalChangesNothing(t *testing.T) {
	f := newAPIFixture(t)
	before := f.settled(t)
	routes := 0
	for _, pattern := range f.patterns {
		if !strings.Contains(pattern, "{") {
			continue
		}
		routes++
		for _, name := range escapes {
			method, target := fill(pattern, name)
			status, body, _ := f.raw(t, method, target, f.admin, bodyFor(method, target))
			if status != http.StatusBadRequest || !strings.Contains(body, "must be 1-63 lower-case letters") {
				t.Errorf("%s %s: %d %s; want 400 saying what a name is", method, target, status, body)
			}
		}
		// A broken escape never reaches the mux: net/http answers 400 itself.
		if method, target := fill(pattern, "%"); true {
			if status, body, _ := f.raw(t, method, target, f.admin, bodyFor(method, target)); status != http.StatusBadRequest {
				t.Errorf("%s %s: %d %s; want 400", method, target, status, body)
			}
		}
		// Unencoded relative segments are cleaned by the mux before any route sees them:
		// a redirect to the cleaned path, never a handler run on it.
		for _, name := range []string{"..", ".", "../tenants/demo", "./demo-job"} {
			method, target := fill(pattern, name)
			status, body, _ := f.raw(t, method, target, f.admin, bodyFor(method, target))
			if status < 300 || status >= 500 {
				t.Errorf("%s %s: %d %s; want a redirect or a refusal", method, target, status, body)
			}
		}
	}
	if routes < 6 {
		t.Fatalf("only %d routes with a name: the route list is wrong", routes)
	}
	if after := dump(f.tc.Ctx, t, f.tc.Admin); !maps.Equal(before, after) {
		t.Fatalf("the probes changed the store:\n%s", diffDumps(before, after))
	}
}

// TestAPIBadInputChangesNothing: malformed and hostile bodies, wrong methods, unknown paths
// and oversized bodies get a JSON error with the right status, never a 5xx, and the store
// stays as it was.
func TestAPIBadInputChangesNothing(t *testing.T) {
	f := newAPIFixture(t)
	before := f.settled(t)
	spec := func(name, tenant string) string {
		return fmt.Sprintf(`{"name": %q, "tenant": %q, "workers": 1, "resources": {"memory": "64Mi", "cpu": 0.1}, "command": ["sleep", "1"]}`, name, tenant)
	}
	mirrored := func(name, output string) string {
		return fmt.Sprintf(`{"name": %q, "tenant": "demo", "workers": 1, "resources": {"memory": "64Mi", "cpu": 0.1}, "command": ["sleep", "1"], "links": ["dc-a", "dc-b"], "output": %q, "outputSecret": "sinkpass"}`, name, output)
	}
	huge := bytes.Repeat([]byte("a"), api.MaxBodyBytes+1)
	cases := []struct {
		method, target string
		body           string
		status         int
		says           string
	}{
		// Bodies: malformed, unknown fields, repeated keys, trailing data, empty.
		{"POST", "/v1/jobs/demo-job/scale", `{`, 400, "bad request body"},
		{"POST", "/v1/jobs/demo-job/scale", `{"workers": 1, "colour": "red"}`, 400, "unknown field"},
		{"POST", "/v1/jobs/demo-job/scale", `{"workers": 1, "workers": 3}`, 400, `key "workers" is given twice`},
		{"POST", "/v1/jobs/demo-job/scale", `{"workers": 1} {"workers": 3}`, 400, "after the JSON object"},
		{"POST", "/v1/jobs/demo-job/scale", ``, 400, "body is empty"},
		{"POST", "/v1/jobs/demo-job/scale", `[1]`, 400, "bad request body"},
		{"POST", "/v1/jobs/demo-job/scale", `null`, 400, "workers must be between 1"},
		// Counts: zero, negative, huge, fractional, not a number.
		{"POST", "/v1/jobs/demo-job/scale", `{"workers": 0}`, 400, "workers must be between 1"},
		{"POST", "/v1/jobs/demo-job/scale", `{"workers": -1}`, 400, "workers must be between 1"},
		{"POST", "/v1/jobs/demo-job/scale", `{"workers": 1e30}`, 400, "bad request body"},
		{"POST", "/v1/jobs/demo-job/scale", `{"workers": 99999999999999999999}`, 400, "bad request body"},
		{"POST", "/v1/jobs/demo-job/scale", `{"workers": 100001}`, 400, "workers must be between 1"},
		{"POST", "/v1/jobs/demo-job/scale", `{"workers": 1.5}`, 400, "bad request body"},
		{"POST", "/v1/jobs/demo-job/scale", `{"workers": "2"}`, 400, "bad request body"},
		{"POST", "/v1/jobs/demo-job/kill", `{"grace": "-1s"}`, 400, "grace must not be negative"},
		{"POST", "/v1/jobs/demo-job/kill", `{"grace": "soon"}`, 400, "bad request body"},
		{"POST", "/v1/jobs/demo-job/kill", `{"grace": "1s", "grace": "0s"}`, 400, "given twice"},
		{"POST", "/v1/dcs/dc-a/fail", `{"rebalance": true}`, 400, "goes with restore only"},
		// Rollouts.
		{"POST", "/v1/jobs/demo-job/update", `{"spec": ""}`, 400, "the document is empty"},
		{"POST", "/v1/jobs/demo-job/update", `{"spec": "name: demo-job\nworkers: 0\n"}`, 400, "workers: must be at least 1 (line 2)"},
		{"POST", "/v1/jobs/demo-job/update", `{"spec": ` + strconv.Quote(spec("other-name", "demo")) + `}`, 400, `the spec is of job "other-name"`},
		{"POST", "/v1/jobs/demo-job/update", `{"spec": ` + strconv.Quote(spec("demo-job", "other")) + `}`, 400, "cannot move to another tenant"},
		{"POST", "/v1/jobs/demo-job/update", `{"spec": ` + strconv.Quote(spec("demo-job", "demo")) + `, "policy": {"by": "zone"}}`, 400, "must be worker, node, rack or dc"},
		{"POST", "/v1/jobs/demo-job/update", `{"spec": ` + strconv.Quote(spec("demo-job", "demo")) + `, "policy": {"maxParallel": -2}}`, 400, "must not be negative"},
		{"POST", "/v1/jobs/demo-job/update", `{"spec": "x", "spec": "y"}`, 400, "given twice"},
		{"POST", "/v1/jobs/demo-job/rollback", `{"to": -1}`, 400, "must be a generation"},
		{"POST", "/v1/jobs/demo-job/update", `{"spec": "name: demo-job\nworkers: 0\n", "dryRun": true}`, 400, "workers: must be at least 1 (line 2)"},
		{"POST", "/v1/jobs/demo-job/update", `{"spec": "x", "dryRun": "yes"}`, 400, "bad request body"},
		{"GET", "/v1/jobs/demo-job/spec?generation=2", ``, 404, "no generation 2"},
		{"GET", "/v1/jobs/demo-job/logs?worker=0&router=true", ``, 400, "is not mirrored"},
		{"GET", "/v1/jobs/demo-job/logs?worker=0&router=true&link=dc-a", ``, 400, "name no link"},
		{"GET", "/v1/jobs/demo-job/logs?worker=0&router=maybe", ``, 400, "router must be true or false"},
		{"GET", "/v1/events?kind=node.lost,nodes", ``, 400, "want an event kind"},
		{"POST", "/v1/nodes/n1/undrain", `{"job": "x", "colour": 1}`, 400, "unknown field"},
		{"POST", "/v1/jobs/demo-job/rollback", `{"to": 7}`, 404, "no generation 7"},
		{"POST", "/v1/jobs/demo-job/rollback", `{}`, 400, "no generation before 1"},
		{"POST", "/v1/jobs/demo-job/restart", `{"workers": [5]}`, 400, "has workers 0 to"},
		{"POST", "/v1/jobs/demo-job/restart", `{"maxParallel": -1}`, 400, "must not be negative"},
		{"POST", "/v1/jobs/demo-job/promote", `{}`, 400, "no rollout in progress"},
		{"POST", "/v1/jobs/demo-job/pause", `{"now": true}`, 400, "unknown field"},
		{"GET", "/v1/jobs/demo-job/pause", ``, 405, "takes POST"},
		{"POST", "/v1/dcs/dc-a/restore", `{"rebalance": "yes"}`, 400, "bad request body"},
		{"POST", "/v1/tenants", `{"name": "t1", "maxWorkers": -5}`, 400, "must not be negative"},
		{"POST", "/v1/tenants", `{"name": "t1", "maxWorkers": 1.5}`, 400, "bad request body"},
		{"POST", "/v1/tenants", `{"name": "t1", "name": "t2"}`, 400, "given twice"},
		// Names in bodies.
		{"POST", "/v1/tenants", `{"name": "../jobs/demo-job"}`, 400, "must be 1-63"},
		{"POST", "/v1/tenants", `{"name": "t\u0000x"}`, 400, "must be 1-63"},
		{"POST", "/v1/tenants", `{"name": "tén"}`, 400, "must be 1-63"},
		{"POST", "/v1/tenants", `{"name": "t\nx"}`, 400, "must be 1-63"},
		{"POST", "/v1/jobs", spec("../tenants/demo", "demo"), 400, "must be 1-63"},
		{"POST", "/v1/jobs", spec("ok", "../tenants/demo"), 400, "must be 1-63"},
		{"POST", "/v1/jobs", spec("ok\u202e", "demo"), 400, "must be 1-63"},
		{"POST", "/v1/jobs", `{"name": "ok", "name": "ok2", "tenant": "demo"}`, 400, "already defined"},
		{"POST", "/v1/jobs", strings.Replace(spec("ok", "demo"), `"workers": 1`, `"workers": 0.5`, 1), 400, "workers"},
		{"POST", "/v1/jobs", strings.Replace(spec("ok", "demo"), `"workers": 1`, `"workers": -3`, 1), 400, "workers"},
		{"POST", "/v1/jobs", strings.Replace(spec("ok", "demo"), `"workers": 1`, `"workers": 1e9`, 1), 400, "workers"},
		{"POST", "/v1/jobs", `name: [`, 400, "invalid job spec"},
		// An output secret that would cross a network in clear (the update path validates
		// the same way).
		{"POST", "/v1/jobs", mirrored("ok", "http://hook.example/in"), 400, "output: the output secret would cross the network in clear: http://hook.example would get it as a bearer token over plain HTTP: use https://"},
		{"POST", "/v1/jobs", mirrored("ok", "http://10.1.2.3:8080/in"), 400, "use https://"},
		{"POST", "/v1/jobs", mirrored("ok", "postgres://app@db.example/orders?table=out"), 400, "add sslmode=verify-full"},
		{"POST", "/v1/jobs", mirrored("ok", "postgres://app@db.example/orders?table=out&sslmode=prefer"), 400, "sslmode=prefer may send the role's password unencrypted"},
		{"POST", "/v1/jobs", mirrored("ok", "nats://nats.example:4222/out"), 400, "add ?tls=true"},
		{"POST", "/v1/jobs/demo-job/update", `{"spec": ` + strconv.Quote(mirrored("demo-job", "nats://nats.example:4222/out")) + `}`, 400, "add ?tls=true"},
		// Methods and paths.
		{"DELETE", "/v1/jobs/demo-job", ``, 405, "takes GET"},
		{"PUT", "/v1/tenants", ``, 405, "takes GET or POST"},
		{"GET", "/v1/jobs/demo-job/kill", ``, 405, "takes POST"},
		{"GET", "/v1/nope", ``, 404, "no such API path"},
		{"POST", "/v2/jobs", `{}`, 404, "no such API path"},
		{"GET", "/v1/jobs/demo-job/scale/x", ``, 404, "no such API path"},
	}
	for _, c := range cases {
		status, body, _ := f.raw(t, c.method, c.target, f.admin, []byte(c.body))
		var eb api.ErrorBody
		if status != c.status || json.Unmarshal([]byte(body), &eb) != nil || !strings.Contains(eb.Error, c.says) {
			t.Errorf("%s %s %.60q: %d %s; want %d saying %q", c.method, c.target, c.body, status, strings.TrimSpace(body), c.status, c.says)
		}
	}
	for _, target := range []string{"/v1/jobs", "/v1/tenants", "/v1/jobs/demo-job/scale", "/v1/dcs/dc-a/fail"} {
		status, body, _ := f.raw(t, "POST", target, f.admin, huge)
		if status != http.StatusRequestEntityTooLarge {
			t.Errorf("POST %s with %d bytes: %d %.200s; want 413", target, len(huge), status, body)
		}
	}
	if after := dump(f.tc.Ctx, t, f.tc.Admin); !maps.Equal(before, after) {
		t.Fatalf("the probes changed the store:\n%s", diffDumps(before, after))
	}
}

// TestAPITenantIsolation: tenant other's token, through every route and with every way of
// writing tenant demo's job name that decodes to it, neither reads nor changes demo's job,
// nor anything an admin alone may change.
func TestAPITenantIsolation(t *testing.T) {
	f := newAPIFixture(t)
	before := f.settled(t)
	other := f.tokens["other"]
	// Encodings that decode to demo's job name: the decoded name is what is authorized.
	encodings := []string{"demo-job", "demo%2Djob", "%64%65%6d%6f%2d%6a%6f%62"}
	for _, pattern := range f.patterns {
		for _, name := range encodings {
			method, target := fill(pattern, name)
			if strings.Contains(pattern, "{id}") {
				target = strings.Replace(target, name, url.PathEscape("dc-a-r1-n1"), 1)
			}
			if strings.Contains(pattern, "{dc}") {
				target = strings.Replace(target, name, "dc-a", 1)
			}
			if strings.Contains(pattern, "/tenants/{name}") {
				target = strings.Replace(target, name, "demo", 1)
			}
			body := bodyFor(method, target)
			if pattern == "POST /v1/jobs" {
				body = []byte(`{"name": "sneak", "tenant": "demo", "workers": 1, "resources": {"memory": "64Mi", "cpu": 0.1}, "command": ["sleep", "1"]}`)
			}
			if pattern == "POST /v1/tenants" {
				body = []byte(`{"name": "sneak"}`)
			}
			status, answer, _ := f.raw(t, method, target, other, body)
			switch {
			case pattern == "GET /v1/images/shared":
				// The admin's list: a tenant's token is refused (it is no list of a tenant's).
				if status != http.StatusForbidden {
					t.Errorf("%s %s as tenant other: %d %.300s; want 403", method, target, status, answer)
				}
			case method == http.MethodGet && !strings.Contains(pattern, "{"):
				// Lists: answered, and nothing of tenant demo in them.
				if status != http.StatusOK || strings.Contains(answer, "demo-job") || strings.Contains(answer, `"demo"`) {
					t.Errorf("%s %s as tenant other: %d %.300s", method, target, status, answer)
				}
			case pattern == "GET /v1/health":
			default:
				if status != http.StatusForbidden {
					t.Errorf("%s %s as tenant other: %d %.300s; want 403", method, target, status, answer)
				}
			}
		}
	}
	// Its own job it may read and change.
	if status, body, _ := f.raw(t, "GET", "/v1/jobs/other-job", other, nil); status != http.StatusOK {
		t.Errorf("tenant other reading its own job: %d %s", status, body)
	}
	if after := dump(f.tc.Ctx, t, f.tc.Admin); !maps.Equal(before, after) {
		t.Fatalf("another tenant's requests changed the store:\n%s", diffDumps(before, after))
	}
}

// TestAPIQuotaUnderRacingSubmitsAndScales: submits and scales of one tenant's jobs, all at
// once through the API, never take the tenant past its quota.
func TestAPIQuotaUnderRacingSubmitsAndScales(t *testing.T) {
	f := newAPIFixture(t) // demo: quota 6, demo-job with 2 workers
	const racers = 12
	var wg sync.WaitGroup
	statuses := make(chan int, 2*racers)
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				var status int
				if i%2 == 0 {
					body := fmt.Sprintf(`{"name": "race-%d", "tenant": "demo", "workers": 2, "resources": {"memory": "64Mi", "cpu": 0.1}, "command": ["sleep", "1"]}`, i)
					status, _, _ = f.raw(t, "POST", "/v1/jobs", f.tokens["demo"], []byte(body))
				} else {
					status, _, _ = f.raw(t, "POST", "/v1/jobs/demo-job/scale", f.tokens["demo"], fmt.Appendf(nil, `{"workers": %d}`, 2+i))
				}
				if status == http.StatusServiceUnavailable { // busy: the client tries again
					continue
				}
				statuses <- status
				return
			}
		}()
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != http.StatusOK && s != http.StatusCreated && s != http.StatusForbidden {
			t.Errorf("a racing request got %d", s)
		}
	}
	names, err := f.tc.Admin.Children(f.tc.Ctx, cluster.JobsKey)
	if err != nil {
		t.Fatal(err)
	}
	used := 0
	for _, name := range names {
		rec, _, err := desired.ReadJob(f.tc.Ctx, f.tc.Admin, name)
		if err == nil && rec.Spec.Tenant == "demo" {
			used += rec.Spec.TotalWorkers()
		}
	}
	if used > 6 {
		t.Fatalf("tenant demo uses %d workers, over its quota of 6", used)
	}
	t.Logf("tenant demo ends at %d of 6 workers", used)
}

// TestAPIRateLimitsFailedTokens: an address that keeps presenting bad tokens is answered 429
// before any check once it used up its failures, and the refusals are counted.
func TestAPIRateLimitsFailedTokens(t *testing.T) {
	f := newAPIFixture(t)
	limited := 0
	for i := range api.AuthFailBurst + 5 {
		status, body, hdr := f.raw(t, "GET", "/v1/jobs", fmt.Sprintf("sdt_guess%d", i), nil)
		switch status {
		case http.StatusUnauthorized:
		case http.StatusTooManyRequests:
			limited++
			if hdr.Get("Retry-After") == "" || !strings.Contains(body, "too many failed token checks") {
				t.Errorf("429 without Retry-After or reason: %v %s", hdr, body)
			}
		default:
			t.Fatalf("guess %d: %d %s", i, status, body)
		}
	}
	if limited < 5 {
		t.Fatalf("%d of %d guesses limited; want the ones past the burst of %d", limited, api.AuthFailBurst+5, api.AuthFailBurst)
	}
	// A valid token from the same address is still served: one client's guesses do not
	// lock out the others behind its address.
	if status, body, _ := f.raw(t, "GET", "/v1/jobs", f.tokens["demo"], nil); status != http.StatusOK {
		t.Errorf("a valid token from a limited address: %d %s", status, body)
	}
	reg := f.tc.Registry(f.m)
	if got := testenv.Metric(t, reg, "stormdock_master_api_auth_failures_total", map[string]string{"reason": "limited"}); got != float64(limited) {
		t.Errorf("stormdock_master_api_auth_failures_total{reason=limited} = %v, want %d", got, limited)
	}
	if got := testenv.Metric(t, reg, "stormdock_master_api_auth_failures_total", map[string]string{"reason": "invalid"}); got != api.AuthFailBurst {
		t.Errorf("stormdock_master_api_auth_failures_total{reason=invalid} = %v, want %d", got, api.AuthFailBurst)
	}
}

// jsonLines decodes the JSON log lines a handler wrote.
func jsonLines(text string) []map[string]any {
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// TestAuditLogsEveryChangeOnce: each call that changes something (or tries to) gives exactly
// one audit line with principal, action, object, result and remote address; reads give none.
func TestAuditLogsEveryChangeOnce(t *testing.T) {
	tc := clustertest.NewSim(t)
	var logs testenv.Buffer
	m, err := master.New(tc.Connect(-1), master.Config{ID: "m1", Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(tc.Ctx)
	defer cancel()
	go func() { _ = m.Run(ctx) }()
	srv := httptest.NewServer(httpapi.New(m, httpapi.Config{}))
	defer srv.Close()
	f := &apiFixture{tc: tc, m: m, srv: srv}
	f.admin = api.NewToken()
	if _, err := tc.Admin.Create(tc.Ctx, cluster.AdminTokenKey, []byte(api.HashToken(f.admin)), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the master answers", testenv.Timeout(5*time.Second), func() bool {
		status, _, _ := f.raw(t, "GET", "/v1/jobs", f.admin, nil)
		return status == http.StatusOK
	})
	calls := []struct {
		method, target, token, body string
		principal, object, result   string
	}{
		{"POST", "/v1/tenants", f.admin, `{"name": "demo"}`, "admin", "tenant/demo", "ok"},
		{"POST", "/v1/tenants/demo/token", f.admin, ``, "admin", "tenant/demo", "ok"},
		{"POST", "/v1/jobs", f.admin, `{"name": "wc", "tenant": "demo", "workers": 1, "resources": {"memory": "64Mi", "cpu": 0.1}, "command": ["sleep", "1"]}`, "admin", "job/wc", "ok"},
		{"POST", "/v1/jobs/wc/scale", f.admin, `{"workers": 0}`, "admin", "job/wc", "bad_request"},
		{"POST", "/v1/jobs/wc/kill", "", `{}`, "-", "job/wc", "unauthorized"},
		{"POST", "/v1/jobs/..%2Ftenants%2Fdemo/kill", f.admin, `{}`, "-", "", "bad_request"},
		{"GET", "/v1/jobs", f.admin, ``, "", "", ""},
		{"GET", "/v1/jobs/wc", f.admin, ``, "", "", ""},
	}
	for _, c := range calls {
		f.raw(t, c.method, c.target, c.token, []byte(c.body))
	}
	var audit []map[string]any
	for _, l := range jsonLines(logs.String()) {
		if l["msg"] == "audit" {
			audit = append(audit, l)
		}
	}
	want := 0
	for _, c := range calls {
		if c.method != "GET" {
			want++
		}
	}
	if len(audit) != want {
		t.Fatalf("%d audit lines for %d changing calls: %v", len(audit), want, audit)
	}
	i := 0
	for _, c := range calls {
		if c.method == "GET" {
			continue
		}
		a := audit[i]
		i++
		if a["principal"] != c.principal || a["object"] != c.object || a["result"] != c.result ||
			!strings.HasPrefix(fmt.Sprint(a["remote"]), "127.0.0.1:") || !strings.HasPrefix(fmt.Sprint(a["action"]), c.method+" /v1/") {
			t.Errorf("%s %s: audit line %v; want principal %s, object %q, result %s", c.method, c.target, a, c.principal, c.object, c.result)
		}
	}
}

// TestAPITimesAnswers: the API times each answer by route; a blocking query, which waits
// on purpose, is left out. The leader times its reconciles' steps.
func TestAPITimesAnswers(t *testing.T) {
	f := newAPIFixture(t)
	reg := f.tc.Registry(f.m)
	route := map[string]string{"route": "GET /v1/jobs"}
	before := testenv.Metric(t, reg, "stormdock_master_api_request_duration_seconds", route)
	for range 3 {
		if status, body, _ := f.raw(t, "GET", "/v1/jobs", f.tokens["demo"], nil); status != http.StatusOK {
			t.Fatalf("job list: %d %s", status, body)
		}
	}
	if status, body, _ := f.raw(t, "GET", "/v1/jobs?index=1&wait=10ms", f.tokens["demo"], nil); status != http.StatusOK {
		t.Fatalf("blocking job list: %d %s", status, body)
	}
	if got := testenv.Metric(t, reg, "stormdock_master_api_request_duration_seconds", route) - before; got != 3 {
		t.Errorf("job list answers timed: %v, want 3 (the blocking query left out)", got)
	}
	if got := testenv.Metric(t, reg, "stormdock_master_reconcile_phase_seconds_total", map[string]string{"phase": "plan"}); got <= 0 {
		t.Errorf("the leader's planning timed %vs, want more than 0", got)
	}
}
