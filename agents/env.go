package agents

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stormdock/stormdock/agents/launcher"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/isolation"
)

// Environment of the worker contract that the agent adds to what isolation.Spec sets
// (STORMDOCK_JOB, _TENANT, _WORKER and _NODE).
const (
	EnvWorkers    = "STORMDOCK_WORKERS"
	EnvDC         = "STORMDOCK_DC"
	EnvRack       = "STORMDOCK_RACK"
	EnvLink       = "STORMDOCK_LINK"
	EnvPort       = "STORMDOCK_PORT"
	EnvOutput     = "STORMDOCK_OUTPUT"
	EnvGeneration = "STORMDOCK_GENERATION"
	// EnvAddr is the node's advertised address: where a worker that serves others (an
	// output router) listens, with its STORMDOCK_PORT.
	EnvAddr = "STORMDOCK_ADDR"
	// EnvConfig names the worker's live configuration file (cluster.WorkerConfig).
	EnvConfig = "STORMDOCK_CONFIG"
	// EnvOutputTokenFile names a link worker's sender token file (multidc.EnvTokenFile).
	EnvOutputTokenFile = "STORMDOCK_OUTPUT_TOKEN_FILE"
	// EnvSinkDir names, in an output router's environment, the directory its file sink
	// must lie below (multidc.EnvSinkDir).
	EnvSinkDir = "STORMDOCK_SINK_DIR"
	// EnvMetricsPort is where a worker may serve its Prometheus text, on STORMDOCK_ADDR:
	// its agent scrapes it every Config.MetricsInterval (see jobmetrics.go).
	EnvMetricsPort = "STORMDOCK_METRICS_PORT"
)

// containerLeaseDir is where a docker worker sees its lease directory (read-only).
const containerLeaseDir = "/run/stormdock"

// workerID names a worker on its node: in cgroup paths, container names and state files.
// The node id is part of it because docker container names are host-wide and a local cluster
// runs many agents on one host.
func workerID(node string, k cluster.WorkerKey) string {
	parts := []string{node, k.Job}
	if k.Link != "" {
		parts = append(parts, k.Link)
	}
	parts = append(parts, strconv.Itoa(k.Worker))
	id := sanitize(strings.Join(parts, "."))
	if len(id) > 100 {
		sum := sha256.Sum256([]byte(id))
		id = id[:83] + "-" + hex.EncodeToString(sum[:8])
	}
	return id
}

// sanitize keeps what isolation.Spec.ID allows: [A-Za-z0-9][A-Za-z0-9_.-]*.
func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			i > 0 && (c == '_' || c == '.' || c == '-')
		if !ok {
			b[i] = '_'
		}
	}
	if len(b) > 0 && b[0] == '_' {
		b[0] = 'w'
	}
	return string(b)
}

// workerEnv is the worker contract's environment beyond what isolation.Spec derives: the
// assignment's own variables first, the contract's on top.
func (a *Agent) workerEnv(wa cluster.WorkerAssignment, port int, config string) map[string]string {
	env := wa.RunEnv()
	env[EnvWorkers] = strconv.Itoa(wa.Workers)
	env[EnvDC] = a.cfg.Node.DC
	env[EnvRack] = a.cfg.Node.Rack
	env[EnvLink] = wa.Key.Link
	env[EnvPort] = strconv.Itoa(port)
	env[EnvOutput] = wa.Output
	if len(wa.Routers) > 0 {
		// The routers as they were when the worker started; the live configuration
		// follows them as they move.
		env[EnvOutput] = strings.Join(wa.Routers, ",")
	}
	env[EnvGeneration] = strconv.FormatInt(wa.Generation, 10)
	env[EnvAddr] = a.cfg.Node.Addr
	env[EnvConfig] = config
	if wa.System && a.cfg.StoreCredentialsFile != "" {
		// The router's own copy (writeRouterCredentials), not the agent's file.
		env[EnvStoreCredentialsFile] = a.workerPath(workerIDOf(a, wa), isolationOf(wa), credentialsFile)
	}
	if wa.System && a.cfg.SinkDir != "" {
		env[EnvSinkDir] = a.cfg.SinkDir
	}
	return env
}

// SelfPath is the stormdock binary as a worker under isolation mode sees it: the image's
// copy at containerSelf inside a docker container, self (the agent's own) otherwise.
func SelfPath(mode, self, containerSelf string) string {
	if mode == cluster.IsolationDocker {
		return containerSelf
	}
	return self
}

