// Package docker runs stormdock workers as Docker containers: host network, limits from the
// spec, no privileges, read-only root; adopted again by labels after an agent restart.
package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/stormdock/stormdock/isolation"
)

// MinMemory is the engine's own floor: dockerd refuses memory limits under 6 MB.
const MinMemory = 6 * isolation.MiB

// User is who a worker runs as when its spec names no user (isolation.Spec.User): nobody,
// numeric because scratch images have no /etc/passwd. Agents always name one: the tenant's
// uid, so that two tenants' containers are not one user on the host.
const User = "65534:65534"

// userOf is the container's user for a spec: "uid:gid", numeric. Docker adds no host
// groups; only an image whose own /etc/passwd names that uid can add its /etc/group's,
// which count inside the container alone (it sees of the host only its read-only lease
// directory).
func userOf(spec isolation.Spec) string {
	if spec.User == nil {
		return User
	}
	return strconv.FormatUint(uint64(spec.User.UID), 10) + ":" + strconv.FormatUint(uint64(spec.User.GID), 10)
}

// cpuPeriod is the CFS period runc applies NanoCPUs against.
const cpuPeriod = 100 * time.Millisecond

// API is the part of the Docker client the driver uses; *client.Client implements it.
type API interface {
	ContainerCreate(ctx context.Context, config *container.Config, hostConfig *container.HostConfig, networkingConfig *network.NetworkingConfig, platform *ocispec.Platform, containerName string) (container.CreateResponse, error)
	ContainerStart(ctx context.Context, containerID string, options container.StartOptions) error
	ContainerStop(ctx context.Context, containerID string, options container.StopOptions) error
	ContainerKill(ctx context.Context, containerID, signal string) error
	ContainerRemove(ctx context.Context, containerID string, options container.RemoveOptions) error
	ContainerInspect(ctx context.Context, containerID string) (container.InspectResponse, error)
	ContainerList(ctx context.Context, options container.ListOptions) ([]container.Summary, error)
	ContainerWait(ctx context.Context, containerID string, condition container.WaitCondition) (<-chan container.WaitResponse, <-chan error)
	ContainerStatsOneShot(ctx context.Context, containerID string) (container.StatsResponseReader, error)
	ContainerLogs(ctx context.Context, container string, options container.LogsOptions) (io.ReadCloser, error)
	ContainerRename(ctx context.Context, container, newContainerName string) error
	Events(ctx context.Context, options events.ListOptions) (<-chan events.Message, <-chan error)
	ImageInspect(ctx context.Context, imageID string, inspectOpts ...client.ImageInspectOption) (image.InspectResponse, error)
}

// Config configures a Driver.
type Config struct {
	// Client talks to the engine; see Connect.
	Client API
	// Node is this agent's node id. Containers are labelled with it and Adopt takes only
	// this node's containers, so agents sharing an engine keep apart. Required.
	Node string
	// NamePrefix prefixes container names (worker ids are unique per engine with it).
	// Default "stormdock-".
	NamePrefix string
	// Labels are added to every container (a cluster name, say).
	Labels map[string]string
	// TmpfsSize is the size of the /tmp tmpfs (the root file system is read-only). Default 64m.
	TmpfsSize string
	Logger    *slog.Logger
}

// Driver runs workers as containers. It implements isolation.Driver.
type Driver struct {
	cfg Config
	api API
	log *slog.Logger

	ctx    context.Context // cancelled by Close: ends the watchers
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	workers map[string]*worker
	closed  bool
}

var _ isolation.Driver = (*Driver)(nil)

// worker: fields other than done are guarded by Driver.mu.
type worker struct {
	v    isolation.Worker
	done chan struct{} // closed once v.Exit is set
	// killed is set once the driver itself stops or SIGKILLs the container: its SIGKILL is
	// then no OOM kill to look for.
	killed bool
}

