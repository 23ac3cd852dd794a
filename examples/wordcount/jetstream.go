package wordcount

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/stormdock/stormdock/multidc"
)

// A link worker's input may be a JetStream stream instead of a file (--input
// nats://HOST:PORT[,HOST:PORT]/STREAM): the message of stream sequence N is the line of
// offset N-1, so every link reads the same lines at the same offsets, and a worker that
// starts or rewinds at offset K asks the server for sequence K+1 on. The stream holds the
// input alone; a sequence missing from it (a message deleted or expired) yields a record
// {"offset":K,"gap":true} for its offset, so that the router, which delivers offsets in
// order, does not wait for it.

// IsJetStream reports whether an --input names a JetStream stream.
func IsJetStream(input string) bool { return strings.HasPrefix(input, "nats://") }

// jsInput is a parsed JetStream input.
type jsInput struct {
	servers []string // nats://HOST:PORT each
	stream  string
}

func parseJetStreamInput(raw string) (jsInput, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "nats" || u.Host == "" {
		return jsInput{}, fmt.Errorf("--input %q: want nats://HOST:PORT/STREAM", raw)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return jsInput{}, fmt.Errorf("--input %q: want nats://HOST:PORT/STREAM, no user, query or fragment", u.Redacted())
	}
	in := jsInput{stream: strings.TrimPrefix(u.Path, "/")}
	if in.stream == "" || strings.ContainsAny(in.stream, "/.*> \t") {
		return jsInput{}, fmt.Errorf("--input %q: name the stream as the URL's path", raw)
	}
	for _, hp := range strings.Split(u.Host, ",") {
		if _, _, err := net.SplitHostPort(hp); err != nil {
			hp = net.JoinHostPort(hp, "4222")
		}
		in.servers = append(in.servers, "nats://"+hp)
	}
	return in, nil
}

// gapRecord is what a worker emits for an offset whose message is not in the stream.
type gapRecord struct {
	Offset  int64  `json:"offset"`
	Gap     bool   `json:"gap"`
	Worker  int    `json:"worker"`
	Workers int    `json:"workers"`
	Job     string `json:"job,omitempty"`
	Link    string `json:"link"`
}

// streamFromJetStream sends this worker's records from offset from on, reading the stream,
// until ctx is done (nil) or the router restarted (the offset to start again from). A lost
// server is read again from where the worker was once it answers.
func streamFromJetStream(ctx context.Context, cfg Config, s *multidc.Sender, from int64) (int64, error) {
	in, err := parseJetStreamInput(cfg.Input)
	if err != nil {
		return 0, err
	}
	nc, err := nats.Connect(strings.Join(in.servers, ","), nats.Name("stormdock worker "+cfg.Job), nats.Timeout(5*time.Second),
		nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond))
	if err != nil {
		cfg.Logger.Warn("wordcount: cannot reach the input's server; trying again", "input", cfg.Input, "err", err)
		pause(ctx, time.Second)
		return from, nil
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	cons, err := js.OrderedConsumer(ctx, in.stream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: uint64(from + 1)})
	if err != nil {
		cfg.Logger.Warn("wordcount: cannot read the input stream; trying again", "input", cfg.Input, "err", err)
		pause(ctx, time.Second)
		return from, nil
	}
	it, err := cons.Messages()
	if err != nil {
		pause(ctx, time.Second)
		return from, nil
	}
	defer it.Stop()

	var batch bytes.Buffer
	n := 0
	begin, emitted := time.Now(), 0
	var batchStart time.Time // when the batch's first record was made
	next := from             // the next offset to read
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
	emit := func(v any) error {
		if err := json.NewEncoder(&batch).Encode(v); err != nil {
			return err
		}
		if n == 0 {
			batchStart = time.Now()
		}
		n++
		emitted++
		return nil
	}
	for ctx.Err() == nil {
		m, err := it.Next(jetstream.NextMaxWait(cfg.Poll))
		if errors.Is(err, nats.ErrTimeout) {
			// Idle: deliver what is batched, and watch for a router restart.
			if r, again, err := flush(); err != nil || again {
				return r, err
			}
			if r, again := s.Rewind(); again {
				return r, nil
			}
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			cfg.Logger.Warn("wordcount: reading the input stream failed; reading again from where it was", "input", cfg.Input, "offset", next, "err", err)
			if r, again, ferr := flush(); ferr != nil || again {
				return r, ferr // a rewind: start again at the router's offset
			}
			pause(ctx, 200*time.Millisecond)
			return next, nil
		}
		md, err := m.Metadata()
		if err != nil {
			return 0, fmt.Errorf("wordcount: input message: %w", err)
		}
		off := int64(md.Sequence.Stream) - 1
		for gap := next; gap < off; gap++ {
			if Mine(gap, cfg.Worker, cfg.Workers) {
				if err := emit(gapRecord{Offset: gap, Gap: true, Worker: cfg.Worker, Workers: cfg.Workers, Job: cfg.Job, Link: cfg.Link}); err != nil {
					return 0, err
				}
			}
		}
		next = off + 1
		if !Mine(off, cfg.Worker, cfg.Workers) {
			continue
		}
		if cfg.Rate > 0 {
			due := begin.Add(time.Duration(float64(emitted) / cfg.Rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				if r, again, err := flush(); err != nil || again {
					return r, err
				}
				if !pause(ctx, d) {
					break
				}
			}
		}
		if err := emit(Record{Offset: off, Worker: cfg.Worker, Workers: cfg.Workers, Job: cfg.Job, Link: cfg.Link,
			Counts: Count(strings.TrimRight(string(m.Data()), "\r\n"))}); err != nil {
			return 0, err
		}
		// A stream that never pauses never times out: a batch also goes when it is old, so
		// that the router (and the standby link) hears of records within batchInterval.
		if n >= batchRecords || n > 0 && time.Since(batchStart) >= batchInterval {
			if r, again, err := flush(); err != nil || again {
				return r, err
			}
		}
	}
	// Draining on SIGTERM: what is batched still goes out.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.Drain)
	defer cancel()
	if n > 0 {
		_ = s.Send(dctx, batch.Bytes())
	}
	return 0, nil
}
