package wordcount

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/stormdock/stormdock/multidc"
)

// heartbeatEvery is how often a link worker tells the router it is alive; the router fails
// a link over after a few missed beats.
const heartbeatEvery = 100 * time.Millisecond

// runLink is the worker of one link of a mirrored job: it sends its records to the job's
// output router with the router's protocol (multidc.Sender): heartbeats while idle, a start
// at the router's first undelivered offset, and a rewind when the router restarted.
func runLink(ctx context.Context, cfg Config, prog *progress) error {
	s := multidc.NewSender(cfg.OutputURL, cfg.Link, cfg.Worker, cfg.Workers)
	s.Token = cfg.OutputToken
	hctx, stop := context.WithCancel(ctx)
	defer stop()
	if cfg.ConfigFile != "" {
		go s.FollowConfig(hctx, cfg.ConfigFile)
	}
	go s.Heartbeats(hctx, heartbeatEvery)

	from := int64(0)
	for {
		hb, err := s.Heartbeat(ctx)
		if err == nil {
			from = hb.NextOffset
			break
		}
		cfg.Logger.Warn("wordcount: router not answering yet", "url", cfg.OutputURL, "err", err)
		if !pause(ctx, time.Second) {
			return nil
		}
	}
	s.Rewind() // the start already is where the router wants it
	for {
		next, err := streamFrom(ctx, cfg, s, from, prog)
		if err != nil || ctx.Err() != nil {
			return err
		}
		from = next
	}
}

// streamFrom sends this worker's records from offset from on, until ctx is done (nil) or
// the router restarted (the offset to start again from).
func streamFrom(ctx context.Context, cfg Config, s *multidc.Sender, from int64, prog *progress) (int64, error) {
	if IsJetStream(cfg.Input) {
		return streamFromJetStream(ctx, cfg, s, from)
	}
	src, closeSrc, err := openInput(cfg)
	if err != nil {
		return 0, err
	}
	defer closeSrc()
	r := bufio.NewReader(src)
	var batch bytes.Buffer
	n := 0
	begin, emitted := time.Now(), 0
	flush := func() (int64, bool, error) {
		if n == 0 {
			return 0, false, nil
		}
		err := s.Send(ctx, batch.Bytes())
		batch.Reset()
		n = 0
		var re *multidc.RestartError
		switch {
		case errors.As(err, &re):
			return re.NextOffset, true, nil
		case err != nil && ctx.Err() == nil:
			return 0, false, fmt.Errorf("wordcount: send to router: %w", err)
		}
		return 0, false, nil
	}
	var offset int64
	var partial []byte
	follow := cfg.Input != ""
	for ctx.Err() == nil {
		chunk, rerr := r.ReadBytes('\n')
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return 0, fmt.Errorf("wordcount: read: %w", rerr)
		}
		line := append(partial, chunk...)
		complete := rerr == nil || (!follow && len(line) > 0)
		if !complete {
			partial = line
			// Idle at the end of the input: deliver what is batched, then wait for more
			// input or for the router to ask for a rewind.
			if next, again, err := flush(); err != nil || again {
				return next, err
			}
			if next, again := s.Rewind(); again {
				return next, nil
			}
			prog.at(offset, from, cfg.Worker, cfg.Workers, true)
			if !pause(ctx, cfg.Poll) {
				break
			}
			continue
		}
		partial = nil
		if offset >= from && Mine(offset, cfg.Worker, cfg.Workers) {
			if cfg.Rate > 0 {
				begin = paced(begin, emitted, cfg.Rate)
				due := begin.Add(time.Duration(float64(emitted) / cfg.Rate * float64(time.Second)))
				if d := time.Until(due); d > 0 {
					if next, again, err := flush(); err != nil || again {
						return next, err
					}
					if !pause(ctx, d) {
						break
					}
				}
			}
			rec := Record{Offset: offset, Worker: cfg.Worker, Workers: cfg.Workers, Job: cfg.Job, Link: cfg.Link,
				Counts: Count(strings.TrimRight(string(line), "\r\n"))}
			if err := json.NewEncoder(&batch).Encode(rec); err != nil {
				return 0, err
			}
			n++
			emitted++
			prog.done()
			if n >= batchRecords {
				if next, again, err := flush(); err != nil || again {
					return next, err
				}
			}
		}
		offset++
		prog.at(offset, from, cfg.Worker, cfg.Workers, false)
	}
	// Draining on SIGTERM: what is batched still goes out.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.Drain)
	defer cancel()
	if n > 0 {
		_ = s.Send(dctx, batch.Bytes())
	}
	return 0, nil
}

// openInput opens the line source again from its start.
func openInput(cfg Config) (io.Reader, func(), error) {
	if cfg.Input == "" {
		return bytes.NewReader(sample), func() {}, nil
	}
	f, err := os.Open(cfg.Input)
	if err != nil {
		return nil, nil, fmt.Errorf("wordcount: %w", err)
	}
	return f, func() { f.Close() }, nil
}

func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
