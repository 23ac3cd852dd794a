// Package worker is `stormdock worker`: the example streaming workers (package
// examples/wordcount) that jobs run as [stormdock, worker, NAME].
package worker

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/examples/wordcount"
)

// Command runs the example workers. Jobs name them as [stormdock, worker, NAME]: the
// agent runs a command named stormdock with its own binary.
var Command = &cli.Command{
	Name:  "worker",
	Usage: "run an example streaming worker (as a job's command)",
	Subcommands: []*cli.Command{
		wordcountCommand,
	},
}

var wordcountCommand = &cli.Command{
	Name:      "wordcount",
	Usage:     "count the words of this worker's share of a line source, one JSON record per line",
	UsageText: "stormdock worker wordcount [--input FILE] [--rate N] [--output FILE]",
	Description: "Takes the lines whose 0-based offset % STORMDOCK_WORKERS == STORMDOCK_WORKER, and writes\n" +
		"(with --output under stormdock: re-partitions exactly once when the worker count changes, through FILE.ledger)\n" +
		"{\"offset\":N,\"worker\":i,\"link\":...,\"counts\":{...}} per line to --output, to STORMDOCK_OUTPUT when it\n" +
		"is an http:// URL (POSTed JSON lines), else to stdout. It follows --input for appended lines\n" +
		"until SIGTERM, then flushes and exits 0. Without --input it reads an embedded sample text.\n" +
		"Given STORMDOCK_METRICS_PORT it serves lines_processed_total and input_backlog there (on STORMDOCK_ADDR).",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "input", Usage: "line source `FILE` (default: the embedded sample), or for a mirrored job's links a JetStream stream nats://HOST:PORT/STREAM (stream sequence N is offset N-1)"},
		&cli.StringFlag{Name: "output", Usage: "append records to `FILE`"},
		&cli.Float64Flag{Name: "rate", Usage: "records per second at most (0: unpaced)"},
	},
	Action: func(c *cli.Context) error {
		if c.NArg() > 0 {
			return cli.Exit(fmt.Sprintf("stormdock worker wordcount: unexpected argument %q (flags go first)", c.Args().First()), 2)
		}
		cfg, err := wordcount.ConfigFromEnv(os.Getenv)
		if err != nil {
			return cli.Exit("stormdock worker wordcount: "+err.Error(), 2)
		}
		if c.Float64("rate") < 0 {
			return cli.Exit("stormdock worker wordcount: --rate must not be negative", 2)
		}
		cfg.Input, cfg.Output, cfg.Rate = c.String("input"), c.String("output"), c.Float64("rate")
		cfg.Stdout = c.App.Writer
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("job", cfg.Job, "worker", cfg.Worker)
		// SIGHUP: the agent rewrote the live configuration (STORMDOCK_CONFIG).
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer func() {
			signal.Stop(hup)
			close(hup) // ends the forwarder
		}()
		reload := make(chan struct{}, 1)
		go func() {
			for range hup {
				select {
				case reload <- struct{}{}:
				default:
				}
			}
		}()
		cfg.Reload = reload
		if port := os.Getenv("STORMDOCK_METRICS_PORT"); port != "" {
			// Its own registry: the agent measures cpu and memory itself, and would drop
			// the Go runtime's series anyway.
			reg := prometheus.NewRegistry()
			if cfg.Metrics, err = wordcount.NewMetrics(reg); err != nil {
				return cli.Exit("stormdock worker wordcount: "+err.Error(), 1)
			}
			if err := wordcount.ServeMetrics(c.Context, net.JoinHostPort(os.Getenv("STORMDOCK_ADDR"), port), reg); err != nil {
				// Serving no metrics is allowed: the job runs, its series are missing.
				cfg.Logger.Warn("serving no metrics", "err", err)
			}
		}
		// The CLI cancels c.Context on SIGTERM: Run then drains and returns nil (exit 0).
		return wordcount.Run(c.Context, cfg)
	},
}
