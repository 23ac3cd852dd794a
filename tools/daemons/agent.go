package daemons

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/agents/launcher"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/daemon"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/tools/commands"
)

// AgentCommand runs the node agent.
var AgentCommand = &cli.Command{
	Name:      "agent",
	Usage:     "run the node agent: register the node and run the workers assigned to it",
	UsageText: "stormdock agent --store URL --node-id ID --dc DC --rack RACK --slots N --memory Q --cpu C [flags]",
	Description: "Flags go first. Workers keep running when the agent stops; a restarted agent adopts them.\n" +
		"A job command named `stormdock` runs this binary. Every worker runs under the lease launcher\n" +
		"(`stormdock-shim launch` when stormdock-shim is installed beside this binary, else `stormdock launch`),\n" +
		"which stops it when the agent has not renewed its lease for --lease-ttl (default: the session timeout).",
	Flags: append([]cli.Flag{
		&cli.StringFlag{Name: "store", Usage: "coordination store `URL` (zk://host:port/chroot, zks:// for TLS, mem://, file:///path)", EnvVars: []string{"STORMDOCK_STORE"}, Required: true},
		commands.StoreCredentialsFlag,
		commands.StoreTLSFlags[0], commands.StoreTLSFlags[1], commands.StoreTLSFlags[2],
		&cli.StringFlag{Name: "node-id", Usage: "node `ID`", Required: true},
		&cli.StringFlag{Name: "host", Usage: "host name reported for the node (default: the machine's)"},
		&cli.StringFlag{Name: "advertise-addr", Usage: "`ADDR` other hosts reach this node's workers and services at (routers listen there); default: the address of the interface that reaches the store"},
		&cli.StringFlag{Name: "dc", Usage: "data center", Required: true},
		&cli.StringFlag{Name: "rack", Usage: "rack", Required: true},
		&cli.IntFlag{Name: "slots", Usage: "worker slots", Required: true},
		&cli.StringFlag{Name: "memory", Usage: "memory for workers (`QUANTITY`, e.g. 16Gi)", Required: true},
		&cli.StringFlag{Name: "cpu", Usage: "cpus for workers (e.g. 8 or 7.5)", Required: true},
		&cli.StringFlag{Name: "labels", Usage: "node labels `k=v,...`"},
		&cli.StringFlag{Name: "cgroups", Usage: "process workers in cgroups: required, auto (run them unconfined, in process groups, where no cgroup hierarchy is writable, e.g. in a container) or off", Value: "required"},
		&cli.StringSliceFlag{Name: "isolation", Usage: "isolation drivers to offer: process, docker (repeatable or comma list)", Value: cli.NewStringSlice(cluster.IsolationProcess)},
		&cli.DurationFlag{Name: "session-timeout", Usage: "store session timeout", Value: 2 * time.Second},
		&cli.DurationFlag{Name: "heartbeat", Usage: "how long the node record waits for a burst of starts to end, at most; memory is sampled every 5 heartbeats (changes are written at once)", Value: agents.DefaultHeartbeat},
		&cli.DurationFlag{Name: "restart-backoff", Usage: "first delay before a crashed worker is restarted; it doubles with every crash within the crash-loop window that came within 10s of the worker's start, up to a minute (a crash after a longer run restarts after this delay again)", Value: agents.DefaultRestartBackoff},
		&cli.DurationFlag{Name: "lease-ttl", Usage: "how long workers outlive their keeper's last lease renewal (default: the session timeout)"},
		&cli.DurationFlag{Name: "restart-grace", Usage: "how long the node's workers keep running while the agent is not (an upgrade, a crash): a keeper process holds the node meanwhile; 0 ties the node to the agent's process", Value: 30 * time.Second},
		&cli.DurationFlag{Name: "store-silence", Usage: "how long workers keep running while no store server answers at all (a partition of this node, or every store host down); default: the session timeout, so that no worker runs twice for longer"},
		&cli.DurationFlag{Name: "rejoin-grace", Usage: "once the store is back from an outage it had for everyone, how long workers keep running while this node has not got its session back; it, and twice --session-timeout, must not exceed the masters' --reregister-grace, or a worker may run twice", Value: agents.DefaultRejoinGrace},
		&cli.BoolFlag{Name: "no-lease", Usage: "run workers without the lease launcher (they then outlive a dead agent)"},
		sinkDirFlag(),
		&cli.StringFlag{Name: "run-as", Usage: "single-tenant opt-out: every tenant's process workers run as `USER` (name or UID:GID, never root) instead of each tenant's own uid, so tenants are not apart on this node (default: each tenant's uid)"},
		&cli.StringFlag{Name: "state-dir", Usage: "agent and driver state `DIR`", Value: "/var/lib/stormdock/agent"},
		&cli.StringFlag{Name: "docker-host", Usage: "docker engine for --isolation docker (default: DOCKER_HOST or the local socket)"},
		&cli.StringFlag{Name: "registry-auth", Usage: "registry credentials `FILE` (Docker's config.json format) for images under the prefixes the admin shares (`stormdock image share`); tenants' other images are pulled with their own (`stormdock tenant registry-auth`)"},
		&cli.IntFlag{Name: "image-gc-keep", Usage: "keep at most N stormdock images no container uses, removing the least recently used beyond (0: no count cap)", Value: 5},
		&cli.StringFlag{Name: "image-gc-max-size", Usage: "remove unused stormdock images, least recently used first, while all of them take more than `QUANTITY` (e.g. 5Gi; 0: no size cap)", Value: "0"},
		&cli.DurationFlag{Name: "image-gc-unused", Usage: "an image is removed only after no container used it for this long", Value: images.DefaultGCUnused},
		&cli.IntFlag{Name: "port-base", Usage: "first STORMDOCK_PORT given to workers (their STORMDOCK_METRICS_PORT comes from the same range)", Value: agents.DefaultPortBase},
		&cli.DurationFlag{Name: "metrics-interval", Usage: "how often the workers' metrics are scraped (at STORMDOCK_METRICS_PORT) and their cpu and memory measured, for the masters; 0 turns job metrics off", Value: agents.DefaultMetricsInterval},
		&cli.StringFlag{Name: "metrics", Usage: "serve Prometheus metrics at http://`ADDR`/metrics, to the scrape token or the admin token, and Go profiles at /debug/pprof/ and runtime figures at /debug/runtime to the admin token alone (\"off\" to disable)", Value: "127.0.0.1:0"},
		&cli.StringFlag{Name: "logs-listen", Usage: "`ADDR` (HOST:PORT) where the masters read this node's workers' logs (default: --advertise-addr, any free port, published in the node record; \"off\" serves none)"},
		&cli.BoolFlag{Name: "tls", Usage: "serve the workers' logs over TLS, with a certificate made in --state-dir that the masters trust by its hash (use it when the masters serve TLS)"},
		&cli.StringFlag{Name: "log-level", Usage: "debug, info, warn or error", Value: "info"},
	}, healthFlags()...),
	Action: runAgent,
}

