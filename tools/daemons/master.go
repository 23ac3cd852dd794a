package daemons

import (
	"crypto/tls"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/daemon"
	"github.com/stormdock/stormdock/internal/atomicfile"
	"github.com/stormdock/stormdock/internal/keyring"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/eventlog"
	"github.com/stormdock/stormdock/master/jobmetrics"
	"github.com/stormdock/stormdock/tools/commands"
)

// storeFlags are the flags of every process that opens the coordination store.
func storeFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: "store", Usage: "coordination store `URL`: zk://HOST:PORT[,HOST:PORT]/CHROOT (zks:// for TLS), file:///PATH or mem://NAME",
			EnvVars: []string{"STORMDOCK_STORE"}, Required: true},
		&cli.DurationFlag{Name: "session-timeout", Usage: "store session timeout: how fast a lost process is noticed", Value: 2 * time.Second},
		commands.StoreCredentialsFlag,
	}, commands.StoreTLSFlags...)
}

// storeOptions are the store flags' options.
func storeOptions(c *cli.Context) (coord.Options, error) {
	creds, err := commands.StoreCredentials(c)
	if err != nil {
		return coord.Options{}, err
	}
	files, err := commands.StoreTLS(c)
	return coord.Options{SessionTimeout: c.Duration("session-timeout"), Credentials: creds, TLS: files}, err
}

// Environment that gives a master its certificate and key as PEM text, for a container
// whose file system holds no files of its own (see provision/docker).
const (
	envTLSCertPEM = "STORMDOCK_TLS_CERT_PEM"
	envTLSKeyPEM  = "STORMDOCK_TLS_KEY_PEM"
)

// masterTLS is the master's TLS configuration from its flags: nil without TLS.
func masterTLS(c *cli.Context) (*tls.Config, error) {
	cert, key := c.String("tls-cert"), c.String("tls-key")
	certPEM, keyPEM := os.Getenv(envTLSCertPEM), os.Getenv(envTLSKeyPEM)
	switch {
	case (cert == "") != (key == ""):
		return nil, commands.UsageErr("--tls-cert and --tls-key go together")
	case cert != "":
		conf, err := daemon.ServerTLS(cert, key)
		if err != nil {
			return nil, commands.UsageErr("--tls-cert, --tls-key: %v", err)
		}
		return conf, nil
	case certPEM != "" && keyPEM != "":
		conf, err := daemon.ServerTLSPEM([]byte(certPEM), []byte(keyPEM))
		if err != nil {
			return nil, commands.UsageErr("%s, %s: %v", envTLSCertPEM, envTLSKeyPEM, err)
		}
		return conf, nil
	case c.Bool("tls"):
		conf, err := daemon.MasterTLS(c.String("data"), c.String("api"), c.String("advertise-api"))
		if err != nil {
			return nil, cli.Exit("stormdock master: "+err.Error(), 1)
		}
		return conf, nil
	}
	return nil, nil
}

// envSecretsKeyring gives a master its keyring as text, for a container whose file system
// holds no files of its own (see provision/docker): written to --data/secrets.key, 0600.
const envSecretsKeyring = "STORMDOCK_SECRETS_KEYRING"

// secretsKeyOf is the master's keyring file: --secrets-key, or the one written from
// STORMDOCK_SECRETS_KEYRING, or "" (secrets off).
func secretsKeyOf(c *cli.Context) (string, error) {
	if f := c.String("secrets-key"); f != "" {
		if _, err := keyring.Load(f); err != nil {
			return "", commands.UsageErr("--secrets-key: %v", err)
		}
		return f, nil
	}
	text := os.Getenv(envSecretsKeyring)
	if text == "" {
		return "", nil
	}
	if _, err := keyring.Parse([]byte(text), envSecretsKeyring); err != nil {
		return "", commands.UsageErr("%v", err)
	}
	path := filepath.Join(c.String("data"), daemon.SecretsKeyFile)
	if err := os.MkdirAll(c.String("data"), 0o700); err != nil {
		return "", cli.Exit("stormdock master: "+err.Error(), 1)
	}
	if err := atomicfile.WriteFile(path, []byte(text), 0o600); err != nil {
		return "", cli.Exit("stormdock master: "+err.Error(), 1)
	}
	return path, nil
}

// memoryLimitOf reads --memory-limit: 0 when not given.
func memoryLimitOf(c *cli.Context) (int64, error) {
	v := c.String("memory-limit")
	if v == "" {
		return 0, nil
	}
	n, err := cluster.ParseBytes(v)
	if err != nil || n < 64<<20 {
		return 0, commands.UsageErr("--memory-limit %q: give a size of at least 64Mi, such as 768Mi or 2Gi", v)
	}
	return int64(n), nil
}

