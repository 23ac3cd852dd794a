package wordcount

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// sink is where records go: JSON lines to a file or stdout, or POSTed to an HTTP endpoint.
type sink interface {
	Write(ctx context.Context, r Record) error
	// Flush makes what was written visible (written out or POSTed).
	Flush(ctx context.Context) error
	// Close flushes and releases the sink.
	Close(ctx context.Context) error
}

func openSink(cfg Config) (sink, error) {
	switch {
	case cfg.Output != "":
		f, err := os.OpenFile(cfg.Output, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("wordcount: output: %w", err)
		}
		return &lineSink{w: bufio.NewWriter(f), c: f}, nil
	case cfg.OutputURL != "":
		return &httpSink{url: cfg.OutputURL, client: &http.Client{Timeout: 5 * time.Second}, log: cfg.Logger}, nil
	default:
		return &lineSink{w: bufio.NewWriter(cfg.Stdout)}, nil
	}
}

// lineSink writes JSON lines through a buffer.
type lineSink struct {
	w *bufio.Writer
	c io.Closer // nil for stdout
}

func (s *lineSink) Write(_ context.Context, r Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if _, err := s.w.Write(b); err != nil {
		return fmt.Errorf("wordcount: write: %w", err)
	}
	return nil
}

func (s *lineSink) Flush(context.Context) error {
	if err := s.w.Flush(); err != nil {
		return fmt.Errorf("wordcount: write: %w", err)
	}
	return nil
}

func (s *lineSink) Close(ctx context.Context) error {
	err := s.Flush(ctx)
	if s.c != nil {
		if cerr := s.c.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("wordcount: close output: %w", cerr)
		}
	}
	return err
}

// httpSink POSTs batches of JSON lines (application/x-ndjson) and retries a failed batch with
// a growing pause until it is accepted, so records are delivered at least once and in order.
type httpSink struct {
	url    string
	client *http.Client
	log    interface {
		Warn(msg string, args ...any)
	}
	buf  bytes.Buffer
	n    int
	last time.Time
}

const (
	batchRecords  = 100
	batchInterval = 200 * time.Millisecond
)

func (s *httpSink) Write(ctx context.Context, r Record) error {
	if err := json.NewEncoder(&s.buf).Encode(r); err != nil {
		return err
	}
	s.n++
	if s.n >= batchRecords || time.Since(s.last) >= batchInterval {
		return s.Flush(ctx)
	}
	return nil
}

func (s *httpSink) Flush(ctx context.Context) error {
	if s.n == 0 {
		return nil
	}
	pause := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := s.post(ctx)
		if err == nil {
			s.buf.Reset()
			s.n = 0
			s.last = time.Now()
			return nil
		}
		s.log.Warn("wordcount: output POST failed, retrying", "url", s.url, "records", s.n, "attempt", attempt, "err", err)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%d records not delivered to %s: %w", s.n, s.url, err)
		case <-t.C:
		}
		pause = min(pause*2, 2*time.Second)
	}
}

func (s *httpSink) post(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(s.buf.Bytes()))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s", s.url, resp.Status)
	}
	return nil
}

func (s *httpSink) Close(ctx context.Context) error { return s.Flush(ctx) }
