package tools

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stormdock/stormdock/multidc"
	"github.com/urfave/cli/v2"
)

// RouterCommand runs the output router of a mirrored job.
var RouterCommand = &cli.Command{
	Name:  "router",
	Usage: "run the output router of a mirrored job: one link's output to the sink, exactly once, with failover",
	UsageText: "stormdock router --store URL --job JOB --links dc-a,dc-b --sink file:///PATH|http://HOST/PATH " +
		"--listen 127.0.0.1:PORT [--heartbeat-timeout D]",
	Description: "Workers post their records to http://LISTEN/v1/records and heartbeat at /v1/heartbeat\n" +
		"(protocol: go doc github.com/stormdock/stormdock/multidc). Status: GET /v1/status, metrics: /metrics.",
	Flags: append(storeFlags(),
		&cli.StringFlag{Name: "job", Usage: "the mirrored `JOB`", Required: true},
		&cli.StringFlag{Name: "links", Usage: "the job's `LINKS`, comma-separated, in order of preference", Required: true},
		&cli.StringFlag{Name: "sink", Usage: "output `URL`: file:///PATH[?fsync=checkpoint|always|never] or http(s)://HOST/PATH", Required: true},
		&cli.StringFlag{Name: "listen", Usage: "`ADDR` of the ingest and status API", Value: "127.0.0.1:7090"},
		&cli.DurationFlag{Name: "heartbeat-timeout", Usage: "a link whose workers are silent this long fails over", Value: 600 * time.Millisecond},
		&cli.DurationFlag{Name: "close-grace", Usage: "a worker whose connection closed and that is silent this long counts as dead (default heartbeat-timeout/2, negative: off)"},
		&cli.DurationFlag{Name: "checkpoint-interval", Usage: "how often the delivered offset is synced and saved", Value: 100 * time.Millisecond},
		&cli.Int64Flag{Name: "buffer-records", Usage: "per link: how far ahead of the delivered offset records are held", Value: 8192},
		&cli.Int64Flag{Name: "buffer-bytes", Usage: "per link: bytes of records held", Value: 32 << 20},
	),
	Action: routerRun,
}

func routerRun(c *cli.Context) error {
	if err := wantArgs(c, 0, "no arguments"); err != nil {
		return err
	}
	var links []string
	for _, l := range strings.Split(c.String("links"), ",") {
		if l = strings.TrimSpace(l); l != "" {
			links = append(links, l)
		}
	}
	log := slog.Default()
	sink, err := multidc.OpenSink(c.String("sink"), multidc.SinkOptions{Job: c.String("job"), Logger: log})
	if err != nil {
		return usageErr("--sink: %v", err)
	}
	store, err := openStore(c, log)
	if err != nil {
		sink.Close()
		return err
	}
	defer store.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	r, err := multidc.New(multidc.Config{
		Job:                c.String("job"),
		Links:              links,
		Store:              store,
		Sink:               sink,
		Listen:             c.String("listen"),
		Metrics:            promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		HeartbeatTimeout:   c.Duration("heartbeat-timeout"),
		CloseGrace:         c.Duration("close-grace"),
		CheckpointInterval: c.Duration("checkpoint-interval"),
		Limits:             multidc.Limits{Window: c.Int64("buffer-records"), Bytes: c.Int64("buffer-bytes")},
		Registerer:         reg,
		Logger:             log,
	})
	if err != nil {
		sink.Close()
		return usageErr("%v", err)
	}
	if err := r.Run(c.Context); err != nil {
		return cli.Exit(fmt.Sprintf("stormdock router: %v", err), 1)
	}
	return nil
}
