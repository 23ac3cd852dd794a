package daemons

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/daemon"
	"github.com/stormdock/stormdock/internal/await"
	"github.com/stormdock/stormdock/internal/metricsauth"
	"github.com/stormdock/stormdock/multidc"
	"github.com/stormdock/stormdock/tools/commands"
)

// RouterCommand runs the output router of a mirrored job. The master writes its command line
// with multidc.RouterArgs.Args and routerRun reads it with multidc.RouterArgs.Parse, so the
// two cannot drift apart; its flags are listed in the description for the same reason.
var RouterCommand = &cli.Command{
	Name:  multidc.RouterCommand,
	Usage: "run the output router of a mirrored job: one link's output to the sink, exactly once, with failover",
	UsageText: "stormdock router --store URL --job JOB --links dc-a,dc-b --sink file:///SINKDIR/TENANT/PATH|http://HOST/PATH|postgres://USER@HOST:PORT/DB?table=NAME|nats://HOST:PORT/SUBJECT[?tls=true] " +
		"--sink-dir SINKDIR --tenant TENANT --listen 127.0.0.1:PORT [--sink-password-file FILE] [--heartbeat-timeout D]",
	Description: "Workers post their records to https://LISTEN/v1/records (http:// without --tls-cert) and heartbeat at /v1/heartbeat\n" +
		"(protocol: go doc github.com/stormdock/stormdock/multidc). Status: GET /v1/status, metrics: /metrics (with the scrape token).\n\n" +
		"Flags:\n" + multidc.RouterUsage(),
	SkipFlagParsing: true,
	// No help subcommand: every argument is the command line's own.
	HideHelpCommand: true,
	Action:          routerRun,
}

