package daemons

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/daemon"
	"github.com/stormdock/stormdock/tools/commands"
)

// UpCommand runs a local cluster in the foreground.
var UpCommand = &cli.Command{
	Name:  "up",
	Usage: "run a local cluster: a master and N agents in this process, with simulated data centers and racks",
	Flags: append([]cli.Flag{
		&cli.IntFlag{Name: "nodes", Usage: "simulated nodes", Value: 12},
		&cli.StringFlag{Name: "dcs", Usage: "data centers, comma-separated", Value: "dc-a,dc-b,dc-c"},
		&cli.IntFlag{Name: "racks-per-dc", Usage: "racks in each data center", Value: 2},
		&cli.IntFlag{Name: "slots", Usage: "worker slots per node", Value: 4},
		&cli.StringFlag{Name: "isolation", Usage: "process, or docker to offer docker workers too", Value: "process"},
		&cli.StringFlag{Name: "data", Usage: "`DIR` for the store, the admin token and the agents' state", Value: commands.DefaultDataDir(), EnvVars: []string{"STORMDOCK_DATA"}},
		&cli.StringFlag{Name: "api", Usage: "`ADDR` of the master's API and /metrics", Value: "127.0.0.1:7070"},
		&cli.StringFlag{Name: "store", Usage: "join a real store instead of the embedded one (zk://HOST:PORT/CHROOT, zks:// for TLS with --store-ca)"},
		commands.StoreTLSFlags[0], commands.StoreTLSFlags[1], commands.StoreTLSFlags[2],
		&cli.StringFlag{Name: "registry-auth", Usage: "registry credentials `FILE` (Docker's config.json format) for pinning and pulling the images under shared prefixes (`stormdock image share`); tenants' other images use their own (`stormdock tenant registry-auth`)"},
		&cli.StringFlag{Name: "run-as", Usage: "single-tenant opt-out: every tenant's process workers run as `USER` (name or UID:GID, never root) instead of each tenant's own uid, so tenants are not apart (default: each tenant's uid; without root, give your own user)"},
		tenantUIDsFlag(),
		&cli.StringFlag{Name: "sink-dir", Usage: "`DIR` below which mirrored jobs' file sinks live, as DIR/TENANT/...; off turns file sinks off (default: /var/lib/stormdock/sinks as root, whose routers run as their tenants' uids and cannot enter --data; else DATA-DIR/sinks)"},
		&cli.StringFlag{Name: "secrets-key", Usage: "keyring `FILE` tenant secrets are sealed with; off turns secrets off (default: DATA-DIR/secrets.key, made at the first start)"},
		&cli.BoolFlag{Name: "tls", Usage: "serve the API over TLS (a CA and certificate are made in --data at the first start; the CLI trusts them by itself)", Value: true},
		&cli.DurationFlag{Name: "session-timeout", Usage: "store session timeout", Value: 2 * time.Second},
		&cli.StringFlag{Name: "log-level", Usage: "debug, info, warn or error", Value: "info"},
		&cli.StringFlag{Name: "cgroup-parent", Usage: "cgroup `PATH` below which each node's workers go (PATH/NODE; default /stormdock-local/<name of --data>); a memory limit on it bounds the whole cluster, and in a subtree delegated to you workers run in cgroups without root"},
	}, append(append(eventsFlags(), metricsFlags()...), localHealthFlags()...)...),
	Action: runUp,
}

func runUp(c *cli.Context) error {
	if c.NArg() > 0 {
		return commands.UsageErr("up takes no arguments, got %q", c.Args().First())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return commands.UsageErr("--log-level: %v", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	iso := []string{"process"}
	switch c.String("isolation") {
	case "process":
	case "docker":
		iso = append(iso, "docker")
	default:
		return commands.UsageErr("--isolation must be process or docker, not %q", c.String("isolation"))
	}
	if c.Int("nodes") < 1 || c.Int("slots") < 1 || c.Int("racks-per-dc") < 1 {
		return commands.UsageErr("--nodes, --slots and --racks-per-dc must be at least 1")
	}
	var dcs []string
	for _, dc := range strings.Split(c.String("dcs"), ",") {
		if dc = strings.TrimSpace(dc); dc != "" {
			dcs = append(dcs, dc)
		}
	}
	health, err := healthConfig(c)
	if err != nil {
		return commands.UsageErr("%v", err)
	}
	runAs, err := runAsUser(c.String("run-as"))
	if err != nil {
		return commands.UsageErr("--run-as: %v", err)
	}
	uids, err := tenantUIDs(c)
	if err != nil {
		return err
	}
	warnRunAs(log, runAs)
	events, err := eventsConfig(c)
	if err != nil {
		return err
	}
	metrics, err := metricsConfig(c)
	if err != nil {
		return err
	}
	storeTLS, err := commands.StoreTLS(c)
	if err != nil {
		return err
	}
	lc, err := daemon.StartLocal(c.Context, daemon.LocalConfig{
		Events: events, Metrics: metrics,
		Nodes: c.Int("nodes"), DCs: dcs, RacksPerDC: c.Int("racks-per-dc"), Slots: c.Int("slots"),
		DataDir: c.String("data"), Store: c.String("store"), StoreTLS: storeTLS, API: c.String("api"),
		SessionTimeout: c.Duration("session-timeout"), Isolation: iso, Health: &health, Logger: log, TLS: c.Bool("tls"), RunAs: runAs,
		RegistryAuth: c.String("registry-auth"),
		CgroupParent: c.String("cgroup-parent"),
		SinkDir:      c.String("sink-dir"),
		SecretsKey:   c.String("secrets-key"),
		TenantUIDs:   uids,
	})
	if err != nil {
		if c.Context.Err() != nil {
			return nil // stopped while it waited for the store
		}
		return cli.Exit("stormdock up: "+err.Error(), 1)
	}
	w := c.App.Writer
	fmt.Fprintf(w, "stormdock local cluster: %d nodes in %s\n", c.Int("nodes"), strings.Join(dcs, ", "))
	fmt.Fprintf(w, "  API       %s   (export STORMDOCK_MASTER=%s)\n", lc.API(), lc.API())
	fmt.Fprintf(w, "  metrics   %s/metrics   (%s)\n", lc.API(), daemon.ScrapeHint(lc.API(), lc.MetricsTokenPath(), lc.CAFile()))
	fmt.Fprintf(w, "  console   %s/ui/   (log in with the admin token)\n", lc.API())
	if lc.TokenPath() != "" {
		fmt.Fprintf(w, "  admin token %s (the CLI finds it by itself)\n", lc.TokenPath())
	}
	if lc.MetricsTokenPath() != "" {
		fmt.Fprintf(w, "  scrape token %s (reads /metrics and nothing else; Prometheus: authorization.credentials_file)\n", lc.MetricsTokenPath())
	}
	if ca := lc.CAFile(); ca != "" {
		fmt.Fprintf(w, "  CA        %s (the CLI trusts it by itself; elsewhere: --ca or STORMDOCK_CA)\n", ca)
	}
	if !lc.Confined() {
		fmt.Fprintln(w, "  warning: not root, workers run without cgroup limits")
	}
	fmt.Fprintln(w, "Ctrl-C stops the cluster and every worker.")
	<-c.Context.Done()
	fmt.Fprintln(w, "stopping: workers drain with their grace period")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return lc.Close(ctx)
}
