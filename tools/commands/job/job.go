// Package job is `stormdock job`: submit, inspect, scale, update, roll back and kill jobs,
// and read their workers' logs, through a master's API.
package job

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/ctxtime"
	"github.com/stormdock/stormdock/tools/commands"
)

// Command manages jobs on a master.
var Command = &cli.Command{
	Name:  "job",
	Usage: "submit, inspect, scale and kill jobs",
	Subcommands: []*cli.Command{
		{
			Name:      "submit",
			Usage:     "submit a job spec (YAML or JSON)",
			ArgsUsage: "FILE",
			Flags: append(commands.MasterFlags(),
				&cli.BoolFlag{Name: "wait", Usage: "show progress until every worker runs"},
				&cli.DurationFlag{Name: "timeout", Usage: "with --wait: give up after this long", Value: 2 * time.Minute}),
			Action: jobSubmit,
		},
		{
			Name:   "list",
			Usage:  "list jobs",
			Flags:  append(commands.MasterFlags(), commands.OutputFlag),
			Action: jobList,
		},
		{
			Name:      "status",
			Usage:     "show every worker of a job: node, dc, rack, state, restarts, last exit",
			ArgsUsage: "NAME",
			Flags:     append(commands.MasterFlags(), commands.OutputFlag),
			Action:    jobStatus,
		},
		{
			Name:      "scale",
			Usage:     "change a job's worker count; workers that stay keep running",
			ArgsUsage: "NAME",
			Flags: append(commands.MasterFlags(),
				&cli.IntFlag{Name: "workers", Usage: "the new worker count", Required: true},
				&cli.BoolFlag{Name: "wait", Usage: "show progress until the job has settled"},
				&cli.DurationFlag{Name: "timeout", Usage: "with --wait: give up after this long", Value: 2 * time.Minute}),
			Action: jobScale,
		},
		{
			Name:      "update",
			Usage:     "change a running job's spec: a new generation, rolled out to the workers whose run changes",
			ArgsUsage: "FILE",
			Description: "The spec's update: block says how (maxParallel, canary, by, minHealthy, deadline, autoRevert);\n" +
				"the flags override it. Workers whose command, image, env (but liveEnv keys), resources or node\n" +
				"change are replaced, stop then start, maxParallel at a time; the others take the new generation live.",
			Flags:  append(append(commands.MasterFlags(), policyFlags()...), waitFlags()...),
			Action: jobUpdate,
		},
		{
			Name:      "history",
			Usage:     "list a job's generations: when, who, and how each spec differs from the one before",
			ArgsUsage: "NAME",
			Flags:     append(commands.MasterFlags(), commands.OutputFlag),
			Action:    jobHistory,
		},
		{
			Name:      "rollback",
			Usage:     "roll a job back to an earlier generation's spec (as a new generation)",
			ArgsUsage: "NAME",
			Flags: append(append(append(commands.MasterFlags(),
				&cli.Int64Flag{Name: "to", Usage: "the generation `GEN` to go back to (default: the one before the current)"}),
				policyFlags()...), waitFlags()...),
			Action: jobRollback,
		},
		{
			Name:      "promote",
			Usage:     "accept a rollout's canaries: the rest of the workers follow",
			ArgsUsage: "NAME",
			Flags:     append(commands.MasterFlags(), waitFlags()...),
			Action:    rolloutAction("promote"),
		},
		{
			Name:      "pause",
			Usage:     "stop a rollout after the replacements under way",
			ArgsUsage: "NAME",
			Flags:     commands.MasterFlags(),
			Action:    rolloutAction("pause"),
		},
		{
			Name:      "resume",
			Usage:     "continue a paused (or failed) rollout",
			ArgsUsage: "NAME",
			Flags:     append(commands.MasterFlags(), waitFlags()...),
			Action:    rolloutAction("resume"),
		},
		{
			Name:      "restart",
			Usage:     "restart a job's workers in place, rolling, with the job's update rules",
			ArgsUsage: "NAME",
			Flags: append(append(commands.MasterFlags(),
				&cli.IntSliceFlag{Name: "worker", Usage: "restart only worker `N` (repeat for more)"},
				&cli.StringFlag{Name: "by", Usage: "replace one failure domain at a time: `BY` is worker, node, rack or dc (default: the spec's update.by)"},
				&cli.IntFlag{Name: "max-parallel", Usage: "`N` workers restarted at once (default: the spec's update.maxParallel, else 1)"}),
				waitFlags()...),
			Action: jobRestart,
		},
		{
			Name:      "kill",
			Usage:     "stop every worker of a job and remove it",
			ArgsUsage: "NAME",
			Flags: append(commands.MasterFlags(),
				&cli.DurationFlag{Name: "grace", Usage: "drain time after SIGTERM (default: the job's own)"},
				&cli.BoolFlag{Name: "wait", Usage: "wait until every worker has stopped"},
				&cli.DurationFlag{Name: "timeout", Usage: "with --wait: give up after this long", Value: 2 * time.Minute}),
			Action: jobKill,
		},
		jobLogsCommand,
		jobTopCommand,
		jobMetricsCommand,
		jobAutoscaleCommand,
	},
}