// New returns a driver for cfg.Client, after checking the engine answers.
func New(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.Client == nil {
		return nil, fmt.Errorf("docker driver: no client: use Connect")
	}
	if cfg.Node == "" {
		return nil, fmt.Errorf("docker driver: no node id: containers are adopted by node, so name the node")
	}
	if cfg.NamePrefix == "" {
		cfg.NamePrefix = "stormdock-"
	}
	if cfg.TmpfsSize == "" {
		cfg.TmpfsSize = "64m"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if _, err := cfg.Client.ContainerList(ctx, container.ListOptions{Limit: 1}); err != nil {
		return nil, fmt.Errorf("%w: docker engine does not answer (%v): start dockerd or point DOCKER_HOST at a running engine", isolation.ErrUnavailable, err)
	}
	d := &Driver{
		cfg:     cfg,
		api:     cfg.Client,
		log:     cfg.Logger.With("driver", "docker", "node", cfg.Node),
		workers: map[string]*worker{},
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	return d, nil
}

// ContainerName is the name of a worker's container.
func (d *Driver) ContainerName(id string) string { return d.cfg.NamePrefix + id }

// Start implements isolation.Starter. The image must be on the node already: the agent pulls
// it first (package images), the driver never does.
func (d *Driver) Start(ctx context.Context, spec isolation.Spec) (isolation.Worker, error) {
	if err := spec.Validate(); err != nil {
		return isolation.Worker{}, err
	}
	switch {
	case spec.Image == "":
		return isolation.Worker{}, fmt.Errorf("%w: worker %s has no image: build one with `stormdock image build` and name it", isolation.ErrInvalidSpec, spec.ID)
	case spec.MemoryBytes < MinMemory:
		return isolation.Worker{}, fmt.Errorf("%w: memory limit %s of worker %s is below the 6Mi dockerd accepts: ask for at least 6Mi",
			isolation.ErrInvalidSpec, isolation.FormatBytes(spec.MemoryBytes), spec.ID)
	}
	w := &worker{done: make(chan struct{})}
	d.mu.Lock()
	switch {
	case d.closed:
		d.mu.Unlock()
		return isolation.Worker{}, isolation.ErrClosed
	case d.workers[spec.ID] != nil:
		d.mu.Unlock()
		return isolation.Worker{}, fmt.Errorf("%w: %s", isolation.ErrExists, spec.ID)
	}
	d.workers[spec.ID] = w
	d.mu.Unlock()

	v, err := d.start(ctx, spec)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		delete(d.workers, spec.ID)
		return isolation.Worker{}, err
	}
	w.v = v
	d.watch(w)
	return v, nil
}

func (d *Driver) start(ctx context.Context, spec isolation.Spec) (isolation.Worker, error) {
	lbl, err := labels(spec)
	if err != nil {
		return isolation.Worker{}, err
	}
	for k, v := range d.cfg.Labels {
		lbl[k] = v
	}
	// The node label says which agent owns the container, whatever the spec says.
	lbl[LabelNode] = d.cfg.Node
	entry, err := d.command(ctx, spec)
	if err != nil {
		return isolation.Worker{}, err
	}
	pids := spec.PidsLimit()
	cfg := &container.Config{
		Image: spec.Image,
		// The whole command as the entrypoint, and no cmd: the engine then adds nothing of
		// the image's, so the program the spec names (the lease launcher) is the container's
		// init, and an image's ENTRYPOINT cannot take its place.
		Entrypoint: entry,
		Env:        spec.Environ(),
		Labels:     lbl,
		User:       userOf(spec),
		WorkingDir: spec.Dir,
	}
	hc := &container.HostConfig{
		NetworkMode:    "host",
		RestartPolicy:  container.RestartPolicy{Name: container.RestartPolicyDisabled},
		ReadonlyRootfs: true,
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges"},
		Tmpfs:          map[string]string{"/tmp": "rw,nosuid,nodev,size=" + d.cfg.TmpfsSize},
		LogConfig: container.LogConfig{Type: "json-file", Config: map[string]string{
			// Two files of half the cap each: the newest output survives a rotation.
			"max-size": strconv.FormatInt(max(spec.LogLimit()/2, 1024), 10),
			"max-file": "2",
		}},
		Mounts: mounts(spec.Mounts),
		Resources: container.Resources{
			Memory:     spec.MemoryBytes,
			MemorySwap: spec.MemoryBytes, // memory+swap = memory: no swap
			NanoCPUs:   spec.MilliCPU * 1e6,
			PidsLimit:  &pids,
		},
	}
	name := d.ContainerName(spec.ID)
	created, err := d.api.ContainerCreate(ctx, cfg, hc, nil, nil, name)
	switch {
	case errdefs.IsNotFound(err):
		return isolation.Worker{}, fmt.Errorf("%w: image %q of worker %s is not on this node: build it here, or push it to a registry the agent pulls from (`stormdock image build --push --tag REGISTRY/NAME:TAG`)",
			isolation.ErrImageNotFound, spec.Image, spec.ID)
	case errdefs.IsConflict(err):
		return isolation.Worker{}, fmt.Errorf("%w: container %s already exists: call Adopt, or remove it", isolation.ErrExists, name)
	case err != nil:
		return isolation.Worker{}, fmt.Errorf("create container for %s: %w", spec.ID, err)
	}
	for _, warn := range created.Warnings {
		d.log.Warn("engine warning", "id", spec.ID, "warning", warn)
	}
	if err := d.api.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = d.api.ContainerRemove(rctx, created.ID, container.RemoveOptions{Force: true})
		return isolation.Worker{}, fmt.Errorf("start container for %s: %w", spec.ID, err)
	}
	v := isolation.Worker{Spec: spec, ContainerID: created.ID}
	if info, err := d.api.ContainerInspect(ctx, created.ID); err == nil {
		fill(&v, info)
		v.Exit = nil // the watcher reports the exit, even of a worker that ended at once
	}
	d.log.Info("worker started", "id", spec.ID, "container", short(created.ID), "pid", v.PID)
	return v, nil
}

