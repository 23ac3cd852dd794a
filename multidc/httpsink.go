package multidc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/stormdock/stormdock/internal/ctxtime"
)

// HTTP sink request headers. Every request carries its offsets, so that a receiver can drop
// what it already has: after a router crash, the records delivered since the last
// checkpoint are posted again (at-least-once between delivery and checkpoint).
const (
	HeaderJob         = "X-Stormdock-Job"
	HeaderFirstOffset = "X-Stormdock-First-Offset"
	HeaderLastOffset  = "X-Stormdock-Last-Offset"
)

// HTTPSinkOptions tune an HTTPSink.
type HTTPSinkOptions struct {
	Job    string
	Client *http.Client // default: one with a 10 s timeout per attempt
	// MinBackoff and MaxBackoff bound the jittered exponential wait between attempts.
	// Defaults 50 ms and 5 s.
	MinBackoff, MaxBackoff time.Duration
	// Credential, when set, is sent with every request as "Authorization: Bearer VALUE",
	// read again for each one (a rotated secret is used from the next request on).
	Credential *Credential
	Logger     *slog.Logger
}

// HTTPSink posts each batch as JSON lines (the FileSink line format) to a URL and retries
// until a 2xx answer: network errors, 5xx, 429 and every other status are retried with
// jittered exponential backoff, since skipping a batch would lose output. While it retries,
// the router's buffers fill and senders get 429. Idempotency is by offset: each line has
// its "offset" and the request has X-Stormdock-First-Offset/-Last-Offset and an
// Idempotency-Key of job:first-last.
type HTTPSink struct {
	url  string
	opts HTTPSinkOptions
	log  *slog.Logger
	buf  []byte
}

// NewHTTPSink returns a sink posting to url.
func NewHTTPSink(url string, opts HTTPSinkOptions) *HTTPSink {
	if opts.Client == nil {
		opts.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 50 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(5*time.Second, opts.MinBackoff)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &HTTPSink{url: url, opts: opts, log: opts.Logger.With("sink", url)}
}

// Write posts recs until the receiver accepts them or ctx is done.
func (s *HTTPSink) Write(ctx context.Context, recs []Record) error {
	if len(recs) == 0 {
		return nil
	}
	b := s.buf[:0]
	for _, r := range recs {
		b = appendLine(b, r)
	}
	s.buf = b
	first, last := strconv.FormatInt(recs[0].Offset, 10), strconv.FormatInt(recs[len(recs)-1].Offset, 10)
	wait := s.opts.MinBackoff
	for attempt := 1; ; attempt++ {
		err := s.post(ctx, b, first, last)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("multidc: http sink: offsets %s-%s: %w (last error: %v)", first, last, ctx.Err(), err)
		}
		s.log.Warn("http sink: delivery failed, retrying", "first", first, "last", last, "attempt", attempt, "err", err)
		// Full jitter, so that routers of many jobs do not retry in step.
		d := time.Duration(rand.Int64N(int64(wait))) + wait/2
		if cerr := ctxtime.Sleep(ctx, d); cerr != nil {
			return fmt.Errorf("multidc: http sink: offsets %s-%s: %w (last error: %v)", first, last, cerr, err)
		}
		wait = min(2*wait, s.opts.MaxBackoff)
	}
}

func (s *HTTPSink) post(ctx context.Context, body []byte, first, last string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set(HeaderFirstOffset, first)
	req.Header.Set(HeaderLastOffset, last)
	if s.opts.Job != "" {
		req.Header.Set(HeaderJob, s.opts.Job)
	}
	req.Header.Set("Idempotency-Key", s.opts.Job+":"+first+"-"+last)
	if c := s.opts.Credential; c != nil {
		v, err := c.Bytes()
		if err != nil {
			return err
		}
		if len(v) == 0 || bytes.ContainsAny(v, "\r\n\x00") {
			clear(v)
			return fmt.Errorf("the output secret %s is empty or holds a line break: an HTTP sink sends it as one header", c.Name())
		}
		req.Header.Set("Authorization", "Bearer "+string(v))
		clear(v)
	}
	resp, err := s.opts.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // so the connection is reused
	if resp.StatusCode/100 == 2 {
		return nil
	}
	return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
}

// Sync does nothing: a 2xx answer is the receiver's promise.
func (s *HTTPSink) Sync(context.Context) error { return nil }

// Close releases idle connections.
func (s *HTTPSink) Close() error {
	s.opts.Client.CloseIdleConnections()
	return nil
}