// MasterCommand runs a master.
var MasterCommand = &cli.Command{
	Name:  "master",
	Usage: "run a master: leader election, placement, failure handling and the HTTP API",
	Flags: append(append(storeFlags(),
		&cli.StringFlag{Name: "api", Usage: "`ADDR` the HTTP API, /metrics and the admin's /debug/pprof/ listen on", Value: "127.0.0.1:7070"},
		&cli.StringFlag{Name: "advertise-api", Aliases: []string{"advertise"}, Usage: "`ADDR` (HOST:PORT) clients on other hosts reach the API at, published in the store; the TLS certificate covers it (default: --api; when that is every interface, the address that reaches the store)"},
		&cli.StringFlag{Name: "id", Usage: "master `ID` in the election (default host:api)"},
		sinkDirFlag(),
		&cli.StringFlag{Name: "data", Usage: "`DIR` for the admin token (admin.token, mode 0600), api.url and, with --tls, ca.crt, ca.key, master.crt and master.key", Value: commands.DefaultDataDir(), EnvVars: []string{"STORMDOCK_DATA"}},
		&cli.DurationFlag{Name: "reregister-grace", Usage: "after this master starts leading or its store comes back, how long nodes missing from the store are waited for before their workers move", Value: master.DefaultReregisterGrace},
		&cli.DurationFlag{Name: "avoid-period", Usage: "how long a node is avoided for a job after its workers crash-looped there; it doubles with every further crash loop there, up to --avoid-max (a job's workers that fit nowhere else go to an avoided node all the same)", Value: master.DefaultAvoidPeriod},
		&cli.DurationFlag{Name: "avoid-max", Usage: "the longest a node is avoided for a job after crash loops", Value: master.DefaultAvoidMax},
		&cli.StringFlag{Name: "registry-auth", Usage: "registry credentials `FILE` (Docker's config.json format) to pin the images under shared prefixes (`stormdock image share`) to digests with; tenants' other images are pinned with their own (`stormdock tenant registry-auth`)"},
		&cli.BoolFlag{Name: "tls", Usage: "serve the API over TLS: a CA and a server certificate are made in --data at the first start"},
		&cli.StringFlag{Name: "tls-cert", Usage: "serve the API over TLS with the certificate in `FILE` (PEM; with --tls-key)"},
		tenantUIDsFlag(),
		&cli.StringFlag{Name: "secrets-key", Usage: "keyring `FILE` (mode 0600) that tenant secrets are sealed with, the same on every master: make it with `stormdock secret keygen FILE` (default: none, secrets off)", EnvVars: []string{"STORMDOCK_SECRETS_KEY"}},
		&cli.StringFlag{Name: "memory-limit", Usage: "soft limit of the master's memory, as `SIZE` (768Mi, 2Gi): the Go runtime collects garbage more often as the process nears it (GOMEMLIMIT); keep it well above the live heap (docs/benchmarks.md gives it per node and worker), or collection takes up to half a core (default: none)"},
	), append(eventsFlags(), metricsFlags()...)...),
	Action: func(c *cli.Context) error {
		if c.NArg() != 0 {
			return commands.UsageErr("master takes no arguments, got %q", c.Args().First())
		}
		secretsKey, err := secretsKeyOf(c)
		if err != nil {
			return err
		}
		if _, err := coord.ParseURL(c.String("store")); err != nil {
			return commands.UsageErr("--store: %v", err)
		}
		limit, err := memoryLimitOf(c)
		if err != nil {
			return err
		}
		if limit > 0 {
			// The runtime's soft limit (GOMEMLIMIT): the flag wins over the environment.
			debug.SetMemoryLimit(limit)
		}
		if p, m := c.Duration("avoid-period"), c.Duration("avoid-max"); p <= 0 || m < p {
			return commands.UsageErr("--avoid-period %s, --avoid-max %s: give a period above 0 and a cap no shorter than it", p, m)
		}
		log := slog.Default()
		sinkDir, err := sinkDirOf(c)
		if err != nil {
			return err
		}
		tlsConf, err := masterTLS(c)
		if err != nil {
			return err
		}
		opts, err := storeOptions(c)
		if err != nil {
			return err
		}
		events, err := eventsConfig(c)
		if err != nil {
			return err
		}
		metrics, err := metricsConfig(c)
		if err != nil {
			return err
		}
		uids, err := tenantUIDs(c)
		if err != nil {
			return err
		}
		if g := c.Duration("reregister-grace"); g < agents.DefaultRejoinGrace {
			// A keeper holds its node's workers after a store outage for its --rejoin-grace
			// (and at least two sessions): this master moves them sooner.
			log.Warn("--reregister-grace is shorter than agents hold their workers after a store outage by default: start them with --rejoin-grace and twice --session-timeout at most this, or a worker may run twice",
				"reregister-grace", g, "default-rejoin-grace", agents.DefaultRejoinGrace)
		}
		m, err := daemon.NewMaster(c.Context, daemon.MasterConfig{
			Events:          events,
			Metrics:         metrics,
			TenantUIDs:      uids,
			Store:           c.String("store"),
			StoreOptions:    opts,
			Listen:          c.String("api"),
			Advertise:       c.String("advertise-api"),
			TLS:             tlsConf,
			ID:              c.String("id"),
			DataDir:         c.String("data"),
			SinkDir:         sinkDir,
			ReregisterGrace: c.Duration("reregister-grace"),
			AvoidPeriod:     c.Duration("avoid-period"),
			AvoidMax:        c.Duration("avoid-max"),
			RegistryAuth:    c.String("registry-auth"),
			SecretsKey:      secretsKey,
			Logger:          log,
		})
		if err != nil {
			if c.Context.Err() != nil {
				return nil // stopped while it waited for the store
			}
			return cli.Exit("stormdock master: "+err.Error(), 1)
		}
		defer m.Close()
		if m.TokenPath() != "" {
			log.Info("admin token", "path", m.TokenPath())
		} else {
			log.Info("admin token was made by another master; this data directory has none", "data", c.String("data"))
		}
		if m.MetricsTokenPath() != "" {
			log.Info("scrape token for /metrics", "path", m.MetricsTokenPath())
		} else {
			log.Info("scrape token was made by another master; this data directory has none (the admin token reads /metrics too)", "data", c.String("data"))
		}
		return m.Run(c.Context)
	},
}

