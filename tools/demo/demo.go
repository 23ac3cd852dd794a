// Package demo is `stormdock demo`: the guided tour on a local cluster: the example job,
// scaling, a node loss, and cleaning up.
package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/daemon"
	"github.com/stormdock/stormdock/examples"
	"github.com/stormdock/stormdock/internal/ctxtime"
	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/tools/commands"
	jobcmd "github.com/stormdock/stormdock/tools/commands/job"
)

// Command runs the guided tour: a local cluster, the example job, scaling, a node loss.
var Command = &cli.Command{
	Name:  "demo",
	Usage: "start a local cluster, run the example job, scale it, kill a node, and clean up",
	Flags: []cli.Flag{
		&cli.IntFlag{Name: "nodes", Usage: "simulated nodes", Value: 9},
		&cli.IntFlag{Name: "workers", Usage: "run the example job with this many workers (default: as examples/wordcount.yaml says)"},
		&cli.IntFlag{Name: "slots", Usage: "worker slots per node", Value: 4},
		&cli.DurationFlag{Name: "timeout", Usage: "give up on any step after this long", Value: time.Minute},
		&cli.BoolFlag{Name: "verbose", Usage: "show the cluster's logs"},
		&cli.BoolFlag{Name: "tls", Usage: "serve the API over TLS", Value: true},
	},
	Action: runDemo,
}

// demo holds the tour's state.
type demo struct {
	w       io.Writer
	cl      *api.Client
	timeout time.Duration
	tty     bool
	workers int // overrides the example's worker count when set
	times   [][2]string
}

