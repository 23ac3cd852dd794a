package multidc

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

// TestRouterLinkTokens: with per-link tokens, a link's workers send records and heartbeats
// for their own link only; the job's own token fails over but sends nothing; another job's
// link token is no token at all. Every refusal changes nothing.
func TestRouterLinkTokens(t *testing.T) {
	_, store := embeddedStore(t)
	key := []byte("0123456789abcdef0123456789abcdef")
	submitted := time.Now()
	links := []string{"dc-a", "dc-b"}
	tok := map[string]string{}
	for _, l := range links {
		tok[l] = LinkSenderToken(key, "wordcount", l, submitted)
	}
	tr := startRouter(t, store, links, func(c *Config) {
		c.LinkTokenHashes = LinkTokenHashes(key, "wordcount", links, submitted)
	})
	waitReady(t, tr.URL())
	if tok["dc-a"] == tok["dc-b"] || tok["dc-a"] == LinkSenderToken(key, "other", "dc-a", submitted) {
		t.Fatal("link tokens are not per job and link")
	}
	h := tr.Handler()
	i := 0
	do := func(path, body, token string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		req.RemoteAddr = fmt.Sprintf("10.0.1.%d:1000", i) // each from its own address: no limit
		i++
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	before := snapshot(t, tr)
	for _, c := range []struct {
		name, path, body, token string
		code                    int
	}{
		{"dc-a's token for dc-b's records (query)", "/v1/records?link=dc-b&worker=0", `{"offset":0}`, tok["dc-a"], http.StatusForbidden},
		{"dc-a's token for dc-b's records (in the record)", "/v1/records?worker=0", `{"offset":0,"link":"dc-b"}`, tok["dc-a"], http.StatusForbidden},
		{"dc-a's token for a batch mixing links", "/v1/records", "{\"offset\":0,\"link\":\"dc-a\"}\n{\"offset\":0,\"link\":\"dc-b\"}", tok["dc-a"], http.StatusForbidden},
		{"dc-a's token, dc-b's heartbeat", "/v1/heartbeat?link=dc-b&worker=0&workers=1", "", tok["dc-a"], http.StatusForbidden},
		{"the job's token sends records", "/v1/records?link=dc-a&worker=0", `{"offset":0}`, testToken, http.StatusForbidden},
		{"the job's token heartbeats", "/v1/heartbeat?link=dc-a&worker=0&workers=1", "", testToken, http.StatusForbidden},
		{"a link's token fails over", "/v1/failover?to=dc-b", "", tok["dc-b"], http.StatusForbidden},
		{"another job's link token", "/v1/records?link=dc-a&worker=0", `{"offset":0}`, LinkSenderToken(key, "other", "dc-a", submitted), http.StatusUnauthorized},
		{"another submission's link token", "/v1/records?link=dc-a&worker=0", `{"offset":0}`, LinkSenderToken(key, "wordcount", "dc-a", submitted.Add(time.Second)), http.StatusUnauthorized},
	} {
		if w := do(c.path, c.body, c.token); w.Code != c.code {
			t.Errorf("%s: %d %s; want %d", c.name, w.Code, w.Body, c.code)
		} else {
			t.Logf("%s: %d %s", c.name, w.Code, strings.TrimSpace(w.Body.String()))
		}
	}
	if after := snapshot(t, tr); after != before {
		t.Fatalf("refused requests changed the router:\n before %s\n after  %s", before, after)
	}
	// Each link with its own token is served, the link taken from the token when the
	// request names none.
	if w := do("/v1/records?link=dc-a&worker=0", `{"offset":0}`, tok["dc-a"]); w.Code != http.StatusOK {
		t.Errorf("dc-a's records with dc-a's token: %d %s", w.Code, w.Body)
	}
	if w := do("/v1/records?worker=0", `{"offset":0}`, tok["dc-b"]); w.Code != http.StatusOK {
		t.Errorf("records with dc-b's token, no link named: %d %s", w.Code, w.Body)
	}
	if w := do("/v1/heartbeat?link=dc-b&worker=0&workers=1", "", tok["dc-b"]); w.Code != http.StatusOK {
		t.Errorf("dc-b's heartbeat with its token: %d %s", w.Code, w.Body)
	}
	st, _ := tr.Status()
	for _, l := range st.Links {
		if l.LastProduced != 0 {
			t.Errorf("link %s produced up to %d, want 0", l.Link, l.LastProduced)
		}
	}
	// The master's failover call (the job's token) still gets through the check.
	if w := do("/v1/failover?to=dc-b", "", testToken); w.Code == http.StatusUnauthorized || w.Code == http.StatusForbidden {
		t.Errorf("failover with the job's token: %d %s", w.Code, w.Body)
	}
}

// TestRouterBodyBound: a sender posting 64 MiB gets 413 and the router does not hold it:
// its heap grows by far less than the body.
func TestRouterBodyBound(t *testing.T) {
	_, store := embeddedStore(t)
	tr := startRouter(t, store, []string{"dc-a", "dc-b"}, nil)
	waitReady(t, tr.URL())
	const size = 64 << 20
	line := `{"offset":0,"link":"dc-a","pad":"` + strings.Repeat("x", 1000) + "\"}\n"
	body := func() io.Reader {
		// Streamed, without a length: the router must stop reading, not trust a header.
		pr, pw := io.Pipe()
		go func() {
			chunk := []byte(strings.Repeat(line, 64))
			for n := 0; n < size; n += len(chunk) {
				if _, err := pw.Write(chunk); err != nil {
					return
				}
			}
			pw.Close()
		}()
		return pr
	}
	before := testenv.LiveHeap()
	for _, withLength := range []bool{false, true} {
		var req *http.Request
		var err error
		if withLength {
			req, err = http.NewRequest(http.MethodPost, tr.URL()+"/v1/records?link=dc-a&worker=0", io.LimitReader(body(), size))
			req.ContentLength = size
		} else {
			req, err = http.NewRequest(http.MethodPost, tr.URL()+"/v1/records?link=dc-a&worker=0", body())
		}
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			// The router may close the connection before the client has sent everything.
			t.Logf("length=%v: %v", withLength, err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge || strings.Count(strings.TrimSpace(string(b)), "\n") > 0 {
			t.Errorf("length=%v: %d %s; want 413 with a one-line error", withLength, resp.StatusCode, b)
		}
		t.Logf("length=%v: %d %s", withLength, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	after := testenv.LiveHeap()
	grew := int64(after) - int64(before)
	t.Logf("heap before %d, after %d: grew %d bytes for two %d-byte bodies (limit %d)", before, after, grew, size, DefaultMaxBody)
	// The router reads at most its limit of a body; what it kept is far below that.
	if grew > DefaultMaxBody {
		t.Errorf("heap grew by %d bytes, more than the body limit %d", grew, DefaultMaxBody)
	}
	st, _ := tr.Status()
	for _, l := range st.Links {
		if l.Buffered != 0 || l.LastProduced >= 0 {
			t.Errorf("link %s holds %d records (last produced %d) of a refused body", l.Link, l.Buffered, l.LastProduced)
		}
	}
}
