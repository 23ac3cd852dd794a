package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/keyring"
	"github.com/stormdock/stormdock/internal/testenv"
)

// BenchmarkAgentStart measures issue 21's figures for one agent with 16 slots (process
// driver, cgroups, a real ZooKeeper, the default 1s heartbeat): from the master's write of
// the node's assignment to the node record showing the job's workers running, both as a
// client of the store sees them, and the wall time of `stormdock job submit --wait`, for a
// job of 1 and of 16 sleeping workers. Each iteration submits the job, then kills it. From
// the agent's debug log it traces where the time went: the assignment's arrival at the
// agent, the driver's starts (first begun, last done), the node record handed to the
// keeper, the record in the store, the CLI's return. With secrets=1 each worker names a
// tenant secret, which its agent fetches from the master (HTTPS, signed, sealed) and writes
// before the worker starts: the difference is what secret delivery adds. Run it alone:
//
//	CI=true go test -run '^$' -bench AgentStart -benchtime 5x ./e2e/
func BenchmarkAgentStart(b *testing.B) {
	const slots = 16
	h := newHarness(b, 2*time.Second)
	keyFile := filepath.Join(h.Dir, "secrets.key")
	if _, err := keyring.Generate(keyFile); err != nil {
		b.Fatal(err)
	}
	url := strings.Replace(h.StartMaster("m1", "--tls", "--secrets-key", keyFile), "http://", "https://", 1)
	cl := httpsAdmin(b, h, url)
	ctx := context.Background()
	testenv.Eventually(b, "m1 leads", 30*time.Second, func() bool { hl, err := cl.Health(ctx); return err == nil && hl.Leader })
	h.StartAgent("n1", "dc-a", "r1", slots, "--heartbeat", "1s", "--log-level", "debug")
	testenv.Eventually(b, "the node registered", 30*time.Second, func() bool { return len(h.NodeRecords()) == 1 })
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.SetSecret(ctx, "e2e", "db", []byte("bench-secret-value")); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ workers, secrets int }{{1, 0}, {1, 1}, {slots, 0}, {slots, 1}} {
		workers, secrets := c.workers, ""
		if c.secrets > 0 {
			secrets = "secrets: [db]\n"
		}
		b.Run(fmt.Sprintf("workers=%d/secrets=%d", workers, c.secrets), func(b *testing.B) {
			var toRunning, submitWait []time.Duration
			var traces []string
			for i := 0; b.Loop(); i++ {
				job := fmt.Sprintf("s%d-%d", workers, i)
				spec := filepath.Join(h.Dir, job+".yaml")
				if err := os.WriteFile(spec, []byte(fmt.Sprintf(`name: %s
tenant: e2e
workers: %d
resources: {memory: 16Mi, cpu: 0.1}
command: [/bin/sleep, "100000"]
gracePeriod: 1s
%s`, job, workers, secrets)), 0o644); err != nil {
					b.Fatal(err)
				}
				seen := h.watchStart(b, job, workers)
				cmd := exec.Command(binary, "job", "submit", "--wait", spec, "--master", url)
				cmd.Env = append(os.Environ(), "STORMDOCK_DATA="+filepath.Join(h.Dir, "data"))
				t0 := time.Now()
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("job submit --wait: %v\n%s", err, out)
				}
				done := time.Now()
				submitWait = append(submitWait, done.Sub(t0))
				st := <-seen
				toRunning = append(toRunning, st.running.Sub(st.assigned))
				b.StopTimer()
				traces = append(traces, h.startTrace(b, job, workers, t0, st, done))
				if _, err := cl.KillJob(ctx, job, 0); err != nil {
					b.Fatal(err)
				}
				testenv.Eventually(b, job+" stopped", time.Minute, func() bool {
					for _, rec := range h.NodeRecords() {
						for _, w := range rec.Workers {
							if w.Key.Job == job {
								return false
							}
						}
					}
					return true
				})
				// Submits half a second apart, as independent ones: the agent writes its node
				// record at most once per 100ms after a burst of three (a stop is two), and
				// a submit right after the kill's writes would measure that limit.
				time.Sleep(500 * time.Millisecond)
				b.StartTimer()
			}
			if c.secrets > 0 {
				fetch, write := h.secretDeliveries(b, "s"+fmt.Sprint(workers)+"-")
				b.ReportMetric(median(fetch).Seconds()*1000, "secret-fetch-ms")
				b.ReportMetric(median(write).Seconds()*1000, "secret-write-ms")
				b.Logf("figure: secret delivery per worker (%d starts): fetch from the master (signed, HTTPS, sealed) median %v, p90 %v; files written median %v",
					len(fetch), median(fetch).Round(10*time.Microsecond), percentile(sorted(fetch), 90).Round(10*time.Microsecond), median(write).Round(10*time.Microsecond))
			}
			b.ReportMetric(median(toRunning).Seconds(), "assigned-to-running-s")
			b.ReportMetric(median(submitWait).Seconds(), "submit-wait-s")
			b.Logf("figure: one agent, %d slots, %d workers, %d secrets each, %d runs: assignment written -> all running %v (median %v); job submit --wait %v (median %v)",
				slots, workers, c.secrets, len(toRunning), rounded(toRunning), median(toRunning).Round(time.Millisecond), rounded(submitWait), median(submitWait).Round(time.Millisecond))
			b.Logf("trace of the last run, ms from the CLI's start: %s", traces[len(traces)-1])
		})
	}
}