// metricsFlags shape the jobs' metrics, on every master (and up).
func metricsFlags() []cli.Flag {
	return []cli.Flag{
		&cli.DurationFlag{Name: "metrics-interval", Usage: "how often every node's job metrics are pulled (and, with up, the workers scraped), the history's resolution; 0 turns job metrics (and autoscaling) off", Value: jobmetrics.DefaultInterval},
		&cli.DurationFlag{Name: "metrics-window", Usage: "how long the jobs' metrics are kept in memory, per series", Value: jobmetrics.DefaultWindow},
	}
}

func metricsConfig(c *cli.Context) (jobmetrics.Config, error) {
	cfg := jobmetrics.Config{Interval: c.Duration("metrics-interval"), Window: c.Duration("metrics-window")}
	switch {
	case cfg.Interval == 0:
		cfg.Interval = -1
	case cfg.Interval < 100*time.Millisecond || cfg.Interval > 10*time.Minute:
		return cfg, commands.UsageErr("--metrics-interval must be between 100ms and 10m (or 0: off), not %s", cfg.Interval)
	}
	if cfg.Interval > 0 && (cfg.Window < 2*cfg.Interval || cfg.Window/cfg.Interval > 100000) {
		return cfg, commands.UsageErr("--metrics-window %s must hold 2 to 100000 intervals of %s", cfg.Window, cfg.Interval)
	}
	return cfg, nil
}

// eventsFlags bound the cluster's events, on every master (and up).
func eventsFlags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: "events-max", Usage: "cluster events kept (in the store, and by every master); give every master the same", Value: eventlog.DefaultMax},
		&cli.DurationFlag{Name: "events-max-age", Usage: "how long a cluster event is kept", Value: eventlog.DefaultMaxAge},
		&cli.DurationFlag{Name: "events-flush", Usage: "how often a master appends the events it recorded to the store (one write each time)", Value: eventlog.DefaultFlush},
	}
}

func eventsConfig(c *cli.Context) (eventlog.Config, error) {
	cfg := eventlog.Config{Max: c.Int("events-max"), MaxAge: c.Duration("events-max-age"), Flush: c.Duration("events-flush")}
	switch {
	case cfg.Max < 1 || cfg.Max > 1_000_000:
		return cfg, commands.UsageErr("--events-max must be between 1 and 1000000, not %d", cfg.Max)
	case cfg.MaxAge <= 0:
		return cfg, commands.UsageErr("--events-max-age must be positive")
	case cfg.Flush < time.Millisecond || cfg.Flush > time.Minute:
		return cfg, commands.UsageErr("--events-flush must be between 1ms and 1m, not %s", cfg.Flush)
	}
	return cfg, nil
}

// tenantUIDsFlag is the range tenants' uids are given from, on every master and on up.
func tenantUIDsFlag() cli.Flag {
	return &cli.StringFlag{Name: "tenant-uids", Value: cluster.DefaultTenantUIDs.String(),
		Usage: "`FIRST-LAST` uids the tenants' workers run as: each tenant takes two (its workers', its output routers'), given once at `tenant create` and never again; the same on every master"}
}

// tenantUIDs reads --tenant-uids, refusing a range that holds root, the system's users or
// this process's uid.
func tenantUIDs(c *cli.Context) (cluster.UIDRange, error) {
	r, err := cluster.ParseUIDRange(c.String("tenant-uids"), os.Geteuid())
	if err != nil {
		return r, commands.UsageErr("%v", err)
	}
	return r, nil
}
