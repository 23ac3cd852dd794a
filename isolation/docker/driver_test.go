package docker_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"

	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/isolation/docker"
	"github.com/stormdock/stormdock/isolation/drivertest"
)

var (
	hog    string // the static test worker, built by TestMain
	runTag = fmt.Sprintf("stormdock-test/hog:%d", os.Getpid())
	// testLabel marks this run's images, so Prune in other tests cannot touch them.
	testLabel = map[string]string{"io.stormdock.test": strconv.Itoa(os.Getpid())}

	// runLabel marks this run's containers, for the last-resort cleanup.
	runLabel = map[string]string{"io.stormdock.test-run": strconv.Itoa(os.Getpid())}

	setupOnce sync.Once
	cli       *client.Client
	setupErr  error
)

func TestMain(m *testing.M) {
	var err error
	if hog, err = testenv.Build("./isolation/testdata/hog"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if cli != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		removeContainers(ctx, "")
		if _, err := cli.ImageRemove(ctx, runTag, image.RemoveOptions{PruneChildren: true}); err != nil && !errdefs.IsNotFound(err) {
			fmt.Fprintf(os.Stderr, "remove test image: %v\n", err)
		}
		cancel()
		cli.Close()
	}
	testenv.RemoveBuilds()
	os.Exit(code)
}

// setup connects to the engine and builds the test image (the hog as both the stormdock
// binary and the job binary) through package images, once.
func setup(t testing.TB) *client.Client {
	t.Helper()
	testenv.Root(t)
	testenv.DockerSocket(t)
	setupOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cli, setupErr = docker.Connect(ctx, "")
		if setupErr != nil {
			return
		}
		_, setupErr = images.New(cli).Build(ctx, images.BuildOptions{Tag: runTag, Binary: hog, Job: hog, Labels: testLabel})
	})
	if setupErr != nil {
		t.Fatalf("docker test setup: %v", setupErr)
	}
	return cli
}

// removeContainers force-removes this run's containers (of one node, or all when node is "").
func removeContainers(ctx context.Context, node string) {
	f := filters.NewArgs(filters.Arg("label", docker.LabelManaged+"=true"), filters.Arg("label", "io.stormdock.test-run="+strconv.Itoa(os.Getpid())))
	if node != "" {
		f.Add("label", docker.LabelNode+"="+node)
	}
	cs, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return
	}
	for _, c := range cs {
		_ = cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
	}
}

var seq atomic.Int64

// cgroupDir finds a running container's cgroup directory for a v1 controller (or the v2 one)
// from its init's /proc/PID/cgroup: whatever cgroup driver the engine uses.
func cgroupDir(t *testing.T, pid int, controller string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatalf("read cgroup of pid %d: %v", pid, err)
	}
	unified := ""
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == controller {
				return filepath.Join("/sys/fs/cgroup", controller, f[2])
			}
		}
		if f[0] == "0" {
			unified = filepath.Join("/sys/fs/cgroup", f[2])
		}
	}
	return unified
}

func readInt(t *testing.T, file string) int64 {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read %s: %v", file, err)
	}
	s := strings.Fields(string(b))
	if len(s) > 0 && s[0] == "max" {
		return -1
	}
	n, err := strconv.ParseInt(s[0], 10, 64)
	if err != nil {
		t.Fatalf("parse %s: %v", file, err)
	}
	return n
}

func v2() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}

