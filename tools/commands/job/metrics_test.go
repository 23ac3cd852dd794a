package job

import (
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
)

// The tables of `job top`, `job metrics` and the autoscaling lines of `job status` and `job
// autoscale`, from the API's answers: what a user reads, column by column.

func pts(vs ...float64) []*float64 {
	out := make([]*float64, len(vs))
	for i, v := range vs {
		if v < 0 { // -1: no point
			continue
		}
		out[i] = &vs[i]
	}
	return out
}

func hms(t time.Time) string { return t.Local().Format("15:04:05") }

func TestFormat(t *testing.T) {
	for _, c := range []struct {
		series, kind string
		v            float64
		want         string
	}{
		{api.SeriesMemory, api.KindGauge, 512, "512"},
		{api.SeriesMemory, api.KindGauge, 1536, "1.5Ki"},
		{api.SeriesMemory, api.KindGauge, 3 << 20, "3.0Mi"},
		{api.SeriesMemory, api.KindGauge, 5.25 * (1 << 30), "5.2Gi"},
		{api.SeriesCPU, api.KindCounter, 0.5, "0.50"}, // cores, not a rate per second
		{api.SeriesCPU, api.KindCounter, 12, "12.00"},
		{api.SeriesThroughput, api.KindGauge, 1234.5, "1234/s"},
		{"lines_processed_total", api.KindCounter, 42, "42/s"},
		{"lines_processed_total", api.KindCounter, 2.5, "2.5/s"},
		{"lines_processed_total", api.KindCounter, 0.0125, "0.0125/s"},
		{"input_backlog", api.KindGauge, 7, "7"},
		{"input_backlog", api.KindGauge, 150.7, "151"},
		{"input_backlog", api.KindGauge, -3.25, "-3.2"},
		{"input_backlog", api.KindGauge, 3e9, "3000000000"},
		{"input_backlog", api.KindGauge, 0, "0"},
	} {
		if got := format(c.series, c.kind, c.v); got != c.want {
			t.Errorf("format(%s, %s, %g) = %q, want %q", c.series, c.kind, c.v, got, c.want)
		}
	}
}

func TestSparkline(t *testing.T) {
	for _, c := range []struct {
		name  string
		vs    []*float64
		width int
		want  string
	}{
		{"none", nil, 40, ""},
		{"all missing", pts(-1, -1), 40, ""},
		{"rising", pts(0, 1, 2, 3, 4, 5, 6, 7), 40, "▁▂▃▄▅▆▇█"},
		{"flat", pts(5, 5, 5), 40, "▁▁▁"},
		{"young history starts where its points do", pts(-1, -1, 1, 2), 40, "▁█"},
		{"a gap is blank", pts(1, -1, 2), 40, "▁ █"},
		{"cells are means", pts(0, 2, 8, 6), 2, "▁█"},
	} {
		if got := sparkline(c.vs, c.width); got != c.want {
			t.Errorf("%s: sparkline = %q, want %q", c.name, got, c.want)
		}
	}
}

