package job

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/agents/sim"
	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master/httpapi"
)

// jobRead is one GET of a job the CLI made: the index it sent (0: none) and the one it got.
type jobRead struct {
	sent, got uint64
	took      time.Duration
}

// waitCluster is a master on simulated nodes whose workers take a moment to start and stop,
// its API behind a recorder of the CLI's reads of jobs, and the admin token.
type waitCluster struct {
	url, token string
	mu         sync.Mutex
	reads      []jobRead
}

func newWaitCluster(t *testing.T, stripIndex bool) *waitCluster {
	t.Helper()
	tc := clustertest.NewSim(t)
	m, _, _ := tc.Master("m1")
	for _, n := range clustertest.Nodes(3, 1, 1) {
		tc.Agent(n, sim.Config{Behavior: sim.Behavior{Start: 150 * time.Millisecond, Stop: 150 * time.Millisecond}})
	}
	testenv.Eventually(t, "the master sees 3 nodes", 5*time.Second, func() bool { return len(m.NodeEntries()) == 3 })
	h := httpapi.New(m, httpapi.Config{})
	wc := &waitCluster{token: tc.AdminToken()}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !strings.HasPrefix(r.URL.Path, "/v1/jobs/") {
			h.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		sent, _ := strconv.ParseUint(r.URL.Query().Get("index"), 10, 64)
		if stripIndex {
			// A master from before blocking queries: no index, and none taken.
			q := r.URL.Query()
			q.Del("index")
			q.Del("wait")
			r.URL.RawQuery = q.Encode()
			w = &noIndex{ResponseWriter: w}
		}
		h.ServeHTTP(w, r)
		got, _ := strconv.ParseUint(w.Header().Get(api.IndexHeader), 10, 64)
		wc.mu.Lock()
		wc.reads = append(wc.reads, jobRead{sent: sent, got: got, took: time.Since(start)})
		wc.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	wc.url = srv.URL
	cl, _ := api.NewClient(srv.URL, wc.token)
	if err := cl.CreateTenant(tc.Ctx, cluster.Tenant{Name: "demo"}); err != nil {
		t.Fatal(err)
	}
	return wc
}

// noIndex drops the index header, as a master from before blocking queries answers.
type noIndex struct{ http.ResponseWriter }

func (n *noIndex) WriteHeader(code int) {
	n.Header().Del(api.IndexHeader)
	n.ResponseWriter.WriteHeader(code)
}

// run runs `stormdock job ARGS...` against the cluster and returns its output, exit code and
// the reads of jobs it made.
func (wc *waitCluster) run(t *testing.T, args ...string) (string, int, []jobRead) {
	t.Helper()
	wc.mu.Lock()
	wc.reads = nil
	wc.mu.Unlock()
	var out bytes.Buffer
	app := &cli.App{Name: "stormdock", Writer: &out, ErrWriter: &out, Commands: []*cli.Command{Command},
		ExitErrHandler: func(*cli.Context, error) {}}
	// urfave/cli takes flags before the arguments only (the binary reorders them: tools.App).
	argv := []string{"stormdock", "job", args[0], "--master", wc.url, "--token", wc.token}
	err := app.Run(append(argv, args[1:]...))
	code := 0
	var ec cli.ExitCoder
	switch {
	case errors.As(err, &ec):
		code = ec.ExitCode()
		out.WriteString(err.Error() + "\n")
	case err != nil:
		t.Fatalf("job %v: %v", args, err)
	}
	wc.mu.Lock()
	defer wc.mu.Unlock()
	return out.String(), code, wc.reads
}

func specFile(t *testing.T, name string, workers int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name+".yaml")
	spec := "name: " + name + "\ntenant: demo\nworkers: " + strconv.Itoa(workers) +
		"\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [sleep, '1000']\nupdate: {minHealthy: 200ms}\n"
	if err := os.WriteFile(p, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// followsIndexes checks that a --wait read the job by blocking queries: each read after the
// first sent the index the one before it got, and each came back with a greater one (a
// change: a read that polled would come back with the same).
func followsIndexes(t *testing.T, what string, reads []jobRead) {
	t.Helper()
	if len(reads) == 0 {
		t.Fatalf("%s: no read of the job", what)
	}
	for i, r := range reads {
		switch {
		case r.got == 0:
			t.Errorf("%s: read %d got no index", what, i)
		case i > 0 && r.sent != reads[i-1].got:
			t.Errorf("%s: read %d sent index %d, the read before got %d", what, i, r.sent, reads[i-1].got)
		case i > 0 && r.got <= r.sent:
			t.Errorf("%s: read %d sent %d and got %d after %s: answered without a change", what, i, r.sent, r.got, r.took)
		}
	}
}

// TestWaitsByBlockingQueries: `job submit --wait`, `job scale --wait`, `job restart --wait`
// (a rollout) and `job kill --wait` print what they always did and exit 0, and read the job
// by blocking queries: one read per change, not one per poll.
func TestWaitsByBlockingQueries(t *testing.T) {
	wc := newWaitCluster(t, false)
	spec := specFile(t, "web", 2)
	for _, c := range []struct {
		args  []string
		lines []string // regular expressions, one per line of output
	}{
		{[]string{"submit", "--wait", spec}, []string{
			`^job web submitted: 2 workers for tenant demo$`,
			`^web: [0-2]/2 running$`,
			`^web: all 2 workers running after [0-9.]+m?s$`}},
		{[]string{"scale", "--workers", "3", "--wait", "web"}, []string{
			`^job web scaled to 3 workers$`,
			`^web: [0-3]/3 running$`,
			`^web: all 3 workers running after [0-9.]+m?s$`}},
		{[]string{"restart", "--wait", "web"}, []string{
			`^job web: rolling restart \(rollout 1\) of 3 workers, by worker, 1 at a time$`,
			`^[0-9.]+m?s rollout 1 `,
			`^job web: every worker on generation 1 after [0-9.]+m?s$`}},
		{[]string{"kill", "--wait", "web"}, []string{
			`^job web killed: workers stop within 10s$`,
			`^job web: every worker stopped$`}},
	} {
		what := "job " + strings.Join(c.args, " ")
		start := time.Now()
		out, code, reads := wc.run(t, c.args...)
		t.Logf("%s: %s, %d reads", what, time.Since(start), len(reads))
		if code != 0 {
			t.Fatalf("%s: exit %d:\n%s", what, code, out)
		}
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		// Progress lines come as the job changes: the first and the last are what they
		// are, those between are of the second's form.
		if len(lines) < len(c.lines)-1 {
			t.Fatalf("%s:\n%s\nwant lines like %q", what, out, c.lines)
		}
		for i, line := range lines {
			re := c.lines[min(i, len(c.lines)-2)]
			if i == len(lines)-1 {
				re = c.lines[len(c.lines)-1]
			}
			if !regexp.MustCompile(re).MatchString(line) {
				t.Errorf("%s: line %d is %q, want %s\n%s", what, i+1, line, re, out)
			}
		}
		followsIndexes(t, what, reads)
	}
}

// TestWaitWithoutIndexes: against a master that gives no index (from before blocking
// queries), --wait polls, with the same output.
func TestWaitWithoutIndexes(t *testing.T) {
	wc := newWaitCluster(t, true)
	out, code, reads := wc.run(t, "submit", "--wait", specFile(t, "web", 2))
	if code != 0 || !regexp.MustCompile(`(?m)^web: all 2 workers running after [0-9.]+m?s$`).MatchString(out) {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for i, r := range reads {
		if r.sent != 0 || r.got != 0 {
			t.Fatalf("read %d sent index %d and got %d from a master that gives none", i, r.sent, r.got)
		}
	}
	if len(reads) < 2 {
		t.Fatalf("%d reads: the wait did not poll", len(reads))
	}
}

// TestWaitTimesOut: a --wait that gives up says why, exit 1, though its last blocking query
// was cut short by the timeout.
func TestWaitTimesOut(t *testing.T) {
	wc := newWaitCluster(t, false)
	// More workers than the nodes' 12 slots: some stay unplaced.
	out, code, _ := wc.run(t, "submit", "--wait", "--timeout", "1s", specFile(t, "big", 14))
	want := regexp.MustCompile(`(?m)^stormdock: job big: 12 of 14 workers running after 1s; worker 1[23] unplaced: `)
	if code != 1 || !want.MatchString(out) {
		t.Fatalf("exit %d, want 1 and %s:\n%s", code, want, out)
	}
}
