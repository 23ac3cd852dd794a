package job

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/ctxtime"
	"github.com/stormdock/stormdock/tools/commands"
)

// `job top` and `job metrics`: the jobs' metrics as the master keeps them (its history of
// the job-level series, which every master collects from the agents), and each worker's
// latest values fetched from its agent.

var jobTopCommand = &cli.Command{
	Name:      "top",
	Usage:     "a live table of jobs (or of one job's workers): workers, cpu, memory, throughput, the jobs' own metrics",
	ArgsUsage: "[NAME]",
	Description: "Without NAME, one row per job you may see; with NAME, the job's totals and one row per worker\n" +
		"(read from the agents). Redraws every --every until interrupted; --once (or -o json, or output\n" +
		"that is not a terminal with --once) prints one table. CPU is in cores, THROUGHPUT in records per\n" +
		"second (the rate of the workers' *_processed_total counters), a counter's column is its rate.",
	Flags: append(commands.MasterFlags(), commands.OutputFlag,
		&cli.DurationFlag{Name: "every", Usage: "redraw every `D`", Value: 5 * time.Second},
		&cli.BoolFlag{Name: "once", Usage: "print one table and exit"}),
	Action: jobTop,
}

var jobMetricsCommand = &cli.Command{
	Name:      "metrics",
	Usage:     "a job's series over time, as the master keeps them (1h at 10s by default)",
	ArgsUsage: "NAME",
	Description: "One line per series: its latest value, min, mean and max over the window, and a sparkline.\n" +
		"With one --series, one line per point. Gauges are summed over the workers (MIN and MAX columns\n" +
		"of a point are over the workers); counters are shown as rates, summed.",
	Flags: append(commands.MasterFlags(), commands.OutputFlag,
		&cli.StringSliceFlag{Name: "series", Usage: "only series `S` (a name, or name{labels}; repeat for more)"},
		&cli.StringFlag{Name: "since", Usage: "from `D` ago (30m) or a time (RFC 3339); default: the whole window"}),
	Action: jobMetricsAction,
}