func jobSubmit(c *cli.Context) error {
	if err := commands.WantArgs(c, 1, "one job spec FILE"); err != nil {
		return err
	}
	data, err := os.ReadFile(c.Args().First())
	if err != nil {
		return commands.UsageErr("read job spec: %v", err)
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	rec, err := cl.SubmitJob(c.Context, data)
	if err != nil {
		return commands.APIErr(c, err)
	}
	fmt.Fprintf(c.App.Writer, "job %s submitted: %d workers for tenant %s\n", rec.Spec.Name, rec.Spec.TotalWorkers(), rec.Spec.Tenant)
	if line := imageLine(rec); line != "" {
		fmt.Fprintln(c.App.Writer, line)
	}
	if c.Bool("wait") {
		return waitSettled(c, cl, rec.Spec.Name)
	}
	return nil
}

func jobScale(c *cli.Context) error {
	if err := commands.WantName(c, "the job NAME"); err != nil {
		return err
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	rec, err := cl.ScaleJob(c.Context, c.Args().First(), c.Int("workers"))
	if err != nil {
		return commands.APIErr(c, err)
	}
	fmt.Fprintf(c.App.Writer, "job %s scaled to %d workers\n", rec.Spec.Name, rec.Spec.TotalWorkers())
	if rec.Spec.Scaling != nil {
		fmt.Fprintf(c.App.Writer, "its scaling policy is paused: resume it with `stormdock job autoscale %s --resume`\n", rec.Spec.Name)
	}
	if c.Bool("wait") {
		return waitSettled(c, cl, rec.Spec.Name)
	}
	return nil
}

func jobKill(c *cli.Context) error {
	if err := commands.WantName(c, "the job NAME"); err != nil {
		return err
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	name := c.Args().First()
	rec, err := cl.KillJob(c.Context, name, c.Duration("grace"))
	if err != nil {
		return commands.APIErr(c, err)
	}
	fmt.Fprintf(c.App.Writer, "job %s killed: workers stop within %s\n", name, rec.Spec.Grace())
	if !c.Bool("wait") {
		return nil
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	jw := watchJob(cl, name)
	for {
		_, err := jw.next(ctx)
		if ctx.Err() != nil {
			return cli.Exit(fmt.Sprintf("stormdock: job %s still has workers after %s", name, c.Duration("timeout")), 1)
		}
		if err != nil {
			if errors.Is(err, api.ErrNotFound) {
				fmt.Fprintf(c.App.Writer, "job %s: every worker stopped\n", name)
				return nil
			}
			return commands.APIErr(c, err)
		}
	}
}

// waitSettled shows a progress line until every worker of the job runs, and explains what
// holds the rest when it gives up.
func waitSettled(c *cli.Context, cl *api.Client, name string) error {
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	start := time.Now()
	tty := commands.IsTerminal(c.App.Writer)
	last := ""
	jw := watchJob(cl, name)
	var lastErr error // of the last read that was answered
	for {
		// The summary alone, whatever the job's size; the workers are read once, to say
		// what holds the rest when it gives up.
		st, err := jw.next(ctx)
		if ctx.Err() != nil {
			break
		}
		lastErr = err
		if err != nil {
			continue
		}
		s := st.Summary
		line := fmt.Sprintf("%s: %d/%d running", name, s.Running, s.Workers)
		if s.Unplaced > 0 {
			line += fmt.Sprintf(", %d unplaced", s.Unplaced)
		}
		if s.Stopping > 0 {
			line += fmt.Sprintf(", %d stopping", s.Stopping)
		}
		if line != last {
			if tty {
				fmt.Fprintf(c.App.Writer, "\r%-60s", line)
			} else {
				fmt.Fprintln(c.App.Writer, line)
			}
			last = line
		}
		if s.Running == s.Workers && s.Stopping == 0 {
			if tty {
				fmt.Fprintln(c.App.Writer)
			}
			fmt.Fprintf(c.App.Writer, "%s: all %d workers running after %s\n", name, s.Workers, time.Since(start).Round(time.Millisecond))
			return nil
		}
	}
	if tty {
		fmt.Fprintln(c.App.Writer)
	}
	var st api.JobStatus
	err := lastErr
	if err == nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(c.Context), 10*time.Second)
		st, err = cl.Job(rctx, name)
		cancel()
	}
	return cli.Exit("stormdock: "+notReady(st, err, c.Duration("timeout")), 1)
}

// jobWatch reads a job's record and summary (GET /v1/jobs/NAME?workers=false) each time
// they change, by blocking queries: the master holds each read until the answer differs
// from the one before, so a wait costs a request per change, not one per poll. A master
// that gives no index (one from before blocking queries), or a read that failed, is read
// again after a pause (pollInterval).
type jobWatch struct {
	cl    *api.Client
	name  string
	index uint64
	pause bool
	poll  pollInterval
}

func watchJob(cl *api.Client, name string) *jobWatch { return &jobWatch{cl: cl, name: name} }

// next returns the job as it is now the first time, and then once it changed (or the
// master's wait ended: the same answer). A job that does not exist is ErrNotFound; the
// next call then returns when it comes.
func (w *jobWatch) next(ctx context.Context) (api.JobStatus, error) {
	if w.pause {
		if err := ctxtime.Sleep(ctx, w.poll.next()); err != nil {
			return api.JobStatus{}, err
		}
	}
	st, meta, err := w.cl.JobSummaryWith(ctx, w.name, api.QueryOptions{WaitIndex: w.index})
	w.index = meta.LastIndex
	w.pause = w.index == 0
	return st, err
}

// pollInterval is the wait between two reads of a job by --wait when the master gives no
// index to wait on (or a read failed): 20ms for the first second, as workers usually start
// within a fraction of one, then growing to 200ms for long waits (image pulls, grace
// periods). A read is one cheap request to the master's view.
type pollInterval struct {
	n int
	d time.Duration
}

func (p *pollInterval) next() time.Duration {
	p.n++
	switch {
	case p.n <= 50:
		p.d = 20 * time.Millisecond
	case p.d < 200*time.Millisecond:
		p.d = min(p.d*3/2, 200*time.Millisecond)
	}
	return p.d
}

// Settled reports that no worker of the job is still being stopped or started.
func Settled(st api.JobStatus) bool {
	if st.Summary.Stopping > 0 {
		return false
	}
	for _, w := range st.Workers {
		if w.State != "running" {
			return false
		}
	}
	return true
}

// notReady says why a job did not get all its workers running.
func notReady(st api.JobStatus, err error, after time.Duration) string {
	if err != nil {
		return fmt.Sprintf("job %s: %v", st.Summary.Name, err)
	}
	var why []string
	for _, w := range st.Workers {
		switch {
		case w.Reason != "":
			why = append(why, fmt.Sprintf("worker %d unplaced: %s", w.Worker, w.Reason))
		case w.State != "running":
			s := fmt.Sprintf("worker %d on %s is %s", w.Worker, w.Node, w.State)
			if w.LastExit != "" {
				s += " (last exit: " + lastExit(w) + ")"
			}
			why = append(why, s)
		}
		if len(why) == 3 {
			break
		}
	}
	return fmt.Sprintf("job %s: %d of %d workers running after %s; %s", st.Summary.Name, st.Summary.Running, st.Summary.Workers, after, strings.Join(why, "; "))
}

func jobList(c *cli.Context) error {
	if err := commands.WantArgs(c, 0, "no arguments"); err != nil {
		return err
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	jobs, err := cl.Jobs(c.Context)
	if err != nil {
		return commands.APIErr(c, err)
	}
	return commands.PrintOut(c, jobs, func(w io.Writer) {
		fmt.Fprintln(w, "NAME\tTENANT\tSTATE\tRUNNING\tWORKERS\tUNPLACED\tPRIORITY\tGEN\tROLLOUT")
		for _, j := range jobs {
			ro := j.Rollout
			if ro == "" {
				ro = "-"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", commands.Clip(j.Name, 24), commands.Clip(j.Tenant, 16), j.State, j.Running, j.Workers, j.Unplaced, j.Priority, j.Generation, ro)
		}
	})
}

func jobStatus(c *cli.Context) error {
	if err := commands.WantName(c, "the job NAME"); err != nil {
		return err
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	st, err := cl.Job(c.Context, c.Args().First())
	if err != nil {
		return commands.APIErr(c, err)
	}
	return commands.PrintOut(c, st, func(w io.Writer) {
		s := st.Summary
		fmt.Fprintf(w, "job %s (tenant %s, %s): %d/%d running\n", s.Name, s.Tenant, s.State, s.Running, s.Workers)
		if sk := st.Sink; sk != nil {
			if sk.Fed {
				fmt.Fprintf(w, "sink fed from link %s by router %s, delivered up to offset %d\n", sk.Active, sk.Leader, sk.Delivered)
			} else {
				fmt.Fprintf(w, "sink NOT FED: %s\n", sk.Problem)
			}
			if sk.SharedDC != "" {
				fmt.Fprintf(w, "routers: both in data center %s: its loss would stop the output until a router starts elsewhere (the standby moves as soon as another data center has room)\n", sk.SharedDC)
			}
		}
		if line := imageLine(st.Job); line != "" {
			fmt.Fprintln(w, line)
		}
		fmt.Fprintf(w, "generation %d\n", st.Job.Generation)
		if ro := st.Job.Rollout; ro != nil {
			fmt.Fprintln(w, rolloutLine(st.Job))
		}
		for _, line := range autoscaleLines(st.Job) {
			fmt.Fprintln(w, line)
		}
		fmt.Fprintln(w, "WORKER\tNODE\tDC\tRACK\tSTATE\tGEN\tPID\tRESTARTS\tLAST EXIT")
		for _, wv := range st.Workers {
			id := fmt.Sprint(wv.Worker)
			if wv.Link != "" {
				id = wv.Link + "/" + id
			}
			last := lastExit(wv)
			if wv.Reason != "" {
				last = wv.Reason
			}
			pid := "-"
			if wv.PID != 0 {
				pid = fmt.Sprint(wv.PID)
			}
			gen := "-"
			if wv.Generation != 0 {
				gen = fmt.Sprint(wv.Generation)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", id, commands.Clip(wv.Node, 16), commands.Clip(wv.DC, 8), commands.Clip(wv.Rack, 8), wv.State, gen, pid, wv.Restarts, commands.Clip(last, 72))
		}
		for _, a := range st.Avoided {
			fmt.Fprintf(w, "avoided: node %s until %s after crash loop %d there (used only when nothing else fits)\n",
				commands.Clip(a.Node, 20), a.Until.UTC().Format(time.RFC3339), a.Strikes)
		}
	})
}

// imageLine says which image a job's current generation runs: pinned to a digest, or why
// not yet.
func imageLine(rec cluster.JobRecord) string {
	p := rec.Image
	switch {
	case p == nil:
		return ""
	case p.Ref != "":
		return fmt.Sprintf("image %s pinned for generation %d: %s", p.Image, p.Generation, p.Ref)
	}
	if p.NoAccess {
		return fmt.Sprintf("image %s not pinned, no worker will run it (the master tries again): %s", p.Image, p.Error)
	}
	return fmt.Sprintf("image %s not pinned yet (workers pull the tag; the master tries again): %s", p.Image, p.Error)
}

// policyFlags override a spec's update: block.
func policyFlags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: "max-parallel", Usage: "`N` workers replaced at once (update.maxParallel)"},
		&cli.IntFlag{Name: "canary", Usage: "`N` workers replaced first and held until job promote (update.canary)"},
		&cli.StringFlag{Name: "by", Usage: "replace one failure domain at a time: `BY` is worker, node, rack or dc (update.by)"},
		&cli.DurationFlag{Name: "min-healthy", Usage: "a replaced worker must run `D` without a restart to be healthy (update.minHealthy)"},
		&cli.DurationFlag{Name: "deadline", Usage: "a replacement not healthy within `D` fails the update (update.deadline)"},
		&cli.BoolFlag{Name: "auto-revert", Usage: "a failed update puts the replaced workers back on the previous generation (update.autoRevert)"},
	}
}

// waitFlags follow a rollout.
func waitFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "wait", Usage: "show the rollout's progress until it is done, fails or waits for an operator"},
		&cli.DurationFlag{Name: "timeout", Usage: "with --wait: give up after this long", Value: 30 * time.Minute},
	}
}

