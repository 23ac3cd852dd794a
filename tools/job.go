package tools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
)

// JobCommand manages jobs on a master.
var JobCommand = &cli.Command{
	Name:  "job",
	Usage: "submit, inspect, scale and kill jobs",
	Subcommands: []*cli.Command{
		{
			Name:      "submit",
			Usage:     "submit a job spec (YAML or JSON)",
			ArgsUsage: "FILE",
			Flags: append(masterFlags(),
				&cli.BoolFlag{Name: "wait", Usage: "show progress until every worker runs"},
				&cli.DurationFlag{Name: "timeout", Usage: "with --wait: give up after this long", Value: 2 * time.Minute}),
			Action: jobSubmit,
		},
		{
			Name:   "list",
			Usage:  "list jobs",
			Flags:  append(masterFlags(), outputFlag),
			Action: jobList,
		},
		{
			Name:      "status",
			Usage:     "show every worker of a job: node, dc, rack, state, restarts, last exit",
			ArgsUsage: "NAME",
			Flags:     append(masterFlags(), outputFlag),
			Action:    jobStatus,
		},
		{
			Name:      "scale",
			Usage:     "change a job's worker count; workers that stay keep running",
			ArgsUsage: "NAME",
			Flags: append(masterFlags(),
				&cli.IntFlag{Name: "workers", Usage: "the new worker count", Required: true},
				&cli.BoolFlag{Name: "wait", Usage: "show progress until the job has settled"},
				&cli.DurationFlag{Name: "timeout", Usage: "with --wait: give up after this long", Value: 2 * time.Minute}),
			Action: jobScale,
		},
		{
			Name:      "kill",
			Usage:     "stop every worker of a job and remove it",
			ArgsUsage: "NAME",
			Flags: append(masterFlags(),
				&cli.DurationFlag{Name: "grace", Usage: "drain time after SIGTERM (default: the job's own)"},
				&cli.BoolFlag{Name: "wait", Usage: "wait until every worker has stopped"},
				&cli.DurationFlag{Name: "timeout", Usage: "with --wait: give up after this long", Value: 2 * time.Minute}),
			Action: jobKill,
		},
	},
}

func jobSubmit(c *cli.Context) error {
	if err := wantArgs(c, 1, "one job spec FILE"); err != nil {
		return err
	}
	data, err := os.ReadFile(c.Args().First())
	if err != nil {
		return usageErr("read job spec: %v", err)
	}
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	rec, err := cl.SubmitJob(c.Context, data)
	if err != nil {
		return apiErr(c, err)
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
	if err := wantName(c, "the job NAME"); err != nil {
		return err
	}
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	rec, err := cl.ScaleJob(c.Context, c.Args().First(), c.Int("workers"))
	if err != nil {
		return apiErr(c, err)
	}
	fmt.Fprintf(c.App.Writer, "job %s scaled to %d workers\n", rec.Spec.Name, rec.Spec.TotalWorkers())
	if c.Bool("wait") {
		return waitSettled(c, cl, rec.Spec.Name)
	}
	return nil
}

func jobKill(c *cli.Context) error {
	if err := wantName(c, "the job NAME"); err != nil {
		return err
	}
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	name := c.Args().First()
	rec, err := cl.KillJob(c.Context, name, c.Duration("grace"))
	if err != nil {
		return apiErr(c, err)
	}
	fmt.Fprintf(c.App.Writer, "job %s killed: workers stop within %s\n", name, rec.Spec.Grace())
	if !c.Bool("wait") {
		return nil
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	for {
		if _, err := cl.Job(ctx, name); err != nil {
			if errors.Is(err, api.ErrNotFound) {
				fmt.Fprintf(c.App.Writer, "job %s: every worker stopped\n", name)
				return nil
			}
			return apiErr(c, err)
		}
		select {
		case <-ctx.Done():
			return cli.Exit(fmt.Sprintf("stormdock: job %s still has workers after %s", name, c.Duration("timeout")), 1)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// waitSettled shows a progress line until every worker of the job runs, and explains what
// holds the rest when it gives up.
func waitSettled(c *cli.Context, cl *api.Client, name string) error {
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	start := time.Now()
	tty := isTerminal(c.App.Writer)
	last := ""
	for {
		// The summary alone, whatever the job's size; the workers are read once, to say
		// what holds the rest when it gives up.
		st, err := cl.JobSummary(ctx, name)
		if err == nil {
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
		select {
		case <-ctx.Done():
			if tty {
				fmt.Fprintln(c.App.Writer)
			}
			if err == nil {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(c.Context), 10*time.Second)
				st, err = cl.Job(rctx, name)
				cancel()
			}
			return cli.Exit("stormdock: "+notReady(st, err, c.Duration("timeout")), 1)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// settled reports that no worker is still being stopped or started.
func settled(st api.JobStatus) bool {
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
				s += " (last exit: " + w.LastExit + ")"
			}
			why = append(why, s)
		}
		if len(why) == 3 {
			break
		}
	}
	return fmt.Sprintf("job %s: %d of %d workers running after %s; %s", st.Summary.Name, st.Summary.Running, st.Summary.Workers, after, strings.Join(why, "; "))
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func jobList(c *cli.Context) error {
	if err := wantArgs(c, 0, "no arguments"); err != nil {
		return err
	}
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	jobs, err := cl.Jobs(c.Context)
	if err != nil {
		return apiErr(c, err)
	}
	return printOut(c, jobs, func(w io.Writer) {
		fmt.Fprintln(w, "NAME\tTENANT\tSTATE\tRUNNING\tWORKERS\tUNPLACED\tPRIORITY")
		for _, j := range jobs {
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%d\n", clip(j.Name, 24), clip(j.Tenant, 16), j.State, j.Running, j.Workers, j.Unplaced, j.Priority)
		}
	})
}

func jobStatus(c *cli.Context) error {
	if err := wantName(c, "the job NAME"); err != nil {
		return err
	}
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	st, err := cl.Job(c.Context, c.Args().First())
	if err != nil {
		return apiErr(c, err)
	}
	return printOut(c, st, func(w io.Writer) {
		s := st.Summary
		fmt.Fprintf(w, "job %s (tenant %s, %s): %d/%d running\n", s.Name, s.Tenant, s.State, s.Running, s.Workers)
		if sk := st.Sink; sk != nil {
			if sk.Fed {
				fmt.Fprintf(w, "sink fed from link %s by router %s, delivered up to offset %d\n", sk.Active, sk.Leader, sk.Delivered)
			} else {
				fmt.Fprintf(w, "sink NOT FED: %s\n", sk.Problem)
			}
		}
		if line := imageLine(st.Job); line != "" {
			fmt.Fprintln(w, line)
		}
		fmt.Fprintln(w, "WORKER\tNODE\tDC\tRACK\tSTATE\tPID\tRESTARTS\tLAST EXIT")
		for _, wv := range st.Workers {
			id := fmt.Sprint(wv.Worker)
			if wv.Link != "" {
				id = wv.Link + "/" + id
			}
			last := wv.LastExit
			if wv.Reason != "" {
				last = wv.Reason
			}
			pid := "-"
			if wv.PID != 0 {
				pid = fmt.Sprint(wv.PID)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", id, clip(wv.Node, 16), clip(wv.DC, 8), clip(wv.Rack, 8), wv.State, pid, wv.Restarts, clip(last, 72))
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
	return fmt.Sprintf("image %s not pinned yet (workers pull the tag; the master tries again): %s", p.Image, p.Error)
}