// command is what a container of spec runs: its command, followed, with ImageCommand, by
// the image's own entrypoint and cmd, read from the image on this engine (the image the
// container is made from). Its working directory and environment are the image's too: the
// engine keeps them (spec.Dir empty, spec's variables added to the image's).
func (d *Driver) command(ctx context.Context, spec isolation.Spec) ([]string, error) {
	if !spec.ImageCommand {
		return spec.Command, nil
	}
	info, err := d.api.ImageInspect(ctx, spec.Image)
	switch {
	case errdefs.IsNotFound(err):
		return nil, fmt.Errorf("%w: image %q of worker %s is not on this node: build it here, or push it to a registry the agent pulls from (`stormdock image build --push --tag REGISTRY/NAME:TAG`)",
			isolation.ErrImageNotFound, spec.Image, spec.ID)
	case err != nil:
		return nil, fmt.Errorf("inspect image %s of %s: %w", spec.Image, spec.ID, err)
	}
	var own []string
	if info.Config != nil {
		own = append(slices.Clone(info.Config.Entrypoint), info.Config.Cmd...)
	}
	if len(own) == 0 || own[0] == "" {
		return nil, fmt.Errorf("%w: image %s of worker %s has neither an entrypoint nor a cmd: give the job a command", isolation.ErrInvalidSpec, spec.Image, spec.ID)
	}
	return append(slices.Clone(spec.Command), own...), nil
}

