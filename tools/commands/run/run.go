// Package run is `stormdock run`: one worker in the foreground under an isolation driver,
// with its limits, as an agent would run it.
package run

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/daemon"
	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/tools/commands"
)

// Limits of a worker started by `stormdock run` that names none: the resources of the job
// spec reference (docs/job-spec.md) and the design, enough for the example worker and for trying a driver.
const (
	runMemory = "256Mi"
	runCPU    = "0.5"
)

// Command runs one worker in the foreground under an isolation driver.
var Command = &cli.Command{
	Name:      "run",
	Usage:     "run one worker in the foreground with its limits, and report how it ended",
	UsageText: "stormdock run [--isolation process|docker] [--memory " + runMemory + "] [--cpu " + runCPU + "] [--image T] [flags] -- CMD [ARGS...]",
	Description: "Flags go first, then -- and the command. As in a job spec, a command whose program is exactly\n" +
		"`stormdock` runs this stormdock binary (/stormdock inside stormdock images).\n" +
		"Ctrl-C stops the worker: SIGTERM, then SIGKILL after --grace.\n" +
		"The exit status is the worker's (128+signal when killed; 137 when OOM-killed at its memory limit).",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "isolation", Usage: "process (cgroups) or docker", Value: cluster.IsolationProcess},
		&cli.StringFlag{Name: "memory", Usage: "memory limit, swap included (`QUANTITY`: Ki Mi Gi or k M G)", Value: runMemory},
		&cli.StringFlag{Name: "cpu", Usage: "cpu limit in `CORES` (0.5 or 500m)", Value: runCPU},
		&cli.Int64Flag{Name: "pids", Usage: "process and thread limit", Value: isolation.DefaultPids},
		&cli.StringFlag{Name: "image", Usage: "docker `IMAGE` (built with stormdock image build)"},
		&cli.DurationFlag{Name: "grace", Usage: "time between SIGTERM and SIGKILL when stopped", Value: isolation.DefaultGrace},
		&cli.StringFlag{Name: "id", Usage: "worker id (default run-PID)"},
		&cli.StringSliceFlag{Name: "env", Usage: "`KEY=VALUE` for the worker (repeatable)"},
		&cli.StringFlag{Name: "cgroup-parent", Usage: "cgroup holding the worker's cgroup (process)", Value: "/stormdock"},
		&cli.StringFlag{Name: "state-dir", Usage: "driver state and log `DIR` (default: a temporary one, removed afterwards)"},
	},
	Action: runWorker,
}

func runWorker(c *cli.Context) error {
	if c.NArg() == 0 {
		return commands.UsageErr("run needs a command after the flags: stormdock run [--memory %s] [--cpu %s] -- CMD [ARGS...]", runMemory, runCPU)
	}
	mem, err := cluster.ParseBytes(c.String("memory"))
	if err != nil {
		return commands.UsageErr("--memory: %v", err)
	}
	cpu, err := cluster.ParseCPU(c.String("cpu"))
	if err != nil {
		return commands.UsageErr("--cpu: %v", err)
	}
	env := map[string]string{}
	for _, kv := range c.StringSlice("env") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return commands.UsageErr("--env %q: want KEY=VALUE", kv)
		}
		env[k] = v
	}
	host, _ := os.Hostname()
	spec := isolation.Spec{
		ID: c.String("id"), Job: "run", Tenant: "local", Node: host,
		Command: runCommand(c.Args().Slice(), c.String("isolation")), Env: env, Image: c.String("image"),
		MemoryBytes: int64(mem), MilliCPU: int64(cpu), Pids: c.Int64("pids"), Grace: c.Duration("grace"),
	}
	if spec.ID == "" {
		spec.ID = fmt.Sprintf("run-%d", os.Getpid())
	}
	if err := spec.Validate(); err != nil {
		return commands.UsageErr("%v", err)
	}
	stateDir := c.String("state-dir")
	if stateDir == "" {
		if stateDir, err = os.MkdirTemp("", "stormdock-run-"); err != nil {
			return cli.Exit("stormdock run: "+err.Error(), 1)
		}
		defer os.RemoveAll(stateDir)
	}

	// The command's context ends on Ctrl-C: that is the request to stop. The driver's own
	// calls get a context of their own, so the stop itself is not cut short.
	ctx := context.WithoutCancel(c.Context)
	// The drivers' progress lines repeat what this command prints; keep their warnings.
	quiet := slog.New(slog.NewTextHandler(c.App.ErrWriter, &slog.HandlerOptions{Level: slog.LevelWarn}))
	mode := c.String("isolation")
	switch mode {
	case cluster.IsolationProcess:
	case cluster.IsolationDocker:
		if spec.Image == "" {
			return commands.UsageErr("--isolation docker needs --image (build one with `stormdock image build`)")
		}
	default:
		return commands.UsageErr("--isolation must be %s or %s, not %q", cluster.IsolationProcess, cluster.IsolationDocker, mode)
	}
	drivers, err := daemon.NewDrivers(ctx, daemon.DriverConfig{Isolation: []string{mode}, CgroupParent: c.String("cgroup-parent"),
		ProcessState: stateDir, Node: "run-" + host, Logger: quiet})
	if err != nil {
		return runErr(err)
	}
	defer drivers.Close()
	drv := drivers.List[0]

	w, err := drv.Start(ctx, spec)
	if err != nil {
		return runErr(err)
	}
	who := fmt.Sprintf("pid %d", w.PID)
	if w.ContainerID != "" {
		who = "container " + w.ContainerID[:12]
	}
	fmt.Fprintf(c.App.ErrWriter, "stormdock run: worker %s started (%s; memory %s, cpu %s, pids %d)\n",
		spec.ID, who, isolation.FormatBytes(spec.MemoryBytes), isolation.FormatCPU(spec.MilliCPU), spec.PidsLimit())

	followCtx, stopFollow := context.WithCancel(ctx)
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		follow(followCtx, w.LogPath, w.ContainerID != "", c.App.Writer)
	}()

	var ex isolation.Exit
	waited := make(chan error, 1)
	go func() {
		var err error
		ex, err = drv.Wait(ctx, spec.ID)
		waited <- err
	}()
	select {
	case err = <-waited:
	case <-c.Context.Done():
		fmt.Fprintf(c.App.ErrWriter, "stormdock run: stopping %s (grace %s)\n", spec.ID, spec.GracePeriod())
		err = <-waitAfterStop(ctx, drv, spec, waited)
	}
	if err != nil {
		stopFollow()
		<-followed
		return runErr(err)
	}
	if w.ContainerID != "" {
		// The engine's log copier may write a container's last output after its end; a
		// process worker's output is in its log file by the time it has exited, and follow
		// reads the file once more when stopped.
		time.Sleep(followPoll)
	}
	stopFollow()
	<-followed
	// Release what the worker held (cgroup, container); it has ended, so this does not wait.
	// Only now: removing a container removes its log, and with it output not yet echoed.
	if _, err := drv.Stop(ctx, spec.ID, 0); err != nil && !errors.Is(err, isolation.ErrNotFound) {
		fmt.Fprintf(c.App.ErrWriter, "stormdock run: release %s: %v\n", spec.ID, err)
	}
	discard(ctx, drv, spec.ID)
	msg := fmt.Sprintf("stormdock run: worker %s %s", spec.ID, ex)
	if ex.Success() {
		fmt.Fprintln(c.App.ErrWriter, msg)
		return nil
	}
	code := ex.Code
	if code <= 0 || code > 255 {
		code = 1
	}
	return cli.Exit(msg, code)
}

