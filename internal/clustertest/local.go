package clustertest

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/daemon"
	"github.com/stormdock/stormdock/internal/testenv"
)

// Local is a local cluster in the test's process (daemon.StartLocal: a master and real
// agents on the embedded store, workers real processes) with an admin client.
type Local struct {
	*daemon.Local
	T testing.TB
	// DataDir is the cluster's data directory (store, admin token, certificates).
	DataDir string
	// SinkDir is the cluster's sink dir (a temporary directory unless cfg says otherwise): a
	// mirrored job's file sink goes below SinkDir/<tenant>/ (SinkPath).
	SinkDir string
	// Token is the admin token; Client an admin client of the cluster's master.
	Token  string
	Client *api.Client
}

// localPorts is where the next local cluster of this process starts its agents' port
// ranges (localPortBase).
var localPorts struct {
	sync.Mutex
	next int
}

// localPortBase gives a local cluster of nodes nodes (100 ports each) ports no other local
// cluster of this process is given, between `stormdock up`'s own (6700 on, six nodes) and
// the process clusters' (10000 on, procs.go): two local clusters on the same ports raced
// for them (CI saw a word count's metrics port taken: "1 of 2 running workers report
// input_backlog" for nine minutes).
func localPortBase(nodes int) int {
	const first, end = 7300, 10000
	localPorts.Lock()
	defer localPorts.Unlock()
	if localPorts.next == 0 || localPorts.next+100*nodes > end {
		localPorts.next = first
	}
	base := localPorts.next
	localPorts.next += 100 * nodes
	return base
}

// StartLocal starts a local cluster of cfg.Nodes nodes whose workers run binary (the
// stormdock binary: the lease launcher, `stormdock worker`, output routers), logging the
// cluster's warnings into the test's log, and waits until every node is registered. The
// cluster is closed when the test ends.
func StartLocal(t testing.TB, binary string, cfg daemon.LocalConfig) *Local {
	t.Helper()
	cfg.DataDir = filepath.Join(t.TempDir(), "data")
	if cfg.API == "" {
		cfg.API = "127.0.0.1:0"
	}
	cfg.Self = binary
	if cfg.PortBase == 0 {
		cfg.PortBase = localPortBase(cmp.Or(cfg.Nodes, 12)) // daemon.LocalConfig's default: 12 nodes
	}
	if cfg.SinkDir == "" {
		// A directory of the test's own that the routers' uids can reach (not
		// daemon.RootSinkDir, which every local cluster run as root shares).
		dir, err := os.MkdirTemp("", "stormdock-sinks-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		cfg.SinkDir = dir
	}
	if cfg.Logger == nil {
		cfg.Logger = testenv.Logger(t, slog.LevelWarn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(60*time.Second))
	defer cancel()
	lc, err := daemon.StartLocal(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(2*time.Minute))
		defer cancel()
		_ = lc.Close(ctx)
	})
	tok, err := os.ReadFile(lc.TokenPath())
	if err != nil {
		t.Fatal(err)
	}
	sinkDir := cfg.SinkDir
	switch sinkDir {
	case "off":
		sinkDir = ""
	}
	l := &Local{Local: lc, T: t, DataDir: cfg.DataDir, SinkDir: sinkDir, Token: strings.TrimSpace(string(tok))}
	if l.Client, err = api.NewClient(lc.API(), l.Token); err != nil {
		t.Fatal(err)
	}
	nodes := cfg.Nodes
	testenv.Eventually(t, fmt.Sprintf("%d local nodes", nodes), 60*time.Second, func() bool {
		ns, err := l.Client.Nodes(context.Background())
		return err == nil && len(ns) == nodes
	})
	return l
}

// SinkPath is where a file sink of tenant named name goes: SinkDir/<tenant>/name.
func (l *Local) SinkPath(tenant, name string) string { return filepath.Join(l.SinkDir, tenant, name) }

// StoreURL is the cluster's embedded store, which another master in this process shares.
func (l *Local) StoreURL() string { return "file://" + filepath.Join(l.DataDir, "store.json") }

// Submit submits a job spec through the admin client.
func (l *Local) Submit(spec string) {
	l.T.Helper()
	if _, err := l.Client.SubmitJob(context.Background(), []byte(spec)); err != nil {
		l.T.Fatalf("submit: %v\n%s", err, spec)
	}
}

// WaitRunning waits until the job runs n workers and none is stopping.
func (l *Local) WaitRunning(job string, n int) {
	l.T.Helper()
	WaitRunning(l.T, l.Client, job, n)
}

// WaitRunning waits until the master cl talks to reports job running n workers and none
// stopping.
func WaitRunning(t testing.TB, cl *api.Client, job string, n int) {
	t.Helper()
	testenv.EventuallyWith(t, fmt.Sprintf("job %s running %d workers", job, n), 90*time.Second, func() (bool, string) {
		st, err := cl.Job(context.Background(), job)
		if err != nil {
			return false, err.Error()
		}
		return st.Summary.Running == n && st.Summary.Stopping == 0, fmt.Sprintf("%+v", st.Summary)
	})
}
