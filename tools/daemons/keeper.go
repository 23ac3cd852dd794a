package daemons

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/await"
)

// KeeperCommand is the process that holds a node's liveness and its workers' leases while
// the agent restarts (see agents.Keeper). It is hidden: the agent starts it.
var KeeperCommand = &cli.Command{
	Name:            "keeper",
	Hidden:          true,
	Usage:           "hold a node's store session and its workers' leases across agent restarts",
	UsageText:       "stormdock keeper --store URL [--store-credentials-file F] [--store-ca F [--store-cert F --store-key F]] --node-id ID --state-dir DIR --session-timeout D [--restart-grace D] [--store-silence D] [--rejoin-grace D]",
	SkipFlagParsing: true,
	Action: func(c *cli.Context) error {
		args, err := agents.ParseKeeperArgs(c.Args().Slice())
		if err != nil {
			return cli.Exit("stormdock "+err.Error(), 2)
		}
		log := slog.New(slog.NewTextHandler(os.Stderr, nil))
		opts := coord.Options{SessionTimeout: args.SessionTimeout, Logger: log, TLS: args.TLS}
		if args.Credentials != "" {
			b, err := os.ReadFile(args.Credentials)
			if err != nil {
				return cli.Exit("stormdock keeper: store credentials: "+err.Error(), 2)
			}
			opts.Credentials = strings.TrimSpace(string(b))
		}
		// SIGTERM retires the node (its workers stop, then it leaves the store); SIGUSR1 says
		// the agent wrote a new node record.
		sigs := make(chan os.Signal, 4)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// A keeper started while the store is unreachable or without quorum waits for it
		// (its node's leases lapse meanwhile: it has no session to vouch for them); a SIGTERM
		// then ends the wait, and the keeper, at once.
		var store coord.Store
		opened := make(chan error, 1)
		go func() {
			var err error
			store, err = (await.Dep{Name: "the store", Log: log.With("node", args.Node, "component", "keeper")}).OpenStore(ctx, args.Store, opts)
			opened <- err
		}()
	waiting:
		for {
			select {
			case err := <-opened:
				if err != nil {
					return cli.Exit(fmt.Sprintf("stormdock keeper: open store: %v", err), 1)
				}
				break waiting
			case s := <-sigs:
				if s != syscall.SIGUSR1 {
					log.Info("stopped while waiting for the store", "node", args.Node, "signal", s.String())
					cancel()
					<-opened
					if store != nil {
						store.Close()
					}
					return nil
				}
			}
		}
		defer store.Close()
		k, err := agents.NewKeeper(agents.KeeperConfig{Node: args.Node, Host: args.Host, StateDir: args.StateDir, Store: args.Store, StoreTLS: args.TLS,
			SessionTimeout: args.SessionTimeout, RestartGrace: args.RestartGrace, StoreSilence: args.StoreSilence,
			RejoinGrace: args.RejoinGrace, Logger: log}, store)
		if err != nil {
			return cli.Exit("stormdock keeper: "+err.Error(), 2)
		}
		go func() {
			terms := 0
			for s := range sigs {
				if s == syscall.SIGUSR1 {
					k.Notify()
					continue
				}
				if terms++; terms > 1 {
					cancel() // asked twice: leave now, the leases lapse by themselves
					continue
				}
				k.Retire()
			}
		}()
		if err := k.Run(ctx); err != nil {
			return cli.Exit("stormdock keeper: "+err.Error(), 1)
		}
		return nil
	},
}