func routerRun(c *cli.Context) error {
	// A router is one of its job's workers: its agent sends SIGHUP when its live
	// configuration changes, which tells a router nothing (it finds its peers in the store).
	signal.Ignore(syscall.SIGHUP)
	// The environment gives defaults that flags on the command line override (the flag
	// package keeps the last value).
	var env []string
	for _, fe := range [][2]string{{"store", "STORMDOCK_STORE"}, {"store-credentials-file", "STORMDOCK_STORE_CREDENTIALS_FILE"},
		{"tls-cert", multidc.EnvRouterCert}, {"tls-key", multidc.EnvRouterKey},
		{"store-ca", commands.EnvStoreCA}, {"store-cert", commands.EnvStoreCert}, {"store-key", commands.EnvStoreKey},
		{"sink-dir", multidc.EnvSinkDir}, {"tenant", "STORMDOCK_TENANT"}, {"dc", "STORMDOCK_DC"}, {"secrets-dir", multidc.EnvSecretsDir}} {
		if v, ok := os.LookupEnv(fe[1]); ok {
			env = append(env, "--"+fe[0]+"="+v)
		}
	}
	var a multidc.RouterArgs
	switch err := a.Parse(append(env, c.Args().Slice()...)); {
	case errors.Is(err, flag.ErrHelp):
		return cli.ShowCommandHelp(c, c.Command.Name)
	case errors.Is(err, multidc.ErrRouterArgs):
		return commands.UsageErr("%v", err)
	case err != nil:
		return cli.Exit(fmt.Sprintf("stormdock router: %v (see --help)", err), 1)
	}
	log := slog.Default()
	// Checked now, opened once this router leads: a standby holds no sink.
	u, err := multidc.CheckSink(a.Sink)
	if err != nil {
		return commands.UsageErr("--sink: %v", err)
	}
	if u.Scheme == "file" {
		// Checked here and again, without following symlinks, where the file is opened.
		if err := cluster.CheckSinkPath(a.SinkDir, a.Tenant, u.Path); err != nil {
			return commands.UsageErr("--sink: %v", err)
		}
	}
	cred, err := multidc.OutputCredential(a.SecretsDir, a.OutputSecret)
	if err != nil {
		return commands.UsageErr("--output-secret: %v", err)
	}
	if cred != nil || a.SinkPasswordFile != "" {
		// The master refuses such a spec at submit; a command line made by hand (or forged)
		// is refused here before the secret is read, so it never leaves the host in clear.
		if err := cluster.CheckOutputSecretTransport(a.Sink); err != nil {
			return commands.UsageErr("--sink: %v", err)
		}
	}
	if _, err := coord.ParseURL(a.Store); err != nil {
		return commands.UsageErr("--store: %v", err)
	}
	creds := os.Getenv(commands.EnvStoreCredentials)
	if a.StoreCredentialsFile != "" {
		var err error
		if creds, err = daemon.ReadStoreCredentials(a.StoreCredentialsFile); err != nil {
			return commands.UsageErr("--store-credentials-file: %v", err)
		}
	}
	var serverTLS *tls.Config
	switch {
	case (a.TLSCert == "") != (a.TLSKey == ""):
		return commands.UsageErr("--tls-cert and --tls-key go together")
	case a.TLSCert != "":
		if serverTLS, err = daemon.ServerTLS(a.TLSCert, a.TLSKey); err != nil {
			return commands.UsageErr("--tls-cert, --tls-key: %v", err)
		}
	}
	// A router started while the store is away waits for it rather than exit: a crash
	// would only be restarted after a growing backoff, and hold the output back past the
	// store's return.
	store, err := (await.Dep{Name: "the store", Log: log}).OpenStore(c.Context, a.Store, coord.Options{SessionTimeout: a.SessionTimeout,
		Credentials: creds, Logger: log, TLS: coord.TLSFiles{CA: a.StoreCA, Cert: a.StoreCert, Key: a.StoreKey}})
	if err != nil {
		if c.Context.Err() != nil {
			return nil // stopped while it waited
		}
		return cli.Exit(fmt.Sprintf("stormdock: open store: %v", err), 1)
	}
	defer store.Close()
	// Routers of a fencing sink ask each other whether they lead, over HTTPS trusting the
	// router CA, which the agent gives them as it gives link workers.
	var peers *http.Client
	if f := os.Getenv(multidc.EnvRouterCA); f != "" {
		if peers, err = multidc.NewPeerClient(f); err != nil {
			return cli.Exit(fmt.Sprintf("stormdock router: %v", err), 1)
		}
	}
	// A postgres or nats sink's password: the job's output secret, as the agent delivers it
	// (re-read at every connect, so a rotation reaches the next one), or a file given by hand.
	var password func() ([]byte, error)
	switch {
	case a.SinkPasswordFile != "":
		file := os.ExpandEnv(a.SinkPasswordFile)
		password = func() ([]byte, error) { return os.ReadFile(file) }
	case cred != nil:
		password = cred.Bytes
	}
	listen := os.ExpandEnv(a.Listen)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Every series is labelled with the job: for the scrape token or the admin token alone,
	// checked against their hashes in the store.
	metricsHandler := metricsauth.New(store, log).Wrap(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	r, err := multidc.New(multidc.Config{
		Job:   a.Job,
		Links: a.Links,
		DC:    a.DC,
		Store: store,
		OpenSink: func(ctx context.Context, ev *multidc.SinkEvidence) (multidc.Sink, error) {
			return multidc.OpenSink(ctx, a.Sink, multidc.SinkOptions{Job: a.Job, Router: listen, SinkDir: a.SinkDir, Tenant: a.Tenant,
				Evidence: ev, Password: password, Credential: cred, Logger: log})
		},
		TakeOver:   multidc.Fences(a.Sink),
		PeerClient: peers,
		// The master writes $STORMDOCK_ADDR:$STORMDOCK_PORT: the node's advertised address
		// and the port its agent gave the router.
		Listen:             listen,
		TLS:                serverTLS,
		TokenHash:          a.TokenHash,
		LinkTokenHashes:    a.LinkTokenHashes,
		MaxBody:            a.MaxBody,
		Metrics:            metricsHandler,
		HeartbeatTimeout:   a.HeartbeatTimeout,
		CloseGrace:         a.CloseGrace,
		CheckpointInterval: a.CheckpointInterval,
		Limits:             multidc.Limits{Window: a.BufferRecords, Bytes: a.BufferBytes},
		Registerer:         reg,
		Logger:             log,
	})
	if err != nil {
		return commands.UsageErr("%v", err)
	}
	if err := r.Run(c.Context); err != nil {
		return cli.Exit(fmt.Sprintf("stormdock router: %v", err), 1)
	}
	return nil
}