func mounts(ms []isolation.Mount) []mount.Mount {
	var out []mount.Mount
	for _, m := range ms {
		out = append(out, mount.Mount{Type: mount.TypeBind, Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	return out
}

func short(id string) string { return id[:min(12, len(id))] }

// fill sets what inspect tells about a worker.
func fill(v *isolation.Worker, info container.InspectResponse) {
	v.ContainerID = info.ID
	v.LogPath = info.LogPath
	if info.State == nil {
		return
	}
	v.PID = info.State.Pid
	if t, err := time.Parse(time.RFC3339Nano, info.State.StartedAt); err == nil {
		v.Started = t
	}
	if !info.State.Running && !info.State.Restarting && info.State.Status != container.StateCreated {
		ex := exitOf(info.State)
		v.Exit = &ex
	}
}

// exitOf reads an exit from a stopped container's state. The engine reports a death by signal
// as 128+signal, with no separate field: a code in 129..159 is read as a signal.
func exitOf(s *container.State) isolation.Exit {
	ex := isolation.Exit{Code: s.ExitCode, OOMKilled: s.OOMKilled}
	if s.ExitCode > 128 && s.ExitCode < 128+32 {
		ex.Signal = syscall.Signal(s.ExitCode - 128)
	}
	if t, err := time.Parse(time.RFC3339Nano, s.FinishedAt); err == nil {
		ex.At = t
	}
	return ex
}

// oomEvent asks the engine's event log whether the container was OOM-killed. The engine
// sets State.OOMKilled from an event of its own that can come after the exit (cgroup v1,
// engine 20.10): a SIGKILL nobody here sent is checked against the container's "oom"
// events, waiting up to oomWait for one still on its way (the shim reads the kernel's oom
// notification on its own schedule, late on a loaded machine). Only unexplained SIGKILLs pay
// the wait; the exit is reported once the event came or the wait ran out.
func (d *Driver) oomEvent(cid, startedAt string) bool {
	const oomWait = 3 * time.Second
	since := time.Now().Add(-time.Minute)
	if t, err := time.Parse(time.RFC3339Nano, startedAt); err == nil {
		since = t.Add(-time.Second)
	}
	until := time.Now().Add(oomWait)
	ctx, cancel := context.WithDeadline(d.ctx, until.Add(2*time.Second))
	defer cancel()
	stamp := func(t time.Time) string { return fmt.Sprintf("%d.%09d", t.Unix(), t.Nanosecond()) }
	msgs, errs := d.api.Events(ctx, events.ListOptions{Since: stamp(since), Until: stamp(until),
		Filters: filters.NewArgs(filters.Arg("type", "container"), filters.Arg("container", cid), filters.Arg("event", "oom"))})
	for {
		select {
		case _, ok := <-msgs:
			return ok
		case err := <-errs:
			if err != nil && !errors.Is(err, io.EOF) && ctx.Err() == nil {
				d.log.Warn("read the engine's oom events", "container", short(cid), "err", err)
			}
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// watch starts the goroutine that reports w's exit; d.mu must be held.
func (d *Driver) watch(w *worker) {
	if w.v.Exit != nil {
		close(w.done)
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.waitExit(w)
	}()
}

// waitExit blocks until the container stops, then records its exit. ContainerWait is a long
// poll that a restarting engine breaks: on error, re-inspect and wait again.
func (d *Driver) waitExit(w *worker) {
	d.mu.Lock()
	id, cid := w.v.Spec.ID, w.v.ContainerID
	d.mu.Unlock()
	backoff := 100 * time.Millisecond
	for {
		resc, errc := d.api.ContainerWait(d.ctx, cid, container.WaitConditionNotRunning)
		select {
		case <-resc:
		case err := <-errc:
			if d.ctx.Err() != nil {
				return
			}
			d.log.Warn("wait for container", "id", id, "err", err)
		case <-d.ctx.Done():
			return
		}
		ictx, cancel := context.WithTimeout(d.ctx, 30*time.Second)
		info, err := d.api.ContainerInspect(ictx, cid)
		cancel()
		if d.ctx.Err() != nil {
			return
		}
		var ex isolation.Exit
		switch {
		case errdefs.IsNotFound(err):
			// Removed behind our back (docker rm -f): it ended, how is unknown.
			ex = isolation.Exit{Code: isolation.ExitUnknown, At: time.Now()}
		case err != nil || info.State == nil || info.State.Running || info.State.Restarting:
			time.Sleep(backoff)
			backoff = min(2*backoff, 5*time.Second)
			continue
		default:
			ex = exitOf(info.State)
			d.mu.Lock()
			killed := w.killed
			d.mu.Unlock()
			if ex.Signal == syscall.SIGKILL && !ex.OOMKilled && !killed {
				ex.OOMKilled = d.oomEvent(cid, info.State.StartedAt)
			}
		}
		d.mu.Lock()
		w.v.Exit = &ex
		w.v.PID = 0
		d.mu.Unlock()
		d.log.Info("worker ended", "id", id, "exit", ex.String())
		close(w.done)
		return
	}
}

func (d *Driver) get(id string) (*worker, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, isolation.ErrClosed
	}
	w := d.workers[id]
	if w == nil || w.v.ContainerID == "" {
		return nil, fmt.Errorf("%w: %s", isolation.ErrNotFound, id)
	}
	return w, nil
}

// Stop implements isolation.Stopper through ContainerStop (SIGTERM, grace, SIGKILL to the
// container's whole pid namespace) and removes the container. The engine counts grace in whole
// seconds: it is rounded up.
func (d *Driver) Stop(ctx context.Context, id string, grace time.Duration) (isolation.Exit, error) {
	w, err := d.get(id)
	if err != nil {
		return isolation.Exit{}, err
	}
	d.mu.Lock()
	cid := w.v.ContainerID
	w.killed = true
	d.mu.Unlock()
	select {
	case <-w.done:
	default:
		secs := int(math.Ceil(grace.Seconds()))
		if err := d.api.ContainerStop(ctx, cid, container.StopOptions{Timeout: &secs}); err != nil && !errdefs.IsNotFound(err) {
			return isolation.Exit{}, fmt.Errorf("stop container of %s: %w", id, err)
		}
		select {
		case <-w.done:
		case <-ctx.Done():
			return isolation.Exit{}, fmt.Errorf("stop %s: %w", id, ctx.Err())
		}
	}
	if err := d.keepPrevious(ctx, id, cid); err != nil {
		return isolation.Exit{}, fmt.Errorf("remove container of %s: %w", id, err)
	}
	d.mu.Lock()
	ex := *w.v.Exit
	delete(d.workers, id)
	d.mu.Unlock()
	return ex, nil
}

// Signal implements isolation.Signaler through ContainerKill, which delivers sig to the
// container's init (the lease launcher, or the image's entrypoint).
func (d *Driver) Signal(ctx context.Context, id string, sig syscall.Signal) error {
	w, err := d.get(id)
	if err != nil {
		return err
	}
	select {
	case <-w.done:
		return nil
	default:
	}
	d.mu.Lock()
	cid := w.v.ContainerID
	if sig == syscall.SIGKILL {
		w.killed = true
	}
	d.mu.Unlock()
	if err := d.api.ContainerKill(ctx, cid, strconv.Itoa(int(sig))); err != nil {
		if errdefs.IsNotFound(err) || errdefs.IsConflict(err) {
			return nil // gone, or not running any more: nothing to signal
		}
		return fmt.Errorf("signal container of %s: %w", id, err)
	}
	return nil
}

// Wait implements isolation.Waiter.
func (d *Driver) Wait(ctx context.Context, id string) (isolation.Exit, error) {
	w, err := d.get(id)
	if err != nil {
		return isolation.Exit{}, err
	}
	select {
	case <-w.done:
		d.mu.Lock()
		defer d.mu.Unlock()
		return *w.v.Exit, nil
	case <-ctx.Done():
		return isolation.Exit{}, ctx.Err()
	}
}

// Adopt implements isolation.Lister: it takes the containers labelled with this node. The
// engine keeps an ended container's exit code and OOM flag, so nothing is lost while no agent
// watched.
func (d *Driver) Adopt(ctx context.Context) ([]isolation.Worker, error) {
	list, err := d.api.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", LabelManaged+"=true"),
		filters.Arg("label", LabelNode+"="+d.cfg.Node),
	)})
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	var out []isolation.Worker
	for _, c := range list {
		spec, err := specOf(c.Labels)
		if err != nil {
			d.log.Warn("container without a readable spec label, left alone", "container", short(c.ID), "err", err)
			continue
		}
		if !slices.Contains(c.Names, "/"+d.ContainerName(spec.ID)) {
			continue // a worker's previous run, kept for its logs
		}
		d.mu.Lock()
		closed, known := d.closed, d.workers[spec.ID] != nil
		d.mu.Unlock()
		if closed {
			return out, isolation.ErrClosed
		}
		if known {
			continue
		}
		info, err := d.api.ContainerInspect(ctx, c.ID)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("inspect %s: %w", short(c.ID), err)
		}
		w := &worker{v: isolation.Worker{Spec: spec, Adopted: true}, done: make(chan struct{})}
		fill(&w.v, info)
		if info.State != nil && info.State.Status == container.StateCreated {
			// Created but never started: an agent died inside Start. Nothing ran: remove it.
			if err := d.api.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true}); err != nil && !errdefs.IsNotFound(err) {
				return out, fmt.Errorf("remove unstarted container %s: %w", short(c.ID), err)
			}
			continue
		}
		d.mu.Lock()
		if d.workers[spec.ID] == nil {
			d.workers[spec.ID] = w
			d.watch(w)
			out = append(out, w.v)
		}
		d.mu.Unlock()
		d.log.Info("worker adopted", "id", spec.ID, "container", short(c.ID), "running", w.v.Running())
	}
	return out, nil
}