// startSeen is when a job's assignment reached the store and when the node record first
// showed all its workers running, as a store client saw each.
type startSeen struct{ assigned, running time.Time }

// watchStart watches node n1's assignment and record until job's n workers run on it.
func (h *harness) watchStart(tb testing.TB, job string, n int) <-chan startSeen {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	assign, err := h.Store.Watch(ctx, cluster.AssignmentsKey+"/n1")
	if err != nil {
		tb.Fatal(err)
	}
	node, err := h.Store.Watch(ctx, cluster.NodesKey+"/n1")
	if err != nil {
		tb.Fatal(err)
	}
	out := make(chan startSeen, 1)
	go func() {
		defer cancel()
		var st startSeen
		for st.assigned.IsZero() || st.running.IsZero() {
			select {
			case <-ctx.Done():
				close(out)
				return
			case ev := <-assign:
				var na cluster.NodeAssignment
				if st.assigned.IsZero() && ev.Exists && json.Unmarshal(ev.Entry.Value, &na) == nil &&
					slices.ContainsFunc(na.Workers, func(w cluster.WorkerAssignment) bool { return w.Key.Job == job }) {
					st.assigned = time.Now()
				}
			case ev := <-node:
				var rec cluster.NodeRecord
				if st.running.IsZero() && ev.Exists && json.Unmarshal(ev.Entry.Value, &rec) == nil {
					running := 0
					for _, w := range rec.Workers {
						if w.Key.Job == job && w.State == cluster.WorkerRunning {
							running++
						}
					}
					if running == n {
						st.running = time.Now()
					}
				}
			}
		}
		out <- st
	}()
	return out
}

var (
	logTime  = regexp.MustCompile(`^time=(\S+) `)
	logAttr  = regexp.MustCompile(` (\w+)=("[^"]*"|\S+)`)
	phaseKey = []string{"state", "cgroup", "fork", "place", "exec", "record"}
)

// startTrace reads node n1's agent log for the start of job's n workers, after t0, and says
// when each step happened, in ms after t0: the assignment at the agent, the first driver
// start begun, the last one done, the node record handed to the keeper, the record in the
// store (st.running), the CLI's return; and the median of the driver's start phases.
func (h *harness) startTrace(tb testing.TB, job string, n int, t0 time.Time, st startSeen, done time.Time) string {
	f, err := os.Open(filepath.Join(h.Dir, "agent-n1.log"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var arrived, firstBegun, lastDone, handed time.Time
	started := 0
	phases := map[string][]time.Duration{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		m := logTime.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil || at.Before(t0.Add(-time.Millisecond)) {
			continue
		}
		attrs := map[string]string{}
		for _, a := range logAttr.FindAllStringSubmatch(line, -1) {
			attrs[a[1]] = strings.Trim(a[2], `"`)
		}
		switch {
		case attrs["msg"] == "assignment" && arrived.IsZero():
			arrived = at
		case attrs["msg"] == "start phases" && strings.Contains(attrs["id"], "."+job+"."):
			var total time.Duration
			for _, k := range phaseKey {
				if d, err := time.ParseDuration(attrs[k]); err == nil {
					phases[k] = append(phases[k], d)
					total += d
				}
			}
			if begun := at.Add(-total); firstBegun.IsZero() || begun.Before(firstBegun) {
				firstBegun = begun
			}
			started++
			if started == n {
				lastDone = at
			}
		case attrs["msg"] == "node record handed to the keeper" && started == n && handed.IsZero():
			handed = at
		}
	}
	since := func(t time.Time) string {
		if t.IsZero() {
			return "?"
		}
		return fmt.Sprintf("%.0f", float64(t.Sub(t0))/float64(time.Millisecond))
	}
	var ph []string
	for _, k := range phaseKey {
		if ds := phases[k]; len(ds) > 0 {
			ph = append(ph, fmt.Sprintf("%s %.1f", k, float64(median(ds))/float64(time.Millisecond)))
		}
	}
	return fmt.Sprintf("assignment in the store %s, at the agent %s, first start begun %s, last done %s (%d starts), record to the keeper %s, in the store %s, CLI returned %s; driver start phases, median ms: %s",
		since(st.assigned), since(arrived), since(firstBegun), since(lastDone), started, since(handed), since(st.running), since(done), strings.Join(ph, ", "))
}

func median(ds []time.Duration) time.Duration {
	return sorted(ds)[len(ds)/2]
}

func sorted(ds []time.Duration) []time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s
}

func rounded(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// secretDeliveries reads node n1's agent log for the secret deliveries of the workers of
// jobs named with prefix: how long each fetch from the master and each write of the files
// took.
func (h *harness) secretDeliveries(tb testing.TB, prefix string) (fetch, write []time.Duration) {
	f, err := os.Open(filepath.Join(h.Dir, "agent-n1.log"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `msg="secrets delivered"`) {
			continue
		}
		attrs := map[string]string{}
		for _, a := range logAttr.FindAllStringSubmatch(line, -1) {
			attrs[a[1]] = strings.Trim(a[2], `"`)
		}
		if !strings.Contains(attrs["worker"], ".n1."+prefix) && !strings.HasPrefix(attrs["worker"], "n1."+prefix) {
			continue
		}
		if d, err := time.ParseDuration(attrs["fetch"]); err == nil {
			fetch = append(fetch, d)
		}
		if d, err := time.ParseDuration(attrs["write"]); err == nil {
			write = append(write, d)
		}
	}
	return fetch, write
}

// percentile is the p-th of ds (0 < p <= 1), nearest rank.