func harness() drivertest.Harness {
	return drivertest.Harness{
		Factory: func(t *testing.T) func() isolation.Driver {
			c := setup(t)
			node := fmt.Sprintf("dtest-%d-%d", os.Getpid(), seq.Add(1))
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				removeContainers(ctx, node)
			})
			return func() isolation.Driver {
				d, err := docker.New(context.Background(), docker.Config{Client: c, Node: node, Labels: runLabel})
				if err != nil {
					t.Fatalf("new driver: %v", err)
				}
				return d
			}
		},
		Spec: func(t *testing.T, id string, args ...string) isolation.Spec {
			return isolation.Spec{
				ID: id, Job: "test", Tenant: "t", Worker: int(seq.Add(1)),
				Command:     append([]string{images.JobPath}, args...),
				Image:       runTag,
				MemoryBytes: 64 * isolation.MiB, MilliCPU: 500,
			}
		},
		HostPIDs: func(t *testing.T, w isolation.Worker) []int {
			// The container's init now, not the pid it had at start: once it is gone the
			// container and its whole pid namespace are gone.
			info, err := cli.ContainerInspect(context.Background(), w.ContainerID)
			if errdefs.IsNotFound(err) || err == nil && (info.State == nil || !info.State.Running) {
				return nil
			}
			if err != nil {
				t.Fatalf("inspect: %v", err)
			}
			dir := cgroupDir(t, info.State.Pid, "pids")
			if dir == "" || dir == "/sys/fs/cgroup/pids/" || dir == "/sys/fs/cgroup/pids" || dir == "/sys/fs/cgroup/" {
				t.Fatalf("no container cgroup for pid %d: %q", info.State.Pid, dir)
			}
			b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("read procs: %v", err)
			}
			var out []int
			for _, f := range strings.Fields(string(b)) {
				n, _ := strconv.Atoi(f)
				out = append(out, n)
			}
			return out
		},
		KernelLimits: func(t *testing.T, w isolation.Worker) isolation.Limits {
			var l isolation.Limits
			if v2() {
				dir := cgroupDir(t, w.PID, "")
				l.MemoryBytes = readInt(t, filepath.Join(dir, "memory.max"))
				l.MemorySwapBytes = l.MemoryBytes + readInt(t, filepath.Join(dir, "memory.swap.max"))
				b, _ := os.ReadFile(filepath.Join(dir, "cpu.max"))
				var q, p int64
				fmt.Sscan(string(b), &q, &p)
				l.CPUQuota, l.CPUPeriod = time.Duration(q)*time.Microsecond, time.Duration(p)*time.Microsecond
				l.Pids = readInt(t, filepath.Join(dir, "pids.max"))
				return l
			}
			mem, cpu := cgroupDir(t, w.PID, "memory"), cgroupDir(t, w.PID, "cpu")
			l.MemoryBytes = readInt(t, filepath.Join(mem, "memory.limit_in_bytes"))
			l.MemorySwapBytes = readInt(t, filepath.Join(mem, "memory.memsw.limit_in_bytes"))
			l.CPUQuota = time.Duration(readInt(t, filepath.Join(cpu, "cpu.cfs_quota_us"))) * time.Microsecond
			l.CPUPeriod = time.Duration(readInt(t, filepath.Join(cpu, "cpu.cfs_period_us"))) * time.Microsecond
			l.Pids = readInt(t, filepath.Join(cgroupDir(t, w.PID, "pids"), "pids.max"))
			return l
		},
		Exists: func(t *testing.T, w isolation.Worker) bool {
			if w.ContainerID == "" {
				// Never created: look it up by the id label.
				cs, err := cli.ContainerList(context.Background(), container.ListOptions{All: true,
					Filters: filters.NewArgs(filters.Arg("label", docker.LabelID+"="+w.Spec.ID))})
				if err != nil {
					t.Fatalf("list containers: %v", err)
				}
				return len(cs) > 0
			}
			info, err := cli.ContainerInspect(context.Background(), w.ContainerID)
			if err != nil && !errdefs.IsNotFound(err) {
				t.Fatalf("inspect: %v", err)
			}
			// The ended container kept, renamed, for the previous run's logs holds nothing.
			if err == nil && strings.HasSuffix(info.Name, "_previous") && info.State != nil && !info.State.Running {
				return false
			}
			return err == nil
		},
	}
}

func TestSuite(t *testing.T) {
	drivertest.RunSuite(t, harness())
}

func newDriver(t *testing.T) *docker.Driver { return driverFor(t, "dtest", nil) }