// runCommand applies the agent's rule for a program named exactly `stormdock` (see
// agents.ResolveSelf): it runs this binary, or the image's copy in a container.
func runCommand(cmd []string, mode string) []string {
	self, err := os.Executable()
	if err != nil {
		self = agents.SelfCommand // not knowing where this binary is, leave it to PATH
	}
	return agents.ResolveSelf(cmd, agents.SelfPath(mode, self, agents.DefaultContainerSelf))
}

// waitAfterStop stops the worker with its grace period and then delivers Wait's result.
func waitAfterStop(ctx context.Context, drv isolation.Driver, spec isolation.Spec, waited <-chan error) <-chan error {
	out := make(chan error, 1)
	if _, err := drv.Stop(ctx, spec.ID, spec.GracePeriod()); err != nil {
		out <- err
		return out
	}
	discard(ctx, drv, spec.ID)
	// Stop forgot the worker; Wait, still pending or already done, reports the exit it saw.
	return waited
}

// runErr exits 2 for what the user can fix in the command line, 1 otherwise.
func runErr(err error) error {
	msg := "stormdock run: " + strings.ReplaceAll(err.Error(), "\n", "; ")
	if errors.Is(err, isolation.ErrInvalidSpec) || errors.Is(err, isolation.ErrImageNotFound) || errors.Is(err, isolation.ErrExists) {
		return cli.Exit(msg, 2)
	}
	return cli.Exit(msg, 1)
}

const followPoll = 100 * time.Millisecond

// follow copies a worker's log to w as it grows, until ctx ends, reading it once more then.
// A docker json-file log holds one JSON object per line; its "log" field is the output.
func follow(ctx context.Context, path string, jsonLines bool, w io.Writer) {
	if path == "" {
		return
	}
	var off int64
	var partial string
	t := time.NewTicker(followPoll)
	defer t.Stop()
	for {
		stopped := ctx.Err() != nil // then this read is the last one
		f, err := os.Open(path)
		if err == nil {
			if fi, err := f.Stat(); err == nil && fi.Size() < off {
				off = 0 // truncated by the log cap
			}
			r := bufio.NewReader(io.NewSectionReader(f, off, 1<<62))
			for {
				line, err := r.ReadString('\n')
				off += int64(len(line))
				if err != nil {
					partial += line
					break
				}
				line, partial = partial+line, ""
				if jsonLines {
					var entry struct {
						Log string `json:"log"`
					}
					if json.Unmarshal([]byte(line), &entry) == nil {
						line = entry.Log
					}
				}
				io.WriteString(w, line) //nolint:errcheck // best effort echo
			}
			f.Close()
		}
		if stopped {
			if partial != "" && !jsonLines {
				io.WriteString(w, partial) //nolint:errcheck // best effort echo
			}
			return
		}
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
}

// discard drops what the driver keeps of the ended run (a docker container kept for its
// logs): nothing reads a one-off worker's logs after it.
func discard(ctx context.Context, drv isolation.Driver, id string) {
	if d, ok := drv.(isolation.Discarder); ok {
		_ = d.Discard(ctx, id)
	}
}
