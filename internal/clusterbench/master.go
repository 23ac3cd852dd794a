package clusterbench

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/daemon"
	"github.com/stormdock/stormdock/master/jobmetrics"
)

// master is the master under test: in this process, or a process of its own whose memory
// and cpu time are its alone.
type master struct {
	url   string
	token string
	// scrape is the scrape token, which /metrics wants (the admin token would do too: the
	// benchmark reads the figures as Prometheus would).
	scrape string
	pid    int // 0 for a master in this process
	once   sync.Once
	halt   func() error
}

// stop stops the master; later calls do nothing.
func (m *master) stop() error {
	var err error
	m.once.Do(func() { err = m.halt() })
	return err
}

// startMaster runs a master on the store at storeURL with its data in dir. Its API is on
// loopback on purpose: the bench's pollers and simulated agents are in this process, and the
// agents reach the master only through the store, which may be anywhere.
// With pin, the master's process runs on pin's master core.
func startMaster(ctx context.Context, cfg Config, storeURL, dir string, pin *pinning) (*master, error) {
	if cfg.MasterBinary == "" {
		return startInProcess(ctx, cfg, storeURL, dir)
	}
	logFile, err := os.Create(filepath.Join(dir, "master.log"))
	if err != nil {
		return nil, err
	}
	args := []string{"master", "--store", storeURL, "--api", "127.0.0.1:0", "--data", dir,
		"--session-timeout", cfg.SessionTimeout.String(), "--reregister-grace", masterGrace.String()}
	switch {
	case cfg.MetricsInterval < 0:
		args = append(args, "--metrics-interval", "0")
	case cfg.MetricsInterval > 0:
		args = append(args, "--metrics-interval", cfg.MetricsInterval.String())
	}
	for _, f := range [][2]string{{"--store-ca", cfg.StoreTLS.CA}, {"--store-cert", cfg.StoreTLS.Cert}, {"--store-key", cfg.StoreTLS.Key}, {"--memory-limit", cfg.MasterMemoryLimit}} {
		if f[1] != "" {
			args = append(args, f[0], f[1])
		}
	}
	cmd := exec.Command(cfg.MasterBinary, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), "STORMDOCK_STORE=")
	start := cmd.Start
	if pin != nil {
		start = func() error { return pin.start(cmd) }
	}
	if err := start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start master %s: %w", cfg.MasterBinary, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logFile.Close() }()
	m := &master{pid: cmd.Process.Pid}
	m.halt = func() error {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		return nil
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		u, uerr := os.ReadFile(filepath.Join(dir, api.URLFile))
		t, terr := os.ReadFile(filepath.Join(dir, api.AdminTokenFile))
		// The master writes its URL's file after both tokens'.
		sc, serr := os.ReadFile(filepath.Join(dir, api.MetricsTokenFile))
		if uerr == nil && terr == nil && serr == nil && len(u) > 0 && len(t) > 0 {
			m.url, m.token, m.scrape = strings.TrimSpace(string(u)), strings.TrimSpace(string(t)), strings.TrimSpace(string(sc))
			return m, nil
		}
		select {
		case err := <-exited:
			return nil, fmt.Errorf("master exited: %v (see %s)", err, filepath.Join(dir, "master.log"))
		case <-ctx.Done():
			m.stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			m.stop()
			return nil, fmt.Errorf("master wrote no %s within a minute (see %s)", api.URLFile, filepath.Join(dir, "master.log"))
		}
	}
}

// masterGrace is the master's re-register grace: it waits this long after it starts
// leading before it moves the workers of nodes it does not see. The benchmark's cluster is
// new; the grace only delays the first plan.
const masterGrace = time.Second

func startInProcess(ctx context.Context, cfg Config, storeURL, dir string) (*master, error) {
	logFile, err := os.Create(filepath.Join(dir, "master.log"))
	if err != nil {
		return nil, err
	}
	log := slog.New(slog.NewTextHandler(logFile, nil))
	dm, err := daemon.NewMaster(ctx, daemon.MasterConfig{Store: storeURL, StoreOptions: coord.Options{SessionTimeout: cfg.SessionTimeout, TLS: cfg.StoreTLS},
		Listen: "127.0.0.1:0", DataDir: dir, ReregisterGrace: masterGrace, Logger: log, Metrics: jobmetrics.Config{Interval: cfg.MetricsInterval}})
	if err != nil {
		logFile.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- dm.Run(rctx) }()
	token, err := os.ReadFile(dm.TokenPath())
	var scrape []byte
	if err == nil {
		scrape, err = os.ReadFile(dm.MetricsTokenPath())
	}
	if err != nil {
		cancel()
		<-done
		dm.Close()
		logFile.Close()
		return nil, err
	}
	return &master{url: dm.URL(), token: strings.TrimSpace(string(token)), scrape: strings.TrimSpace(string(scrape)), halt: func() error {
		cancel()
		err := <-done
		dm.Close()
		logFile.Close()
		return err
	}}, nil
}