func runAgent(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("stormdock agent: unexpected argument %q (flags go first)", c.Args().First()), 2)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return cli.Exit(fmt.Sprintf("stormdock agent: --log-level: %v", err), 2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	node, err := agentNode(c)
	if err != nil {
		return cli.Exit("stormdock agent: "+err.Error(), 2)
	}
	switch c.String("cgroups") {
	case daemon.CgroupsRequired, daemon.CgroupsAuto, daemon.CgroupsOff:
	default:
		return cli.Exit(fmt.Sprintf("stormdock agent: --cgroups must be required, auto or off, not %q", c.String("cgroups")), 2)
	}
	modes, err := isolationModes(c.StringSlice("isolation"))
	if err != nil {
		return cli.Exit("stormdock agent: "+err.Error(), 2)
	}
	if c.Duration("session-timeout") <= 0 || c.Duration("heartbeat") <= 0 || c.Duration("restart-backoff") <= 0 {
		return cli.Exit("stormdock agent: --session-timeout, --heartbeat and --restart-backoff must be positive", 2)
	}
	if c.Duration("restart-grace") < 0 || c.Duration("store-silence") < 0 {
		return cli.Exit("stormdock agent: --restart-grace and --store-silence must not be negative", 2)
	}
	if c.Duration("rejoin-grace") <= 0 {
		return cli.Exit("stormdock agent: --rejoin-grace must be positive (at most the masters' --reregister-grace)", 2)
	}
	stateDir, err := filepath.Abs(c.String("state-dir"))
	if err != nil {
		return cli.Exit("stormdock agent: --state-dir: "+err.Error(), 2)
	}
	if _, err := coord.ParseURL(c.String("store")); err != nil {
		return cli.Exit("stormdock agent: --store: "+err.Error(), 2)
	}

	creds, err := commands.StoreCredentials(c)
	if err != nil {
		return err
	}
	storeTLS, err := commands.StoreTLS(c)
	if err != nil {
		return err
	}
	runAs, err := runAsUser(c.String("run-as"))
	if err != nil {
		return cli.Exit("stormdock agent: --run-as: "+err.Error(), 2)
	}
	warnRunAs(log, runAs)
	sinkDir, err := sinkDirOf(c)
	if err != nil {
		return err
	}
	hcfg, err := healthConfig(c)
	if err != nil {
		return cli.Exit("stormdock agent: "+err.Error(), 2)
	}
	gc := images.GCConfig{Keep: c.Int("image-gc-keep"), Unused: c.Duration("image-gc-unused")}
	switch {
	case gc.Keep < 0:
		return cli.Exit("stormdock agent: --image-gc-keep must be 0 (no count cap) or more", 2)
	case gc.Unused <= 0:
		return cli.Exit("stormdock agent: --image-gc-unused must be positive", 2)
	}
	if s := c.String("image-gc-max-size"); s != "0" {
		maxSize, err := cluster.ParseBytes(s)
		if err != nil {
			return cli.Exit("stormdock agent: --image-gc-max-size: "+err.Error(), 2)
		}
		gc.MaxBytes = int64(maxSize)
	}
	if p := c.String("registry-auth"); p != "" {
		if _, err := images.LoadAuth(p); err != nil {
			return cli.Exit("stormdock agent: --registry-auth: "+err.Error(), 2)
		}
	}
	metrics := c.String("metrics")
	if metrics == "off" {
		metrics = ""
	}
	logsListen := c.String("logs-listen")
	if logsListen != "" && logsListen != "off" {
		if _, _, err := net.SplitHostPort(logsListen); err != nil {
			return cli.Exit(fmt.Sprintf("stormdock agent: --logs-listen %q: want HOST:PORT (PORT 0 picks one), or off", logsListen), 2)
		}
	}
	metricsInterval := c.Duration("metrics-interval")
	switch {
	case metricsInterval == 0:
		metricsInterval = -1
	case metricsInterval < 100*time.Millisecond || metricsInterval > 10*time.Minute:
		return cli.Exit(fmt.Sprintf("stormdock agent: --metrics-interval must be between 100ms and 10m (or 0: off), not %s", metricsInterval), 2)
	}
	a, err := daemon.NewAgent(c.Context, daemon.AgentConfig{
		Node:                 node,
		Store:                c.String("store"),
		StoreOptions:         coord.Options{SessionTimeout: c.Duration("session-timeout"), Credentials: creds, TLS: storeTLS},
		StoreCredentialsFile: c.String("store-credentials-file"),
		StateDir:             stateDir,
		Drivers: daemon.DriverConfig{Isolation: modes, Cgroups: c.String("cgroups"), CgroupParent: hcfg.CgroupParent,
			DockerHost: c.String("docker-host")},
		Heartbeat:       c.Duration("heartbeat"),
		RestartBackoff:  c.Duration("restart-backoff"),
		PortBase:        c.Int("port-base"),
		MetricsInterval: metricsInterval,
		LeaseTTL:        c.Duration("lease-ttl"),
		NoLease:         c.Bool("no-lease"),
		RunAs:           runAs,
		SinkDir:         sinkDir,
		RestartGrace:    c.Duration("restart-grace"),
		StoreSilence:    c.Duration("store-silence"),
		RejoinGrace:     c.Duration("rejoin-grace"),
		Health:          hcfg,
		ProtectOOM:      true,
		Metrics:         metrics,
		LogsListen:      strings.TrimPrefix(logsListen, "off"),
		LogsOff:         logsListen == "off",
		LogsTLS:         c.Bool("tls"),
		RegistryAuth:    c.String("registry-auth"),
		ImageGC:         gc,
		Logger:          log,
	})
	if err != nil {
		if c.Context.Err() != nil {
			return nil // stopped while it waited for the store
		}
		return cli.Exit("stormdock agent: "+err.Error(), 1)
	}
	defer a.Close()
	return a.Run(c.Context)
}

var labelKeyRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9_./-]*[A-Za-z0-9])?$`)

func agentNode(c *cli.Context) (cluster.Node, error) {
	n := cluster.Node{ID: c.String("node-id"), Host: c.String("host"), Addr: c.String("advertise-addr"), DC: c.String("dc"), Rack: c.String("rack"), Slots: c.Int("slots")}
	if n.Addr != "" && net.ParseIP(n.Addr) == nil {
		if _, err := net.LookupHost(n.Addr); err != nil {
			return n, fmt.Errorf("--advertise-addr %q: not an IP address or a resolvable host name", n.Addr)
		}
	}
	for flag, v := range map[string]string{"node-id": n.ID, "dc": n.DC, "rack": n.Rack} {
		if err := cluster.CheckName(v); err != nil {
			return n, fmt.Errorf("--%s: %v", flag, err)
		}
	}
	if n.Slots < 0 {
		return n, fmt.Errorf("--slots %d must not be negative", n.Slots)
	}
	if n.Host == "" {
		h, err := os.Hostname()
		if err != nil {
			return n, fmt.Errorf("host name: %v (give --host)", err)
		}
		n.Host = h
	}
	var err error
	if n.Memory, err = cluster.ParseBytes(c.String("memory")); err != nil {
		return n, fmt.Errorf("--memory: %v", err)
	}
	if n.CPU, err = cluster.ParseCPU(c.String("cpu")); err != nil {
		return n, fmt.Errorf("--cpu: %v", err)
	}
	if s := c.String("labels"); s != "" {
		n.Labels = map[string]string{}
		for _, kv := range strings.Split(s, ",") {
			k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok || !labelKeyRE.MatchString(k) {
				return n, fmt.Errorf("--labels: %q is not key=value", kv)
			}
			if strings.HasPrefix(k, "isolation/") {
				return n, fmt.Errorf("--labels: %s is set by the agent from --isolation", k)
			}
			n.Labels[k] = v
		}
	}
	return n, nil
}

// runAsUser resolves --run-as, the single-tenant opt-out: a user name or UID:GID, never
// root. Empty: nil, each tenant's workers run as the tenant's own uid.
func runAsUser(name string) (*isolation.User, error) {
	if name == "" {
		return nil, nil
	}
	u := isolation.User{Name: name}
	if uid, gid, ok := strings.Cut(name, ":"); ok {
		un, err1 := strconv.ParseUint(uid, 10, 32)
		gn, err2 := strconv.ParseUint(gid, 10, 32)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%q is not UID:GID", name)
		}
		u.UID, u.GID, u.Name = uint32(un), uint32(gn), ""
	} else {
		pu, err := user.Lookup(name)
		if err != nil {
			return nil, fmt.Errorf("%v (give a user of this machine, or UID:GID)", err)
		}
		un, _ := strconv.ParseUint(pu.Uid, 10, 32)
		gn, _ := strconv.ParseUint(pu.Gid, 10, 32)
		u.UID, u.GID = uint32(un), uint32(gn)
	}
	if u.UID == 0 || u.GID == 0 {
		return nil, fmt.Errorf("%s is root: tenants' code never runs as root; give another user, or leave --run-as out so that each tenant runs as its own uid", u)
	}
	return &u, nil
}

// warnRunAs says, once at start, what --run-as gives up.
func warnRunAs(log *slog.Logger, u *isolation.User) {
	if u != nil {
		log.Warn(fmt.Sprintf("--run-as: every tenant's process workers run as %s; tenants are not apart on this node", u))
	}
}

func isolationModes(vals []string) ([]string, error) {
	var modes []string
	for _, v := range vals {
		for _, m := range strings.Split(v, ",") {
			m = strings.TrimSpace(m)
			switch m {
			case cluster.IsolationProcess, cluster.IsolationDocker:
				if !slices.Contains(modes, m) {
					modes = append(modes, m)
				}
			default:
				return nil, fmt.Errorf("--isolation: unknown isolation %q (process or docker)", m)
			}
		}
	}
	if len(modes) == 0 {
		return nil, errors.New("--isolation: give at least one of process, docker")
	}
	return modes, nil
}

// LaunchCommand is the lease launcher (package launcher) in the whole binary: agents run
// stormdock-shim's where they find it, this one otherwise. It is hidden: the agent writes
// its command lines with launcher.Config.Args, and both read them with launcher.Config.Parse,
// so they cannot drift apart.
var LaunchCommand = &cli.Command{
	Name:            launcher.Command,
	Hidden:          true,
	Usage:           "run a worker while its agent renews its lease",
	UsageText:       "stormdock launch --lease FILE --ttl D [--grace G] -- COMMAND [ARGS...]",
	Description:     "Flags:\n" + launcher.Usage(),
	SkipFlagParsing: true,
	// No help subcommand: every argument is the command line's own.
	HideHelpCommand: true,
	Action:          launchRun,
}
