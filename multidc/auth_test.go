package multidc

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/internal/testenv"
)

// snapshot is what a request could change of a router: what it delivered, what each link
// produced and holds, whether each link is alive, and the sink's size.
func snapshot(t testing.TB, tr *testRouter) string {
	t.Helper()
	st, err := tr.Status()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "active=%s delivered=%d failovers=%d", st.Active, st.Delivered, st.Failovers)
	for _, l := range st.Links {
		fmt.Fprintf(&b, " %s:produced=%d,buffered=%d,alive=%v,workers=%d/%d", l.Link, l.LastProduced, l.Buffered, l.Alive, l.WorkersAlive, l.Workers)
	}
	fi, err := os.Stat(tr.path)
	if err == nil {
		fmt.Fprintf(&b, " sink=%d", fi.Size())
	}
	return b.String()
}

// settle waits until the router's deliveries stop changing what it holds.
func settle(t testing.TB, tr *testRouter) {
	last := snapshot(t, tr)
	for range 500 {
		time.Sleep(2 * time.Millisecond)
		s := snapshot(t, tr)
		if s == last {
			return
		}
		last = s
	}
	t.Fatalf("the router never settled: %s", last)
}

// TestRouterRefusesOtherSenders: records, heartbeats and failovers without the job's sender
// token, or with another job's, are answered 401 and change nothing; the job's own token
// is taken. An address that keeps trying is limited.
func TestRouterRefusesOtherSenders(t *testing.T) {
	_, store := embeddedStore(t)
	tr := startRouter(t, store, []string{"dc-a", "dc-b"}, nil)
	waitReady(t, tr.URL())
	key := []byte("0123456789abcdef0123456789abcdef")
	otherJob := SenderToken(key, "other-job", time.Now())
	before := snapshot(t, tr)
	record := `{"offset":0,"link":"dc-a","worker":0,"workers":1}`
	h := tr.Handler()
	i := 0
	for _, c := range []struct{ name, token string }{
		{"no token", ""},
		{"another job's token", otherJob},
		{"garbage", "sdo_garbage"},
		{"the token's hash", testTokenHash},
	} {
		for _, path := range []string{"/v1/records?link=dc-a&worker=0", "/", "/v1/heartbeat?link=dc-a&worker=0&workers=1", "/v1/failover?to=dc-a"} {
			req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(record))
			req.RemoteAddr = fmt.Sprintf("10.0.0.%d:1000", i) // each from its own address: no limit
			i++
			if c.token != "" {
				req.Header.Set("Authorization", "Bearer "+c.token)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), "sender token") {
				t.Errorf("%s to %s: %d %s; want 401", c.name, path, w.Code, w.Body)
			}
		}
	}
	if after := snapshot(t, tr); after != before {
		t.Fatalf("refused requests changed the router:\n before %s\n after  %s", before, after)
	}
	// The limit: an address gets api.AuthFailBurst failures, then waits.
	var code int
	var body string
	for range api.AuthFailBurst + 1 {
		code, body = postAs(t, tr.URL()+"/v1/records?link=dc-a", record, "sdo_guess")
	}
	if code != http.StatusTooManyRequests || !strings.Contains(body, "too many failed token checks") {
		t.Errorf("after %d failures: %d %s; want 429", api.AuthFailBurst, code, body)
	}
	// The job's own workers behind that address are still served.
	if code, body := post(t, tr.URL()+"/v1/heartbeat?link=dc-a&worker=0&workers=1", ""); code != http.StatusOK {
		t.Errorf("a worker with the job's token from a limited address: %d %s", code, body)
	}
	// Status stays readable without a token: it holds no secret.
	if resp, err := http.Get(tr.URL() + "/v1/status"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("status without a token: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// The job's own workers, from another address, are served.
	other := startRouter(t, store, []string{"dc-a", "dc-b"}, func(c *Config) { c.Job = "other" })
	waitReady(t, other.URL())
	if code, body := post(t, other.URL()+"/v1/records?link=dc-a&worker=0", record); code != http.StatusOK {
		t.Fatalf("the job's token: %d %s", code, body)
	}
	testenv.Eventually(t, "the record delivered", testenv.Timeout(5*time.Second), func() bool {
		// The worker beats on, so that its link is alive when the router chooses one.
		post(t, other.URL()+"/v1/heartbeat?link=dc-a&worker=0&workers=1", "")
		st, _ := other.Status()
		return st.Delivered == 0
	})
}

// FuzzRouterAPI sends arbitrary requests to a router's handler: no 5xx, and a request that
// is refused changes nothing the router holds or delivered.
func FuzzRouterAPI(f *testing.F) {
	for _, s := range []struct {
		line  string
		token bool
		body  string
	}{
		{"POST /v1/records?link=dc-a&worker=0", true, `{"offset":0,"link":"dc-a"}`},
		{"POST /v1/records?link=..%2F..%2Fjobs&worker=0", true, `{"offset":1,"link":"dc-a"}`},
		{"POST /v1/records?link=dc-a", true, "{\"offset\":1.5,\"link\":\"dc-a\"}\n{\"offset\":-1}"},
		{"POST /v1/records?link=dc-a", true, `{"offset":99999999999999999999999,"link":"dc-a"}`},
		{"POST /v1/records?link=dc-a", true, `{"offset":2,"offset":3,"link":"dc-a","link":"dc-b"}`},
		{"POST /", false, `{"offset":4,"link":"dc-b"}`},
		{"POST /v1/heartbeat?link=dc-b&worker=-1&workers=0", true, ``},
		{"POST /v1/heartbeat?link=dc%00b&worker=1e3", true, ``},
		{"POST /v1/failover?to=dc-b&job=..", true, ``},
		{"GET /v1/status", false, ``},
		{"DELETE /v1/records", true, ``},
		{"GET /v1/../../etc/passwd", false, ``},
	} {
		f.Add(s.line, s.token, []byte(s.body))
	}
	_, store := embeddedStore(f)
	// Links stay alive (or not) for the whole run: nothing changes by the clock alone.
	tr := startRouter(f, store, []string{"dc-a", "dc-b"}, func(c *Config) {
		c.Logger = slog.New(slog.DiscardHandler)
		c.Limits = Limits{Window: 64, Bytes: 1 << 20}
		c.HeartbeatTimeout, c.CloseGrace = time.Hour, -1
	})
	waitReady(f, tr.URL())
	h := tr.Handler()
	n := 0
	f.Fuzz(func(t *testing.T, line string, token bool, body []byte) {
		var raw bytes.Buffer
		fmt.Fprintf(&raw, "%s HTTP/1.1\r\nHost: router\r\nContent-Length: %d\r\n", line, len(body))
		if token {
			fmt.Fprintf(&raw, "Authorization: Bearer %s\r\n", testToken)
		}
		raw.WriteString("\r\n")
		raw.Write(body)
		req, err := http.ReadRequest(bufio.NewReader(&raw))
		if err != nil {
			return // net/http refuses it before any handler
		}
		n++
		req.RemoteAddr = fmt.Sprintf("10.%d.%d.%d:1000", n>>16&255, n>>8&255, n&255)
		before := snapshot(t, tr)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code >= 500 && w.Code != http.StatusServiceUnavailable {
			t.Fatalf("%q %q: %d %s", line, body, w.Code, w.Body)
		}
		switch {
		case w.Code < 300:
			settle(t, tr) // what it took is delivered in the background
		case w.Code != http.StatusTooManyRequests: // a 429 may have taken part of a batch
			if after := snapshot(t, tr); after != before {
				t.Fatalf("%q %q refused (%d %s) but changed the router:\n before %s\n after  %s", line, body, w.Code, w.Body, before, after)
			}
		}
	})
}

// TestRouterCutsSlowClients: the router's server cuts a client that trickles its headers.
func TestRouterCutsSlowClients(t *testing.T) {
	t.Parallel()
	_, store := embeddedStore(t)
	tr := startRouter(t, store, []string{"dc-a", "dc-b"}, nil)
	took := testenv.SlowHeaders(t, strings.TrimPrefix(tr.URL(), "http://"), 100*time.Millisecond, testenv.Timeout(api.ReadHeaderTimeout+10*time.Second))
	t.Logf("figure: the router cut a client sending one header byte per 100ms after %s", took.Round(time.Millisecond))
}