func TestMetricsTable(t *testing.T) {
	from := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	to := from.Add(30 * time.Second)
	for _, c := range []struct {
		name      string
		m         api.JobMetrics
		oneSeries bool
		want      []string
	}{{
		name: "no history yet",
		m:    api.JobMetrics{Job: "wc", Tenant: "acme", Step: 10},
		want: []string{"job wc: no metrics yet (the masters read the agents every 10s)"},
	}, {
		name: "one line per series",
		m: api.JobMetrics{Job: "wc", Tenant: "acme", Step: 10, From: from, To: to,
			Problems: []string{"node n2: worker 3: scrape: timeout"},
			Series: []api.SeriesHistory{
				{Name: api.SeriesMemory, Kind: api.KindGauge, Values: pts(1<<20, 3<<20, 2<<20, 2<<20)},
				{Name: "lines_processed_total", Kind: api.KindCounter, Values: pts(10, 20, -1, 30)},
				{Name: "input_backlog", Labels: `queue="a"`, Kind: api.KindGauge, Values: pts(-1, -1, -1, -1)},
			}},
		want: []string{
			"job wc (tenant acme): " + hms(from) + " to " + hms(to) + ", every 10s",
			"problem: node n2: worker 3: scrape: timeout",
			"SERIES\tKIND\tNOW\tMIN\tMEAN\tMAX\tWINDOW",
			"memory\tgauge\t2.0Mi\t1.0Mi\t2.0Mi\t3.0Mi\t▁█▄▄",
			"lines_processed_total\tcounter\t30/s\t10/s\t20/s\t30/s\t▁▄ █",
			`input_backlog{queue="a"}` + "\tgauge\t-\t-\t-\t-\t",
		},
	}, {
		name: "one series point by point, missing points left out",
		m: api.JobMetrics{Job: "wc", Tenant: "acme", Step: 10, From: from, To: to,
			Series: []api.SeriesHistory{{Name: "input_backlog", Kind: api.KindGauge,
				Values: pts(300, -1, 90), Min: pts(100, -1, 20), Max: pts(200, -1, 70), N: []int{2, 0, 3}}}},
		oneSeries: true,
		want: []string{
			"TIME\tINPUT_BACKLOG\tMIN\tMAX\tWORKERS",
			hms(from) + "\t300\t100\t200\t2",
			hms(from.Add(20*time.Second)) + "\t90\t20\t70\t3",
		},
	}, {
		name: "one series asked for by a pattern that matched several: the summary",
		m: api.JobMetrics{Job: "wc", Tenant: "acme", Step: 10, From: from, To: to,
			Series: []api.SeriesHistory{
				{Name: "q", Labels: `p="1"`, Kind: api.KindGauge, Values: pts(1)},
				{Name: "q", Labels: `p="2"`, Kind: api.KindGauge, Values: pts(2)},
			}},
		oneSeries: true,
		want: []string{
			"job wc (tenant acme): " + hms(from) + " to " + hms(to) + ", every 10s",
			"SERIES\tKIND\tNOW\tMIN\tMEAN\tMAX\tWINDOW",
			`q{p="1"}` + "\tgauge\t1\t1\t1\t1\t▁",
			`q{p="2"}` + "\tgauge\t2\t2\t2\t2\t▁",
		},
	}} {
		t.Run(c.name, func(t *testing.T) {
			var b strings.Builder
			metricsTable(&b, c.m, c.oneSeries)
			assertLines(t, b.String(), c.want)
		})
	}
}

func TestTopJobs(t *testing.T) {
	m := api.JobsMetrics{Jobs: []api.JobLatest{{
		Job: "wc", Tenant: "acme", Workers: 4,
		Values: map[string]float64{api.SeriesWorkers: 3, api.SeriesCPU: 1.25, api.SeriesMemory: 300 << 20,
			api.SeriesThroughput: 5000, api.SeriesRestarts: 0, "lines_processed_total": 5000, "input_backlog": 12},
		Kinds: map[string]string{api.SeriesWorkers: api.KindGauge, api.SeriesCPU: api.KindCounter, api.SeriesMemory: api.KindGauge,
			api.SeriesThroughput: api.KindGauge, api.SeriesRestarts: api.KindCounter, "lines_processed_total": api.KindCounter, "input_backlog": api.KindGauge},
	}, {
		Job: "idle", Tenant: "acme", Workers: 2, // no round has read it yet
	}}}
	var b strings.Builder
	topJobs(&b, m)
	assertLines(t, b.String(), []string{
		"JOB\tTENANT\tWORKERS\tCPU\tMEMORY\tTHROUGHPUT\tMETRICS",
		"wc\tacme\t3/4\t1.25\t300.0Mi\t5000/s\tinput_backlog=12 lines_processed_total=5000/s",
		"idle\tacme\t-/2\t-\t-\t-\t",
	})
}