// ResolveSelf applies the rule that lets a job run `stormdock ...` on nodes where stormdock
// is not on PATH: a command whose program is exactly SelfCommand runs self (see SelfPath)
// instead. It returns a copy; other commands come back unchanged.
func ResolveSelf(cmd []string, self string) []string {
	cmd = slices.Clone(cmd)
	if len(cmd) > 0 && cmd[0] == SelfCommand {
		cmd[0] = self
	}
	return cmd
}

// command resolves the assignment's command for the isolation it runs under (ResolveSelf)
// and, unless leases are off, wraps it in the lease launcher. A docker worker without a
// command gets the launcher's part alone, ending in "--": the driver adds the image's own
// entrypoint and cmd (imageCommand).
func (a *Agent) command(wa cluster.WorkerAssignment, mode, leaseFile string) []string {
	self := SelfPath(mode, a.cfg.Self, a.cfg.ContainerSelf)
	cmd := ResolveSelf(wa.Command, self)
	if a.cfg.NoLease {
		return cmd
	}
	lc := launcher.Config{Lease: leaseFile, TTL: a.leaseTTL(), Grace: wa.Grace.Std(), Command: cmd}
	bin := a.cfg.Launcher
	if mode == cluster.IsolationDocker {
		// The launcher bind-mounted into the container (dockerlaunch.go); without one, the
		// image's own stormdock, which images built by stormdock hold.
		bin = self
		if a.dockerLauncher != "" {
			bin = containerLauncher
		}
	}
	return append([]string{bin, launcher.Command}, lc.Args()...)
}

// imageCommand reports a docker worker that runs its image's own entrypoint and cmd.
func imageCommand(wa cluster.WorkerAssignment, mode string) bool {
	return mode == cluster.IsolationDocker && len(wa.Command) == 0
}

// workerIDOf is the worker id of an assignment on the agent's node.
func workerIDOf(a *Agent, wa cluster.WorkerAssignment) string { return workerID(a.cfg.Node.ID, wa.Key) }

// spec builds the isolation spec of one worker, run as u (see workerUser).
func (a *Agent) spec(id string, wa cluster.WorkerAssignment, mode string, port int, u *isolation.User) isolation.Spec {
	leaseFile, config := a.leaseFile(id), a.configFile(id)
	var mounts []isolation.Mount
	if mode == cluster.IsolationDocker {
		// The worker's directory holds its lease, its live configuration and its token.
		mounts = []isolation.Mount{{Source: filepath.Dir(leaseFile), Target: containerLeaseDir, ReadOnly: true}}
		leaseFile = filepath.Join(containerLeaseDir, filepath.Base(leaseFile))
		config = filepath.Join(containerLeaseDir, filepath.Base(config))
		if a.dockerLauncher != "" && !a.cfg.NoLease {
			mounts = append(mounts, isolation.Mount{Source: a.dockerLauncher, Target: containerLauncher, ReadOnly: true})
		}
	}
	env := a.workerEnv(wa, port, config)
	if wa.OutputToken != "" {
		env[EnvOutputTokenFile] = a.tokenPath(id, mode)
	}
	if len(wa.Secrets) > 0 {
		env[EnvSecretsDir] = a.secretsPath(id, mode)
		if mode == cluster.IsolationDocker {
			mounts = append(mounts, isolation.Mount{Source: a.secretsDir(id), Target: containerSecretsDir, ReadOnly: true})
		}
	}
	a.routerTLSEnv(env, id, wa, mode)
	return isolation.Spec{
		ID:           id,
		Job:          wa.Key.Job,
		Tenant:       wa.Tenant,
		Worker:       wa.Key.Worker,
		Node:         a.cfg.Node.ID,
		Command:      a.command(wa, mode, leaseFile),
		ImageCommand: imageCommand(wa, mode),
		Env:          env,
		User:         u,
		Image:        imageRef(wa),
		MemoryBytes:  int64(wa.Resources.Memory),
		MilliCPU:     int64(wa.Resources.CPU),
		Grace:        grace(wa),
		Mounts:       mounts,
	}
}

// grace is the assignment's grace period, or the default when it sets none.
func grace(wa cluster.WorkerAssignment) time.Duration {
	if wa.Grace <= 0 {
		return cluster.DefaultGracePeriod
	}
	return wa.Grace.Std()
}

// isolationOf is the assignment's isolation mode, process when it names none.
func isolationOf(wa cluster.WorkerAssignment) string {
	if wa.Isolation == "" {
		return cluster.IsolationProcess
	}
	return wa.Isolation
}