// usage is a process's resident memory high-water mark and cpu time so far.
type usage struct {
	peakRSS int64 // bytes
	rss     int64 // bytes, now
	cpu     time.Duration
}

// procUsage reads pid's usage (0: this process) from /proc.
func procUsage(pid int) (usage, error) {
	dir := "/proc/self"
	if pid != 0 {
		dir = "/proc/" + strconv.Itoa(pid)
	}
	var u usage
	f, err := os.Open(filepath.Join(dir, "status"))
	if err != nil {
		return u, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			u.peakRSS = kb << 10
		}
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			u.rss = kb << 10
		}
	}
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return u, err
	}
	// Fields after the command's closing parenthesis; utime and stime are the 14th and 15th
	// of the line, in clock ticks (100 per second on Linux).
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return u, errors.New("unreadable " + dir + "/stat")
	}
	f2 := strings.Fields(string(stat)[i+1:])
	if len(f2) < 13 {
		return u, errors.New("short " + dir + "/stat")
	}
	ut, _ := strconv.ParseInt(f2[11], 10, 64)
	st, _ := strconv.ParseInt(f2[12], 10, 64)
	u.cpu = time.Duration(ut+st) * 10 * time.Millisecond
	return u, nil
}

// The master's series the benchmark reads.
const (
	reconcileCount = "stormdock_master_reconcile_duration_seconds_count"
	reconcileSum   = "stormdock_master_reconcile_duration_seconds_sum"
	reconcileCPU   = "stormdock_master_reconcile_cpu_seconds_total"
	reconcilePhase = "stormdock_master_reconcile_phase_seconds_total"
	apiRequests    = "stormdock_master_api_request_duration_seconds_bucket"
)

// serverQuantile is the q-quantile, in milliseconds, of how long the master took to answer
// route between two scrapes, from its histogram's buckets (interpolated within a bucket, as
// Prometheus' histogram_quantile does); 0 when it answered none.
func serverQuantile(before, after map[string]float64, route string, q float64) float64 {
	type bucket struct{ le, n float64 }
	var bs []bucket
	prefix := apiRequests + "|" + route + "|"
	for k, v := range after {
		les, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		le, err := strconv.ParseFloat(les, 64)
		if les == "+Inf" {
			le, err = math.Inf(1), nil
		}
		if err == nil {
			bs = append(bs, bucket{le, v - before[k]})
		}
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	if len(bs) == 0 || bs[len(bs)-1].n == 0 {
		return 0
	}
	rank := q * bs[len(bs)-1].n
	lo, below := 0.0, 0.0
	for _, b := range bs {
		if b.n >= rank {
			if math.IsInf(b.le, 1) {
				return lo * 1000 // beyond the last bound: the last bound is all that is known
			}
			return (lo + (b.le-lo)*(rank-below)/max(b.n-below, 1)) * 1000
		}
		lo, below = b.le, b.n
	}
	return lo * 1000
}

var metricNames = []string{reconcileCount, reconcileSum, reconcileCPU,
	"stormdock_master_job_metrics_round_seconds_count", "stormdock_master_job_metrics_round_seconds_sum",
	"stormdock_master_job_metrics_series", "stormdock_master_job_metrics_history_bytes"}

// masterMetrics reads the master's series the benchmark uses from its /metrics, with the
// scrape token (the node failures summed over their reasons).
func masterMetrics(ctx context.Context, base, token string) map[string]float64 {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out := map[string]float64{}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return out
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return out // a refused token reads as no figures, not as the error's text
	}
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		line := s.Text()
		for _, name := range metricNames {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				out[name], _ = strconv.ParseFloat(v, 64)
			}
		}
		if v, ok := strings.CutPrefix(line, apiRequests+`{route="`); ok {
			// route="GET /v1/jobs",le="0.0005"} 12
			if route, rest, ok := strings.Cut(v, `",le="`); ok {
				if le, num, ok := strings.Cut(rest, `"} `); ok {
					out[apiRequests+"|"+route+"|"+le], _ = strconv.ParseFloat(num, 64)
				}
			}
		}
		if v, ok := strings.CutPrefix(line, reconcilePhase+`{phase="`); ok {
			if phase, num, ok := strings.Cut(v, `"} `); ok {
				out[reconcilePhase+"/"+phase], _ = strconv.ParseFloat(num, 64)
			}
		}
		if v, ok := strings.CutPrefix(line, "stormdock_master_job_metrics_node_failures_total{"); ok {
			if _, num, ok := strings.Cut(v, "} "); ok {
				f, _ := strconv.ParseFloat(num, 64)
				out["stormdock_master_job_metrics_node_failures_total"] += f
			}
		}
	}
	return out
}
