package tools

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/scheduler"
	"github.com/urfave/cli/v2"
)

// storeFlags are the flags of every process that opens the coordination store.
func storeFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "store", Usage: "coordination store `URL`: zk://HOST:PORT[,HOST:PORT]/CHROOT, file:///PATH or mem://NAME",
			EnvVars: []string{"STORMDOCK_STORE"}, Required: true},
		&cli.DurationFlag{Name: "session-timeout", Usage: "store session timeout: how fast a lost process is noticed", Value: 2 * time.Second},
		&cli.StringFlag{Name: "store-credentials", Usage: "`USER:PASS` for ZooKeeper digest ACLs", EnvVars: []string{"STORMDOCK_STORE_CREDENTIALS"}},
	}
}

// openStore opens the store named by the flags, failing within the connect timeout.
func openStore(c *cli.Context, log *slog.Logger) (coord.Store, error) {
	opts := coord.Options{SessionTimeout: c.Duration("session-timeout"), Credentials: c.String("store-credentials"), Logger: log}
	if _, err := coord.ParseURL(c.String("store")); err != nil {
		return nil, usageErr("--store: %v", err)
	}
	s, err := coord.Open(c.Context, c.String("store"), opts)
	if err != nil {
		return nil, cli.Exit(fmt.Sprintf("stormdock: open store: %v", err), 1)
	}
	return s, nil
}

// MasterCommand runs a master.
var MasterCommand = &cli.Command{
	Name:  "master",
	Usage: "run a master: leader election, placement, failure handling and the HTTP API",
	Flags: append(storeFlags(),
		&cli.StringFlag{Name: "api", Usage: "`ADDR` the HTTP API and /metrics listen on", Value: "127.0.0.1:7070"},
		&cli.StringFlag{Name: "id", Usage: "master `ID` in the election (default host:api)"},
		&cli.StringFlag{Name: "data", Usage: "`DIR` for the admin token (admin.token, mode 0600)", Value: defaultDataDir(), EnvVars: []string{"STORMDOCK_DATA"}},
	),
	Action: func(c *cli.Context) error {
		if c.NArg() != 0 {
			return usageErr("master takes no arguments, got %q", c.Args().First())
		}
		log := slog.Default()
		ln, err := net.Listen("tcp", c.String("api"))
		if err != nil {
			return usageErr("--api %s: %v", c.String("api"), err)
		}
		defer ln.Close()
		id := c.String("id")
		if id == "" {
			host, _ := os.Hostname()
			id = host + "@" + ln.Addr().String()
		}
		store, err := openStore(c, log)
		if err != nil {
			return err
		}
		defer store.Close()
		path, err := scheduler.EnsureAdminToken(c.Context, store, c.String("data"))
		if err != nil {
			return cli.Exit("stormdock: "+err.Error(), 1)
		}
		if path != "" {
			log.Info("admin token", "path", path)
		} else {
			log.Info("admin token was made by another master; this data directory has none", "data", c.String("data"))
		}
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		m, err := scheduler.New(store, scheduler.Config{ID: id, API: "http://" + ln.Addr().String(), RouterStore: c.String("store"), Logger: log, Registry: reg})
		if err != nil {
			return err
		}
		return serveMaster(c.Context, m, ln, reg, log)
	},
}

// serveMaster runs m and its API on ln until ctx is done.
func serveMaster(ctx context.Context, m *scheduler.Master, ln net.Listener, reg *prometheus.Registry, log *slog.Logger) error {
	srv := &http.Server{Handler: m.Handler(reg), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("master API listening", "url", "http://"+ln.Addr().String(), "metrics", "http://"+ln.Addr().String()+"/metrics")
	runErr := m.Run(ctx)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return runErr
}