func TestTopJob(t *testing.T) {
	rate := 40.0
	m := api.JobMetrics{Job: "wc", Tenant: "acme", Workers: 2, Step: 10,
		Problems: []string{"node n2: unreachable"},
		Series: []api.SeriesHistory{
			{Name: api.SeriesWorkers, Kind: api.KindGauge, Values: pts(2, 2)},
			{Name: api.SeriesCPU, Kind: api.KindCounter, Values: pts(0.5, 0.75)},
			{Name: "input_backlog", Kind: api.KindGauge, Values: pts(9, -1)}, // its last point is its latest
			{Name: "lines_processed_total", Kind: api.KindCounter, Values: pts(-1, -1)},
		}}
	ws := api.JobWorkerMetrics{Job: "wc", Problems: []string{"node n3: 503"}, Workers: []api.WorkerMetrics{
		{Job: "wc", Worker: 0, Node: "n1", State: "ok", Series: []api.WorkerSeriesAt{
			{Name: api.SeriesCPU, Kind: api.KindCounter, Value: 100, Rate: &rate},
			{Name: api.SeriesMemory, Kind: api.KindGauge, Value: 64 << 20},
			{Name: "input_backlog", Kind: api.KindGauge, Value: 4},
		}},
		{Job: "wc", Link: "east", Worker: 1, Node: "n2", State: "none", Series: []api.WorkerSeriesAt{
			{Name: api.SeriesCPU, Kind: api.KindCounter, Value: 3}, // a counter read once has no rate yet
		}},
	}}
	var b strings.Builder
	topJob(&b, m, ws)
	assertLines(t, b.String(), []string{
		"job wc (tenant acme), 2 workers wanted: workers 2, cpu 0.75, input_backlog 9",
		"problem: node n2: unreachable",
		"problem: node n3: 503",
		"WORKER\tNODE\tSCRAPE\tCPU\tMEMORY\tINPUT_BACKLOG",
		"0\tn1\tok\t40.00\t64.0Mi\t4",
		"east/1\tn2\tnone\t-\t-\t-",
	})
}

func TestAutoscaleLines(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 5, 0, time.UTC)
	pol := &cluster.ScalingPolicy{Min: 1, Max: 8, Metric: "input_backlog", Target: 1000, MaxStep: 2}
	spec := func(p *cluster.ScalingPolicy) cluster.JobSpec {
		return cluster.JobSpec{Name: "wc", Scaling: p}
	}
	policy := "autoscaling: input_backlog target 1000 per worker, 1..8 workers, cooldown up 1m0s down 5m0s, stabilization 5m0s, at most 2 at a time"
	for _, c := range []struct {
		name string
		rec  cluster.JobRecord
		want []string
	}{{
		name: "no policy, no lines",
		rec:  cluster.JobRecord{Spec: spec(nil)},
	}, {
		name: "a policy that has not decided",
		rec:  cluster.JobRecord{Spec: spec(pol)},
		want: []string{policy, "last decision: none yet"},
	}, {
		name: "its last decision, with the numbers behind it",
		rec: cluster.JobRecord{Spec: spec(pol), Autoscale: &cluster.AutoscaleState{Last: &cluster.ScalingDecision{
			At: at, From: 2, To: 4, Metric: "input_backlog", Value: 2500.123, Target: 1000, Reason: "backlog over target"}}},
		want: []string{policy, "last decision " + hms(at) + ": 2 -> 4 workers (input_backlog 2500 per worker, target 1000): backlog over target"},
	}, {
		name: "paused by a manual scale, and how to resume",
		rec:  cluster.JobRecord{Spec: spec(pol), Autoscale: &cluster.AutoscaleState{Paused: true, PausedAt: at, PausedBy: "job scale"}},
		want: []string{policy,
			"autoscaling paused by job scale at " + at.Local().Format("2006-01-02 15:04:05") + ": resume with `stormdock job autoscale wc --resume`",
			"last decision: none yet"},
	}} {
		t.Run(c.name, func(t *testing.T) {
			assertLines(t, strings.Join(autoscaleLines(c.rec), "\n"), c.want)
		})
	}
}

func assertLines(t *testing.T, got string, want []string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	if got == "" {
		lines = nil
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s\nwant:\n%s", len(lines), len(want), got, strings.Join(want, "\n"))
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d:\n got %q\nwant %q", i+1, lines[i], want[i])
		}
	}
}