// overrides reads the policy flags that were given.
func overrides(c *cli.Context) (api.PolicyOverrides, error) {
	var o api.PolicyOverrides
	if c.IsSet("max-parallel") {
		v := c.Int("max-parallel")
		if v < 1 {
			return o, commands.UsageErr("--max-parallel must be at least 1")
		}
		o.MaxParallel = &v
	}
	if c.IsSet("canary") {
		v := c.Int("canary")
		if v < 0 {
			return o, commands.UsageErr("--canary must not be negative")
		}
		o.Canary = &v
	}
	if c.IsSet("by") {
		v := c.String("by")
		if !slices.Contains([]string{cluster.RolloutByWorker, cluster.RolloutByNode, cluster.RolloutByRack, cluster.RolloutByDC}, v) {
			return o, commands.UsageErr("--by must be worker, node, rack or dc, not %q", v)
		}
		o.By = &v
	}
	for _, f := range []struct {
		name string
		dst  **cluster.Duration
	}{{"min-healthy", &o.MinHealthy}, {"deadline", &o.Deadline}} {
		if c.IsSet(f.name) {
			d := c.Duration(f.name)
			if d <= 0 {
				return o, commands.UsageErr("--%s must be more than 0", f.name)
			}
			v := cluster.Duration(d)
			*f.dst = &v
		}
	}
	if c.IsSet("auto-revert") {
		v := c.Bool("auto-revert")
		o.AutoRevert = &v
	}
	return o, nil
}