// List implements isolation.Lister.
func (d *Driver) List(ctx context.Context) ([]isolation.Worker, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]isolation.Worker, 0, len(d.workers))
	for _, w := range d.workers {
		if w.v.ContainerID != "" {
			out = append(out, w.v)
		}
	}
	slices.SortFunc(out, func(a, b isolation.Worker) int { return strings.Compare(a.Spec.ID, b.Spec.ID) })
	return out, nil
}

// Usage implements isolation.Meter with a one-shot stats read.
func (d *Driver) Usage(ctx context.Context, id string) (isolation.Usage, error) {
	w, err := d.get(id)
	if err != nil {
		return isolation.Usage{}, err
	}
	d.mu.Lock()
	cid := w.v.ContainerID
	d.mu.Unlock()
	r, err := d.api.ContainerStatsOneShot(ctx, cid)
	if err != nil {
		return isolation.Usage{}, fmt.Errorf("stats of %s: %w", id, err)
	}
	defer r.Body.Close()
	defer io.Copy(io.Discard, r.Body) //nolint:errcheck // draining only
	var s container.StatsResponse
	if err := json.NewDecoder(r.Body).Decode(&s); err != nil {
		return isolation.Usage{}, fmt.Errorf("decode stats of %s: %w", id, err)
	}
	u := isolation.Usage{At: s.Read, CPU: time.Duration(s.CPUStats.CPUUsage.TotalUsage)}
	// As docker stats: page cache the kernel can drop is not the worker's memory.
	inactive, ok := s.MemoryStats.Stats["total_inactive_file"] // cgroup v1
	if !ok {
		inactive = s.MemoryStats.Stats["inactive_file"] // cgroup v2
	}
	if s.MemoryStats.Usage > inactive {
		u.MemoryBytes = s.MemoryStats.Usage - inactive
	}
	return u, nil
}

// Limits implements isolation.Meter from the container's inspect.
func (d *Driver) Limits(ctx context.Context, id string) (isolation.Limits, error) {
	w, err := d.get(id)
	if err != nil {
		return isolation.Limits{}, err
	}
	d.mu.Lock()
	cid := w.v.ContainerID
	d.mu.Unlock()
	info, err := d.api.ContainerInspect(ctx, cid)
	if err != nil {
		return isolation.Limits{}, fmt.Errorf("inspect %s: %w", id, err)
	}
	r := info.HostConfig.Resources
	l := isolation.Limits{MemoryBytes: r.Memory, MemorySwapBytes: r.MemorySwap, CPUPeriod: cpuPeriod}
	l.CPUQuota = time.Duration(r.NanoCPUs * int64(cpuPeriod) / 1e9)
	if r.PidsLimit != nil {
		l.Pids = *r.PidsLimit
	}
	return l, nil
}

// Close implements isolation.Driver: containers keep running, watchers end.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	d.cancel()
	d.wg.Wait()
	return nil
}
