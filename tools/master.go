package tools

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/daemon"
	"github.com/stormdock/stormdock/scheduler"
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
	if _, err := coord.ParseURL(c.String("store")); err != nil {
		return nil, usageErr("--store: %v", err)
	}
	opts := storeOptions(c)
	opts.Logger = log
	s, err := coord.Open(c.Context, c.String("store"), opts)
	if err != nil {
		return nil, cli.Exit(fmt.Sprintf("stormdock: open store: %v", err), 1)
	}
	return s, nil
}

// storeOptions are the store flags' options.
func storeOptions(c *cli.Context) coord.Options {
	return coord.Options{SessionTimeout: c.Duration("session-timeout"), Credentials: c.String("store-credentials")}
}

// MasterCommand runs a master.
var MasterCommand = &cli.Command{
	Name:  "master",
	Usage: "run a master: leader election, placement, failure handling and the HTTP API",
	Flags: append(storeFlags(),
		&cli.StringFlag{Name: "api", Usage: "`ADDR` the HTTP API and /metrics listen on", Value: "127.0.0.1:7070"},
		&cli.StringFlag{Name: "advertise-api", Usage: "`URL` clients on other hosts reach the API at, published in the store (default: from --api; when that is every interface, the address that reaches the store)"},
		&cli.StringFlag{Name: "id", Usage: "master `ID` in the election (default host:api)"},
		&cli.StringFlag{Name: "data", Usage: "`DIR` for the admin token (admin.token, mode 0600)", Value: defaultDataDir(), EnvVars: []string{"STORMDOCK_DATA"}},
		&cli.DurationFlag{Name: "reregister-grace", Usage: "after this master starts leading or its store comes back, how long nodes missing from the store are waited for before their workers move", Value: scheduler.DefaultReregisterGrace},
		&cli.StringFlag{Name: "registry-auth", Usage: "registry credentials `FILE` (Docker's config.json format) to pin docker jobs' image tags to digests with"},
	),
	Action: func(c *cli.Context) error {
		if c.NArg() != 0 {
			return usageErr("master takes no arguments, got %q", c.Args().First())
		}
		if _, err := coord.ParseURL(c.String("store")); err != nil {
			return usageErr("--store: %v", err)
		}
		log := slog.Default()
		m, err := daemon.NewMaster(c.Context, daemon.MasterConfig{
			Store:           c.String("store"),
			StoreOptions:    storeOptions(c),
			Listen:          c.String("api"),
			Advertise:       c.String("advertise-api"),
			ID:              c.String("id"),
			DataDir:         c.String("data"),
			ReregisterGrace: c.Duration("reregister-grace"),
			RegistryAuth:    c.String("registry-auth"),
			Logger:          log,
		})
		if err != nil {
			return cli.Exit("stormdock master: "+err.Error(), 1)
		}
		defer m.Close()
		if m.TokenPath() != "" {
			log.Info("admin token", "path", m.TokenPath())
		} else {
			log.Info("admin token was made by another master; this data directory has none", "data", c.String("data"))
		}
		return m.Run(c.Context)
	},
}