// driverFor is a driver on a node of its own, named from prefix, whose containers go with
// the test.
func driverFor(tb testing.TB, prefix string, log *slog.Logger) *docker.Driver {
	c := setup(tb)
	node := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), seq.Add(1))
	d, err := docker.New(context.Background(), docker.Config{Client: c, Node: node, Labels: runLabel, Logger: log})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		d.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		removeContainers(ctx, node)
	})
	return d
}

// The container runs with the hardening the design asks for, checked in the engine's view and
// in the kernel's view of the process: as the spec's user (a tenant's uid, gid the same, no
// supplementary groups), or nobody when it names none.
func TestHardening(t *testing.T) {
	for _, tc := range []struct {
		name string
		user *isolation.User
		want string // uid:gid
	}{
		{"no user: nobody", nil, docker.User},
		{"a tenant's uid", &isolation.User{UID: 300000, GID: 300000}, "300000:300000"},
	} {
		t.Run(tc.name, func(t *testing.T) { testHardening(t, tc.user, tc.want) })
	}
}

func testHardening(t *testing.T, user *isolation.User, wantUser string) {
	d := newDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spec := harness().Spec(t, "hardened", "sleep")
	spec.Node = "n1"
	spec.User = user
	lease := t.TempDir()
	if err := os.WriteFile(filepath.Join(lease, "lease"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec.Mounts = []isolation.Mount{{Source: lease, Target: "/lease", ReadOnly: true}}
	w, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop(ctx, spec.ID, 0)
	info, err := cli.ContainerInspect(ctx, w.ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	hc := info.HostConfig
	switch {
	case info.Config.User != wantUser:
		t.Errorf("user %q, want %q", info.Config.User, wantUser)
	case !hc.ReadonlyRootfs:
		t.Errorf("root file system writable")
	case len(hc.CapDrop) != 1 || hc.CapDrop[0] != "ALL":
		t.Errorf("cap drop %v", hc.CapDrop)
	case len(hc.SecurityOpt) != 1 || hc.SecurityOpt[0] != "no-new-privileges":
		t.Errorf("security opts %v", hc.SecurityOpt)
	case hc.NetworkMode != "host":
		t.Errorf("network %q", hc.NetworkMode)
	case hc.RestartPolicy.Name != container.RestartPolicyDisabled:
		t.Errorf("restart policy %q", hc.RestartPolicy.Name)
	case !strings.HasPrefix(hc.Tmpfs["/tmp"], "rw"):
		t.Errorf("tmpfs %v", hc.Tmpfs)
	case info.Config.Labels[docker.LabelJob] != "test" || info.Config.Labels[docker.LabelNode] == "" || info.Config.Labels[docker.LabelManaged] != "true":
		t.Errorf("labels %v", info.Config.Labels)
	}
	status, err := os.ReadFile("/proc/" + strconv.Itoa(w.PID) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	uid, gid, _ := strings.Cut(wantUser, ":")
	for _, want := range []string{"Uid:\t" + strings.Repeat(uid+"\t", 3) + uid + "\n", "Gid:\t" + strings.Repeat(gid+"\t", 3) + gid + "\n",
		"NoNewPrivs:\t1", "CapEff:\t0000000000000000", "Seccomp:\t2"} {
		if !strings.Contains(string(status), want) {
			t.Errorf("worker process status lacks %q:\n%s", want, status)
		}
	}
	// No group but its own: the engine lists the primary gid among the supplementary ones,
	// which adds nothing.
	for _, l := range strings.Split(string(status), "\n") {
		if gs, ok := strings.CutPrefix(l, "Groups:"); ok && strings.TrimSpace(gs) != "" && strings.TrimSpace(gs) != gid {
			t.Errorf("worker's supplementary groups %q, want none but %s", gs, gid)
		}
	}
	// The bind mount is there, read-only, as the worker sees its file system.
	if _, err := os.Stat("/proc/" + strconv.Itoa(w.PID) + "/root/lease/lease"); err != nil {
		t.Errorf("mounted file not visible in the container: %v", err)
	}
	if len(info.Mounts) != 1 || info.Mounts[0].Destination != "/lease" || info.Mounts[0].RW {
		t.Errorf("mounts %+v, want /lease read-only", info.Mounts)
	}
	env, _ := os.ReadFile("/proc/" + strconv.Itoa(w.PID) + "/environ")
	if !strings.Contains(string(env), "STORMDOCK_JOB=test\x00") {
		t.Errorf("worker env lacks STORMDOCK_JOB: %q", env)
	}
}

func TestImageMissing(t *testing.T) {
	d := newDriver(t)
	spec := harness().Spec(t, "noimage", "sleep")
	spec.Image = "stormdock-test/absent:never-built"
	_, err := d.Start(context.Background(), spec)
	if !errors.Is(err, isolation.ErrImageNotFound) || !strings.Contains(err.Error(), "stormdock image build") {
		t.Fatalf("start: %v, want ErrImageNotFound saying how to build it", err)
	}
	t.Logf("missing image: %v", err)
}

func TestMemoryBelowEngineMinimum(t *testing.T) {
	d := newDriver(t)
	spec := harness().Spec(t, "tiny", "sleep")
	spec.MemoryBytes = 5 * isolation.MiB
	_, err := d.Start(context.Background(), spec)
	if !errors.Is(err, isolation.ErrInvalidSpec) || !strings.Contains(err.Error(), "at least 6Mi") {
		t.Fatalf("start: %v, want ErrInvalidSpec with the 6Mi minimum", err)
	}
}

func TestUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := docker.Connect(ctx, "unix:///nonexistent/docker.sock")
	if !errors.Is(err, isolation.ErrUnavailable) || !strings.Contains(err.Error(), "start dockerd") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("connect: %v, want one-line ErrUnavailable saying to start dockerd", err)
	}
	t.Logf("unreachable: %v", err)
}

func benchDriver(b *testing.B) *docker.Driver { return driverFor(b, "dbench", quietLogger()) }

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// BenchmarkStartStop: go test -run '^$' -bench . -benchtime 1x ./isolation/docker/
func BenchmarkStartStop(b *testing.B) {
	d := benchDriver(b)
	drivertest.BenchmarkStartStop(b, d, func(id string) isolation.Spec {
		return isolation.Spec{ID: id, Command: []string{images.JobPath, "term"}, Image: runTag, MemoryBytes: 64 * isolation.MiB, MilliCPU: 500}
	})
}

// BenchmarkVersusDockerRun compares a whole worker life through the driver (start, exit 0,
// remove) with `docker run --rm` of the same image and command, same run, same engine.
func BenchmarkVersusDockerRun(b *testing.B) {
	d := benchDriver(b)
	dockerCLI := ""
	for _, p := range []string{"/usr/local/bin/docker", "/usr/bin/docker"} {
		if _, err := os.Stat(p); err == nil {
			dockerCLI = p
			break
		}
	}
	if dockerCLI == "" {
		testenv.Missing(b, "docker CLI at /usr/local/bin/docker or /usr/bin/docker")
	}
	ctx := context.Background()
	var viaDriver, viaCLI []time.Duration
	for i := 0; b.Loop(); i++ {
		for j := range drivertest.Workers {
			id := fmt.Sprintf("vs-%d-%d-%d", time.Now().UnixNano()%1e6, i, j)
			t0 := time.Now()
			if _, err := d.Start(ctx, isolation.Spec{ID: id, Command: []string{images.JobPath, "exit", "0"}, Image: runTag, MemoryBytes: 64 * isolation.MiB, MilliCPU: 500}); err != nil {
				b.Fatal(err)
			}
			if ex, err := d.Wait(ctx, id); err != nil || !ex.Success() {
				b.Fatalf("wait: %v %v", ex, err)
			}
			if _, err := d.Stop(ctx, id, 0); err != nil {
				b.Fatal(err)
			}
			viaDriver = append(viaDriver, time.Since(t0))

			t0 = time.Now()
			cmd := exec.Command(dockerCLI, "run", "--rm", "--network", "host", "--user", docker.User,
				"--memory", "64m", "--memory-swap", "64m", "--cpus", "0.5", "--label", "io.stormdock.test-run="+strconv.Itoa(os.Getpid()),
				runTag, images.JobPath, "exit", "0")
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("docker run: %v\n%s", err, out)
			}
			viaCLI = append(viaCLI, time.Since(t0))
		}
	}
	drivertest.ReportLatency(b, "driver-life", viaDriver)
	drivertest.ReportLatency(b, "docker-run-life", viaCLI)
	b.ReportMetric(float64(drivertest.Percentile(viaDriver, 50))/float64(drivertest.Percentile(viaCLI, 50)), "driver/docker-run-p50")
}

// deriveImage builds tag FROM the test image with the Dockerfile lines given (the docker CLI,
// classic builder, no context), removed when the test ends.
func deriveImage(t *testing.T, tag string, lines ...string) {
	t.Helper()
	setup(t)
	cmd := exec.Command("docker", "build", "-q", "--label", "io.stormdock.test="+strconv.Itoa(os.Getpid()), "-t", tag, "-")
	cmd.Env = append(os.Environ(), "DOCKER_BUILDKIT=0")
	cmd.Stdin = strings.NewReader("FROM " + runTag + "\n" + strings.Join(lines, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docker build %s: %v\n%s", tag, err, out)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = cli.ImageRemove(ctx, tag, image.RemoveOptions{Force: true, PruneChildren: true})
	})
}

// A spec with ImageCommand runs the image's own entrypoint and cmd, after the spec's command
// (a prefix: the lease launcher's, in agents), in the image's working directory and with its
// environment; an image with neither is refused at start with one line; and a spec's command
// replaces an image's ENTRYPOINT too, so that what the spec names is what runs.
func TestImageOwnCommand(t *testing.T) {
	d := newDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	base := fmt.Sprintf("stormdock-test/own-%d", os.Getpid())
	deriveImage(t, base+":own", "ENV OWN_VAR=from-image", "WORKDIR /tmp", `ENTRYPOINT ["/job"]`, `CMD ["sleep"]`)
	deriveImage(t, base+":none", `CMD []`)

	t.Run("own", func(t *testing.T) {
		spec := harness().Spec(t, "own", "ignored")
		spec.Command, spec.ImageCommand, spec.Image = nil, true, base+":own"
		w, err := d.Start(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Stop(ctx, spec.ID, 0)
		proc := "/proc/" + strconv.Itoa(w.PID)
		if b, _ := os.ReadFile(proc + "/cmdline"); string(b) != "/job\x00sleep\x00" {
			t.Errorf("the container runs %q; want the image's entrypoint and cmd, /job sleep", b)
		}
		if cwd, err := os.Readlink(proc + "/cwd"); err != nil || cwd != "/tmp" {
			t.Errorf("working directory %q, %v; want the image's /tmp", cwd, err)
		}
		env, _ := os.ReadFile(proc + "/environ")
		for _, want := range []string{"OWN_VAR=from-image\x00", "STORMDOCK_JOB=test\x00"} {
			if !strings.Contains(string(env), want) {
				t.Errorf("environment lacks %q: %q", want, env)
			}
		}
	})
	t.Run("after a prefix", func(t *testing.T) {
		spec := harness().Spec(t, "prefixed", "exit", "7")
		spec.ImageCommand, spec.Image = true, base+":own"
		w, err := d.Start(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		info, err := cli.ContainerInspect(ctx, w.ContainerID)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(info.Config.Entrypoint, " "); got != "/job exit 7 /job sleep" || len(info.Config.Cmd) != 0 {
			t.Errorf("entrypoint %q, cmd %q; want the prefix, then the image's own, and no cmd", got, info.Config.Cmd)
		}
		if ex, err := d.Wait(ctx, spec.ID); err != nil || ex.Code != 7 {
			t.Errorf("exit %+v, %v; want the prefix's program's 7", ex, err)
		}
		_, _ = d.Stop(ctx, spec.ID, 0)
	})
	t.Run("neither", func(t *testing.T) {
		spec := harness().Spec(t, "neither")
		spec.Command, spec.ImageCommand, spec.Image = nil, true, base+":none"
		_, err := d.Start(ctx, spec)
		if !errors.Is(err, isolation.ErrInvalidSpec) || !strings.Contains(err.Error(), "neither an entrypoint nor a cmd: give the job a command") || strings.Contains(err.Error(), "\n") {
			t.Fatalf("start of an image with neither: %v; want one line saying so", err)
		}
		if harness().Exists(t, isolation.Worker{Spec: spec}) {
			t.Error("a container was made for it")
		}
	})
	t.Run("command replaces the entrypoint", func(t *testing.T) {
		spec := harness().Spec(t, "replaced", "sleep")
		spec.Image = base + ":own" // its ENTRYPOINT is /job: the command must not become its arguments
		w, err := d.Start(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Stop(ctx, spec.ID, 0)
		// The container's first process is runc's init until it executes the command, which
		// may be a moment after the start returns on a loaded machine.
		testenv.EventuallyWith(t, "the container runs the spec's command alone", 10*time.Second, func() (bool, string) {
			b, _ := os.ReadFile("/proc/" + strconv.Itoa(w.PID) + "/cmdline")
			return string(b) == "/job\x00sleep\x00", fmt.Sprintf("it runs %q", b)
		})
	})
}

// unendingLogs is the engine as it was once seen under load (CI): its follow stream of a
// container that stopped delivers everything but never ends. Everything else is the real
// engine's.
type unendingLogs struct{ docker.API }

func (u unendingLogs) ContainerLogs(ctx context.Context, id string, opts container.LogsOptions) (io.ReadCloser, error) {
	rc, err := u.API.ContainerLogs(ctx, id, opts)
	if err != nil || !opts.Follow {
		return rc, err
	}
	return &unending{ReadCloser: rc, ctx: ctx}, nil
}

type unending struct {
	io.ReadCloser
	ctx context.Context
}

func (u *unending) Read(p []byte) (int, error) {
	n, err := u.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		if n > 0 {
			return n, nil
		}
		<-u.ctx.Done() // the end never comes: only the reader's giving up ends it
		return 0, u.ctx.Err()
	}
	return n, err
}

// A follower of a worker's log goes on with the worker's next run even when the engine never
// ends the stream of the run that stopped: it looks at the container, and once it has been
// seen stopped for a while, leaves its stream.
func TestFollowWhenTheStreamNeverEnds(t *testing.T) {
	c := setup(t)
	node := fmt.Sprintf("dtest-%d-%d", os.Getpid(), seq.Add(1))
	d, err := docker.New(context.Background(), docker.Config{Client: unendingLogs{c}, Node: node, Labels: runLabel})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		removeContainers(ctx, node)
	})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(2*time.Minute))
	defer cancel()
	spec := harness().Spec(t, fmt.Sprintf("unending-%d", os.Getpid()), "tick", "30")
	if _, err := d.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	follow, err := d.Logs(ctx, spec.ID, isolation.LogOptions{Follow: true, Tail: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer follow.Close()
	lines := make(chan string, 1000)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(follow)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func(what string) {
		t.Helper()
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the followed log ended before %s", what)
				}
				if l == "tick 0" {
					return
				}
			case <-ctx.Done():
				t.Fatalf("no %s in the followed log", what)
			}
		}
	}
	next("the first run's tick 0")
	if _, err := d.Stop(ctx, spec.ID, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	next("the next run's tick 0")
	_, _ = d.Stop(ctx, spec.ID, 0)
}