func runDemo(c *cli.Context) error {
	if c.NArg() > 0 {
		return commands.UsageErr("demo takes no arguments")
	}
	level := slog.LevelWarn
	if c.Bool("verbose") {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	data, err := os.MkdirTemp("", "stormdock-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(data)
	ctx := c.Context
	start := time.Now()
	// The tour's one tenant runs as its own uid with root; without, as the caller (up's
	// --run-as $USER), which cannot switch users.
	var runAs *isolation.User
	if os.Geteuid() != 0 {
		runAs = &isolation.User{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid())}
	}
	lc, err := daemon.StartLocal(ctx, daemon.LocalConfig{Nodes: c.Int("nodes"), DCs: []string{"dc-a", "dc-b", "dc-c"}, RacksPerDC: 2, Slots: c.Int("slots"),
		DataDir: data, API: "127.0.0.1:0", SessionTimeout: 2 * time.Second, Heartbeat: 250 * time.Millisecond, Logger: log, TLS: c.Bool("tls"), RunAs: runAs})
	if err != nil {
		return cli.Exit("stormdock demo: "+err.Error(), 1)
	}
	defer lc.Close(context.Background())
	tok, _ := os.ReadFile(lc.TokenPath())
	var opts []api.ClientOption
	if ca := lc.CAFile(); ca != "" {
		pool, err := api.CAPool(ca)
		if err != nil {
			return err
		}
		opts = append(opts, api.WithRootCAs(pool))
	}
	cl, err := api.NewClient(lc.API(), strings.TrimSpace(string(tok)), opts...)
	if err != nil {
		return err
	}
	d := &demo{w: c.App.Writer, cl: cl, timeout: c.Duration("timeout"), tty: commands.IsTerminal(c.App.Writer), workers: c.Int("workers")}
	mode := "in cgroups"
	if !lc.Confined() {
		mode = "as plain processes (not root: no cgroup limits)"
	}
	fmt.Fprintf(d.w, "local cluster: %d nodes in 3 data centers x 2 racks, workers run %s\n", len(lc.Nodes()), mode)
	fmt.Fprintf(d.w, "API %s, metrics %s/metrics (%s)\n\n", lc.API(), lc.API(), daemon.ScrapeHint(lc.API(), lc.MetricsTokenPath(), lc.CAFile()))
	if err := d.run(ctx, lc); err != nil {
		return cli.Exit("stormdock demo: "+err.Error(), 1)
	}
	fmt.Fprintln(d.w, "\nmeasured:")
	tw := tabwriter.NewWriter(d.w, 0, 0, 2, ' ', 0)
	for _, t := range d.times {
		fmt.Fprintf(tw, "  %s\t%s\n", t[0], t[1])
	}
	tw.Flush()
	fmt.Fprintf(d.w, "\ndemo done in %s; stopping the cluster\n", time.Since(start).Round(time.Millisecond))
	return nil
}

func (d *demo) run(ctx context.Context, lc *daemon.Local) error {
	if err := d.waitNodes(ctx, len(lc.Nodes())); err != nil {
		return err
	}
	spec, err := cluster.ParseJobSpec(examples.WordcountSpec)
	if err != nil {
		return fmt.Errorf("example job: %w", err)
	}
	specText := examples.WordcountSpec
	if d.workers > 0 {
		// A bigger run: no per-node cap, so that twice the workers fit the cluster.
		spec.Workers, spec.Placement.MaxPerNode = d.workers, 0
		if specText, err = json.Marshal(spec); err != nil {
			return err
		}
	}
	if err := d.cl.CreateTenant(ctx, cluster.Tenant{Name: spec.Tenant}); err != nil {
		return err
	}
	t0 := time.Now()
	if _, err := d.cl.SubmitJob(ctx, specText); err != nil {
		return err
	}
	fmt.Fprintf(d.w, "submitted %s: %d workers\n", spec.Name, spec.Workers)
	if err := d.settle(ctx, spec.Name, spec.Workers); err != nil {
		return err
	}
	d.note("submit to all running", time.Since(t0))

	for _, n := range []int{spec.Workers * 2, spec.Workers} {
		before, err := d.pids(ctx, spec.Name)
		if err != nil {
			return err
		}
		t0 = time.Now()
		if _, err := d.cl.ScaleJob(ctx, spec.Name, n); err != nil {
			return err
		}
		fmt.Fprintf(d.w, "scaled %s to %d workers\n", spec.Name, n)
		if err := d.settle(ctx, spec.Name, n); err != nil {
			return err
		}
		after, err := d.pids(ctx, spec.Name)
		if err != nil {
			return err
		}
		restarted := 0
		for k, pid := range before {
			if p, ok := after[k]; ok && p != pid {
				restarted++
			}
		}
		d.note(fmt.Sprintf("scale to %d, settled", n), time.Since(t0))
		d.times = append(d.times, [2]string{fmt.Sprintf("  workers restarted by scale to %d", n), fmt.Sprint(restarted)})
	}

	st, err := d.cl.Job(ctx, spec.Name)
	if err != nil {
		return err
	}
	victim := st.Workers[0].Node
	moving := 0
	for _, w := range st.Workers {
		if w.Node == victim {
			moving++
		}
	}
	t0 = time.Now()
	if err := lc.KillNode(ctx, victim); err != nil {
		return err
	}
	fmt.Fprintf(d.w, "killed node %s (%d workers of %s on it)\n", victim, moving, spec.Name)
	if err := d.settleAway(ctx, spec.Name, spec.Workers, victim); err != nil {
		return err
	}
	d.note("node loss to replacements running", time.Since(t0))

	if err := d.table(ctx, spec.Name); err != nil {
		return err
	}
	t0 = time.Now()
	if _, err := d.cl.KillJob(ctx, spec.Name, 0); err != nil {
		return err
	}
	if err := d.until(ctx, "job stopped", func() (bool, string, error) {
		st, err := d.cl.Job(ctx, spec.Name)
		if err != nil {
			return true, spec.Name + ": every worker stopped", nil
		}
		return false, fmt.Sprintf("%s: %d workers stopping", spec.Name, st.Summary.Running+st.Summary.Stopping), nil
	}); err != nil {
		return err
	}
	d.note("job kill to all stopped", time.Since(t0))
	return nil
}

func (d *demo) note(what string, took time.Duration) {
	d.times = append(d.times, [2]string{what, took.Round(time.Millisecond).String()})
}

// until polls cond, showing its progress line, until it holds or the timeout passes.
func (d *demo) until(ctx context.Context, what string, cond func() (bool, string, error)) error {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	last := ""
	for {
		ok, line, err := cond()
		if err != nil {
			return err
		}
		if line != last && d.tty {
			fmt.Fprintf(d.w, "\r  %-70s", line)
		}
		last = line
		if ok {
			if d.tty {
				fmt.Fprint(d.w, "\r"+strings.Repeat(" ", 74)+"\r")
			}
			fmt.Fprintf(d.w, "  %s\n", line)
			return nil
		}
		if ctxtime.Sleep(ctx, 100*time.Millisecond) != nil {
			return fmt.Errorf("%s: not done after %s (%s)", what, d.timeout, line)
		}
	}
}

func (d *demo) waitNodes(ctx context.Context, n int) error {
	return d.until(ctx, "nodes registered", func() (bool, string, error) {
		nodes, err := d.cl.Nodes(ctx)
		if err != nil {
			return false, "waiting for the master", nil
		}
		return len(nodes) == n, fmt.Sprintf("%d/%d nodes registered", len(nodes), n), nil
	})
}

// settle waits until the job has exactly n workers, all running where the plan says.
func (d *demo) settle(ctx context.Context, job string, n int) error {
	return d.settleAway(ctx, job, n, "")
}

func (d *demo) settleAway(ctx context.Context, job string, n int, avoid string) error {
	return d.until(ctx, job+" settled", func() (bool, string, error) {
		st, err := d.cl.Job(ctx, job)
		if err != nil {
			return false, "", err
		}
		for _, w := range st.Workers {
			if w.Node == avoid && avoid != "" {
				return false, fmt.Sprintf("%s: %d/%d running, re-placing", job, st.Summary.Running, n), nil
			}
		}
		line := fmt.Sprintf("%s: %d/%d running", job, st.Summary.Running, n)
		if st.Summary.Stopping > 0 {
			line += fmt.Sprintf(", %d stopping", st.Summary.Stopping)
		}
		return st.Summary.Running == n && len(st.Workers) == n && jobcmd.Settled(st), line, nil
	})
}

func (d *demo) pids(ctx context.Context, job string) (map[int]int, error) {
	st, err := d.cl.Job(ctx, job)
	if err != nil {
		return nil, err
	}
	out := map[int]int{}
	for _, w := range st.Workers {
		out[w.Worker] = w.PID
	}
	return out, nil
}

func (d *demo) table(ctx context.Context, job string) error {
	st, err := d.cl.Job(ctx, job)
	if err != nil {
		return err
	}
	fmt.Fprintf(d.w, "\n%s: %d/%d workers running\n", job, st.Summary.Running, st.Summary.Workers)
	tw := tabwriter.NewWriter(d.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tNODE\tDC\tRACK\tSTATE\tPID\tRESTARTS")
	for _, w := range st.Workers {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\n", w.Worker, w.Node, w.DC, w.Rack, w.State, w.PID, w.Restarts)
	}
	return tw.Flush()
}