func jobUpdate(c *cli.Context) error {
	if err := commands.WantArgs(c, 1, "one job spec FILE"); err != nil {
		return err
	}
	data, err := os.ReadFile(c.Args().First())
	if err != nil {
		return commands.UsageErr("read job spec: %v", err)
	}
	// Read here for the job's name (and to refuse a bad spec before any request); the master
	// checks it again.
	spec, err := cluster.ParseJobSpec(data)
	if err != nil {
		return commands.UsageErr("%v", err)
	}
	o, err := overrides(c)
	if err != nil {
		return err
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	up, err := cl.UpdateJob(c.Context, spec.Name, data, o)
	if err != nil {
		return commands.APIErr(c, err)
	}
	return rolloutStarted(c, cl, up)
}

func jobRollback(c *cli.Context) error {
	if err := commands.WantName(c, "the job NAME"); err != nil {
		return err
	}
	if c.Int64("to") < 0 {
		return commands.UsageErr("--to must be a generation (1 or more)")
	}
	o, err := overrides(c)
	if err != nil {
		return err
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	up, err := cl.RollbackJob(c.Context, c.Args().First(), c.Int64("to"), o)
	if err != nil {
		return commands.APIErr(c, err)
	}
	return rolloutStarted(c, cl, up)
}

// rolloutStarted reports an update's or rollback's outcome and, with --wait, follows it.
func rolloutStarted(c *cli.Context, cl *api.Client, up api.UpdateReply) error {
	rec := up.Job
	if !up.Changed {
		fmt.Fprintf(c.App.Writer, "job %s: spec unchanged, still generation %d\n", rec.Spec.Name, rec.Generation)
		return nil
	}
	ro := rec.Rollout
	p := ro.Policy
	fmt.Fprintf(c.App.Writer, "job %s: generation %d (from %d), rollout %d: by %s, %d at a time", rec.Spec.Name, rec.Generation, ro.From, ro.ID, p.By, p.MaxParallel)
	if p.Canary > 0 {
		fmt.Fprintf(c.App.Writer, ", %d canaries first", p.Canary)
	}
	fmt.Fprintf(c.App.Writer, ", healthy after %s, deadline %s", p.MinHealthy, p.Deadline)
	if p.AutoRevert {
		fmt.Fprint(c.App.Writer, ", auto-revert")
	}
	fmt.Fprintln(c.App.Writer)
	if line := imageLine(rec); line != "" {
		fmt.Fprintln(c.App.Writer, line)
	}
	if c.Bool("wait") {
		return waitRollout(c, cl, rec.Spec.Name, ro.ID)
	}
	return nil
}

func jobRestart(c *cli.Context) error {
	if err := commands.WantName(c, "the job NAME"); err != nil {
		return err
	}
	req := api.RestartRequest{Workers: c.IntSlice("worker"), By: c.String("by"), MaxParallel: c.Int("max-parallel")}
	for _, w := range req.Workers {
		if w < 0 {
			return commands.UsageErr("--worker must be a worker index (0 or more), not %d", w)
		}
	}
	if c.IsSet("max-parallel") && req.MaxParallel < 1 {
		return commands.UsageErr("--max-parallel must be at least 1")
	}
	if req.By != "" && !slices.Contains([]string{cluster.RolloutByWorker, cluster.RolloutByNode, cluster.RolloutByRack, cluster.RolloutByDC}, req.By) {
		return commands.UsageErr("--by must be worker, node, rack or dc, not %q", req.By)
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	rec, err := cl.RestartJob(c.Context, c.Args().First(), req)
	if err != nil {
		return commands.APIErr(c, err)
	}
	ro := rec.Rollout
	fmt.Fprintf(c.App.Writer, "job %s: rolling restart (rollout %d) of %d workers, by %s, %d at a time\n", rec.Spec.Name, ro.ID, ro.Total, ro.Policy.By, ro.Policy.MaxParallel)
	if c.Bool("wait") {
		return waitRollout(c, cl, rec.Spec.Name, ro.ID)
	}
	return nil
}

// rolloutAction is `job pause`, `job resume` and `job promote`.
func rolloutAction(action string) cli.ActionFunc {
	return func(c *cli.Context) error {
		if err := commands.WantName(c, "the job NAME"); err != nil {
			return err
		}
		cl, err := commands.NewClient(c)
		if err != nil {
			return err
		}
		rec, err := cl.RolloutAction(c.Context, c.Args().First(), action)
		if err != nil {
			return commands.APIErr(c, err)
		}
		fmt.Fprintln(c.App.Writer, rolloutLine(rec))
		if action != "pause" && c.Bool("wait") {
			return waitRollout(c, cl, rec.Spec.Name, rec.Rollout.ID)
		}
		return nil
	}
}

// rolloutLine is a job's rollout in one line.
func rolloutLine(rec cluster.JobRecord) string {
	ro := rec.Rollout
	line := ro.Summary()
	switch ro.State {
	case cluster.RolloutCanary:
		line += fmt.Sprintf("; promote with `stormdock job promote %s` or roll back with `stormdock job rollback %s`", rec.Spec.Name, rec.Spec.Name)
	case cluster.RolloutPaused, cluster.RolloutFailed:
		line += fmt.Sprintf("; continue with `stormdock job resume %s`", rec.Spec.Name)
	}
	return line
}

// waitRollout follows rollout id of a job until it is done (exit 0), fails or is reverted
// (exit 1), or waits for an operator (paused, awaiting promotion: exit 0).
func waitRollout(c *cli.Context, cl *api.Client, name string, id int64) error {
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	start := time.Now()
	last := ""
	jw := watchJob(cl, name)
	for {
		st, err := jw.next(ctx)
		if ctx.Err() != nil {
			return cli.Exit(fmt.Sprintf("stormdock: job %s: rollout not done after %s: %s", name, c.Duration("timeout"), last), 1)
		}
		if err == nil && st.Job.Rollout != nil && st.Job.Rollout.ID >= id {
			ro := st.Job.Rollout
			if line := ro.Summary(); line != last {
				fmt.Fprintf(c.App.Writer, "%s %s\n", time.Since(start).Round(100*time.Millisecond), line)
				last = line
			}
			switch ro.State {
			case cluster.RolloutDone:
				fmt.Fprintf(c.App.Writer, "job %s: every worker on generation %d after %s\n", name, ro.To, time.Since(start).Round(time.Millisecond))
				return nil
			case cluster.RolloutReverted:
				return cli.Exit(fmt.Sprintf("stormdock: job %s: update failed and reverted to generation %d: %s", name, ro.To, ro.Reason), 1)
			case cluster.RolloutFailed:
				return cli.Exit(fmt.Sprintf("stormdock: job %s: rollout failed: %s (workers replaced so far stay; `stormdock job resume %s` tries again, `stormdock job rollback %s` goes back)", name, ro.Reason, name, name), 1)
			case cluster.RolloutCanary, cluster.RolloutPaused:
				fmt.Fprintln(c.App.Writer, rolloutLine(st.Job))
				return nil
			}
		}
	}
}

func jobHistory(c *cli.Context) error {
	if err := commands.WantName(c, "the job NAME"); err != nil {
		return err
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	h, err := cl.JobHistory(c.Context, c.Args().First())
	if err != nil {
		return commands.APIErr(c, err)
	}
	return commands.PrintOut(c, h, func(w io.Writer) {
		fmt.Fprintln(w, "GEN\tWHEN\tWHO\tKIND\tCHANGES")
		for _, g := range h.Generations {
			gen := fmt.Sprint(g.Generation)
			if g.Generation == h.Current {
				gen += "*"
			}
			who := g.Who
			if who == "" {
				who = "-"
			}
			first := "-"
			if g.Kind == "submit" {
				first = "submitted"
			}
			changes := make([]string, 0, len(g.Changes))
			for _, ch := range g.Changes {
				changes = append(changes, fmt.Sprintf("%s: %s -> %s", ch.Field, orNone(ch.From), orNone(ch.To)))
			}
			if len(changes) > 0 {
				first = changes[0]
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", gen, g.At.Local().Format("2006-01-02 15:04:05"), commands.Clip(who, 20), g.Kind, commands.Clip(first, 80))
			for _, ch := range changes[min(1, len(changes)):] {
				fmt.Fprintf(w, "\t\t\t\t%s\n", commands.Clip(ch, 80))
			}
		}
	})
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return fmt.Sprintf("%q", s)
}

// lastExit says how a worker last ended and whose fault it was: "crashed: exited with code
// 3" counts as a crash, a stop for a lapsed lease or by stormdock does not.
func lastExit(w api.WorkerView) string {
	if w.LastExit == "" || w.ExitReason != cluster.ExitCrashed {
		return w.LastExit
	}
	return "crashed: " + w.LastExit
}