func jobMetricsAction(c *cli.Context) error {
	if err := commands.WantName(c, "the job NAME"); err != nil {
		return err
	}
	since := c.String("since")
	if since != "" {
		if d, err := time.ParseDuration(since); err == nil && d <= 0 {
			return commands.UsageErr("--since must be more than 0 (like 30m)")
		} else if err != nil {
			if _, terr := time.Parse(time.RFC3339, since); terr != nil {
				return commands.UsageErr("--since %q: want a duration (30m) or a time (2006-01-02T15:04:05Z)", since)
			}
		}
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	get := cl.JobMetrics
	if len(c.StringSlice("series")) == 1 || c.String("output") == "json" {
		get = cl.JobMetricsDetail // one series is shown point by point, with the workers' min and max
	}
	m, err := get(c.Context, c.Args().First(), c.StringSlice("series"), since)
	if err != nil {
		return commands.APIErr(c, err)
	}
	return commands.PrintOut(c, m, func(w io.Writer) { metricsTable(w, m, len(c.StringSlice("series")) == 1) })
}

// metricsTable is one line per series (its latest value, min, mean and max over the window,
// a sparkline) or, for the one series asked for, one line per point.
func metricsTable(w io.Writer, m api.JobMetrics, oneSeries bool) {
	if len(m.Series) == 0 {
		fmt.Fprintf(w, "job %s: no metrics yet (the masters read the agents every %s)\n", m.Job, time.Duration(m.Step*float64(time.Second)))
		return
	}
	if oneSeries && len(m.Series) == 1 {
		s := m.Series[0]
		fmt.Fprintf(w, "TIME\t%s\tMIN\tMAX\tWORKERS\n", strings.ToUpper(s.ID()))
		step := time.Duration(m.Step * float64(time.Second))
		for i, v := range s.Values {
			if v == nil {
				continue
			}
			at := m.From.Add(time.Duration(i) * step).Local().Format("15:04:05")
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\n", at, format(s.Name, s.Kind, *v), format(s.Name, s.Kind, *s.Min[i]), format(s.Name, s.Kind, *s.Max[i]), s.N[i])
		}
		return
	}
	fmt.Fprintf(w, "job %s (tenant %s): %s to %s, every %s\n", m.Job, m.Tenant, m.From.Local().Format("15:04:05"), m.To.Local().Format("15:04:05"),
		time.Duration(m.Step*float64(time.Second)))
	for _, p := range m.Problems {
		fmt.Fprintf(w, "problem: %s\n", commands.Clip(p, 160))
	}
	fmt.Fprintln(w, "SERIES\tKIND\tNOW\tMIN\tMEAN\tMAX\tWINDOW")
	for _, s := range m.Series {
		now, _, ok := s.Last()
		lo, mean, hi, n := stats(s.Values)
		if !ok || n == 0 {
			fmt.Fprintf(w, "%s\t%s\t-\t-\t-\t-\t\n", commands.Clip(s.ID(), 40), s.Kind)
			continue
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", commands.Clip(s.ID(), 40), s.Kind, format(s.Name, s.Kind, now),
			format(s.Name, s.Kind, lo), format(s.Name, s.Kind, mean), format(s.Name, s.Kind, hi), sparkline(s.Values, 40))
	}
}

func jobTop(c *cli.Context) error {
	if c.NArg() > 1 {
		return commands.UsageErr("job top takes at most one job NAME; got %d arguments", c.NArg())
	}
	name := c.Args().First()
	if name != "" {
		if err := cluster.CheckName(name); err != nil {
			return commands.UsageErr("the job NAME: %v", err)
		}
	}
	if c.Duration("every") < 100*time.Millisecond {
		return commands.UsageErr("--every must be at least 100ms")
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	once := c.Bool("once") || c.String("output") == "json"
	tty := commands.IsTerminal(c.App.Writer)
	for {
		var v any
		var table func(io.Writer)
		if name == "" {
			m, err := cl.LatestMetrics(c.Context)
			if err != nil {
				return commands.APIErr(c, err)
			}
			v, table = m, func(w io.Writer) { topJobs(w, m) }
		} else {
			m, err := cl.JobMetrics(c.Context, name, nil, "1m")
			if err != nil {
				return commands.APIErr(c, err)
			}
			ws, err := cl.JobWorkerMetrics(c.Context, name)
			if err != nil {
				return commands.APIErr(c, err)
			}
			v, table = struct {
				Job     api.JobMetrics       `json:"job"`
				Workers api.JobWorkerMetrics `json:"workers"`
			}{m, ws}, func(w io.Writer) { topJob(w, m, ws) }
		}
		if tty && !once {
			fmt.Fprint(c.App.Writer, "\033[H\033[2J") // home, clear: redraw in place
			fmt.Fprintf(c.App.Writer, "stormdock job top %s  (every %s, ^C to stop)  %s\n", name, c.Duration("every"), time.Now().Format("15:04:05"))
		}
		if err := commands.PrintOut(c, v, table); err != nil {
			return err
		}
		if once {
			return nil
		}
		if !tty {
			fmt.Fprintln(c.App.Writer)
		}
		if err := ctxtime.Sleep(c.Context, c.Duration("every")); err != nil {
			if errors.Is(err, c.Context.Err()) {
				return nil
			}
			return err
		}
	}
}

// topJobs is one row per job.
func topJobs(w io.Writer, m api.JobsMetrics) {
	fmt.Fprintln(w, "JOB\tTENANT\tWORKERS\tCPU\tMEMORY\tTHROUGHPUT\tMETRICS")
	for _, j := range m.Jobs {
		running := "-"
		if v, ok := j.Values[api.SeriesWorkers]; ok {
			running = fmt.Sprintf("%.0f", v)
		}
		var own []string
		for _, id := range slices.Sorted(maps.Keys(j.Values)) {
			if slices.Contains(api.BuiltinSeries, id) {
				continue
			}
			own = append(own, id+"="+format(id, j.Kinds[id], j.Values[id]))
		}
		fmt.Fprintf(w, "%s\t%s\t%s/%d\t%s\t%s\t%s\t%s\n", commands.Clip(j.Job, 24), commands.Clip(j.Tenant, 16), running, j.Workers,
			value(j, api.SeriesCPU), value(j, api.SeriesMemory), value(j, api.SeriesThroughput), commands.Clip(strings.Join(own, " "), 60))
	}
}

func value(j api.JobLatest, series string) string {
	v, ok := j.Values[series]
	if !ok {
		return "-"
	}
	return format(series, j.Kinds[series], v)
}

// topJob is a job's totals and one row per worker.
func topJob(w io.Writer, m api.JobMetrics, ws api.JobWorkerMetrics) {
	var totals []string
	var own []string
	for _, s := range m.Series {
		v, _, ok := s.Last()
		if !ok {
			continue
		}
		totals = append(totals, s.ID()+" "+format(s.Name, s.Kind, v))
		if !slices.Contains(api.BuiltinSeries, s.Name) {
			own = append(own, s.ID())
		}
	}
	fmt.Fprintf(w, "job %s (tenant %s), %d workers wanted: %s\n", m.Job, m.Tenant, m.Workers, strings.Join(totals, ", "))
	for _, p := range append(slices.Clip(m.Problems), ws.Problems...) {
		fmt.Fprintf(w, "problem: %s\n", commands.Clip(p, 160))
	}
	cols := append([]string{api.SeriesCPU, api.SeriesMemory}, own...)
	hdr := []string{"WORKER", "NODE", "SCRAPE"}
	for _, c := range cols {
		hdr = append(hdr, strings.ToUpper(commands.Clip(c, 24)))
	}
	fmt.Fprintln(w, strings.Join(hdr, "\t"))
	for _, wm := range ws.Workers {
		id := fmt.Sprint(wm.Worker)
		if wm.Link != "" {
			id = wm.Link + "/" + id
		}
		row := []string{id, commands.Clip(wm.Node, 16), commands.Clip(wm.State, 30)}
		for _, col := range cols {
			cell := "-"
			for _, s := range wm.Series {
				if s.Name == col || api.SeriesID(s.Name, s.Labels) == col {
					switch {
					case s.Kind == api.KindCounter && s.Rate != nil:
						cell = format(s.Name, s.Kind, *s.Rate)
					case s.Kind == api.KindGauge:
						cell = format(s.Name, s.Kind, s.Value)
					}
				}
			}
			row = append(row, cell)
		}
		fmt.Fprintln(w, strings.Join(row, "\t"))
	}
}

// format writes a value as its series reads best: memory in binary units, cpu in cores,
// counters as rates.
func format(series, kind string, v float64) string {
	switch {
	case series == api.SeriesMemory:
		return humanBytes(v)
	case series == api.SeriesCPU:
		return fmt.Sprintf("%.2f", v)
	case kind == api.KindCounter || series == api.SeriesThroughput:
		return compact(v) + "/s"
	}
	return compact(v)
}

func compact(v float64) string {
	switch a := math.Abs(v); {
	case a == math.Trunc(a) && a < 1e9:
		return fmt.Sprintf("%.0f", v)
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 1:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

func humanBytes(v float64) string {
	for _, u := range []struct {
		s string
		m float64
	}{{"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if math.Abs(v) >= u.m {
			return fmt.Sprintf("%.1f%s", v/u.m, u.s)
		}
	}
	return fmt.Sprintf("%.0f", v)
}

// stats are the min, mean and max of the points there are, and how many.
func stats(vs []*float64) (lo, mean, hi float64, n int) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, v := range vs {
		if v == nil {
			continue
		}
		lo, hi, mean = min(lo, *v), max(hi, *v), mean+*v
		n++
	}
	if n > 0 {
		mean /= float64(n)
	}
	return lo, mean, hi, n
}

// sparkline draws the points in width cells (each the mean of its points), blank where
// none.
func sparkline(vs []*float64, width int) string {
	for len(vs) > 0 && vs[0] == nil {
		vs = vs[1:] // a history younger than the window starts where its points do
	}
	if len(vs) == 0 {
		return ""
	}
	width = min(width, len(vs))
	cells := make([]float64, width)
	has := make([]bool, width)
	lo, hi := math.Inf(1), math.Inf(-1)
	for c := range width {
		a, b := c*len(vs)/width, (c+1)*len(vs)/width
		sum, n := 0.0, 0
		for _, v := range vs[a:b] {
			if v != nil {
				sum += *v
				n++
			}
		}
		if n > 0 {
			cells[c], has[c] = sum/float64(n), true
			lo, hi = min(lo, cells[c]), max(hi, cells[c])
		}
	}
	bars := []rune("▁▂▃▄▅▆▇█")
	var sb strings.Builder
	for c := range width {
		if !has[c] {
			sb.WriteRune(' ')
			continue
		}
		i := 0
		if hi > lo {
			i = int((cells[c] - lo) / (hi - lo) * float64(len(bars)-1))
		}
		sb.WriteRune(bars[i])
	}
	return sb.String()
}

var jobAutoscaleCommand = &cli.Command{
	Name:      "autoscale",
	Usage:     "pause or resume a job's scaling policy (a manual job scale pauses it)",
	ArgsUsage: "NAME",
	Flags: append(commands.MasterFlags(),
		&cli.BoolFlag{Name: "resume", Usage: "let the policy decide the worker count again"},
		&cli.BoolFlag{Name: "pause", Usage: "keep the worker count where it is until --resume"}),
	Action: func(c *cli.Context) error {
		if err := commands.WantName(c, "the job NAME"); err != nil {
			return err
		}
		if c.Bool("resume") == c.Bool("pause") {
			return commands.UsageErr("give exactly one of --resume and --pause")
		}
		cl, err := commands.NewClient(c)
		if err != nil {
			return err
		}
		rec, err := cl.AutoscaleJob(c.Context, c.Args().First(), c.Bool("pause"))
		if err != nil {
			return commands.APIErr(c, err)
		}
		for _, line := range autoscaleLines(rec) {
			fmt.Fprintln(c.App.Writer, line)
		}
		return nil
	},
}

// autoscaleLines say a job's scaling policy and its last change, for `job status`.
func autoscaleLines(rec cluster.JobRecord) []string {
	p := rec.Spec.Scaling
	if p == nil {
		return nil
	}
	lines := []string{"autoscaling: " + p.String()}
	as := rec.Autoscale
	if as != nil && as.Paused {
		by := ""
		if as.PausedBy != "" {
			by = " by " + as.PausedBy
		}
		lines = append(lines, fmt.Sprintf("autoscaling paused%s at %s: resume with `stormdock job autoscale %s --resume`",
			by, as.PausedAt.Local().Format("2006-01-02 15:04:05"), rec.Spec.Name))
	}
	if as != nil && as.Last != nil {
		l := as.Last
		lines = append(lines, fmt.Sprintf("last decision %s: %d -> %d workers (%s %.4g per worker, target %g): %s",
			l.At.Local().Format("15:04:05"), l.From, l.To, l.Metric, l.Value, l.Target, l.Reason))
	} else {
		lines = append(lines, "last decision: none yet")
	}
	return lines
}
