package wordcount

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// sink is where records go: JSON lines to a file or stdout, or POSTed to an HTTP endpoint.
type sink interface {
	Write(ctx context.Context, r Record) error
	// Flush makes what was written visible (written out or POSTed).
	Flush(ctx context.Context) error
	// Close flushes and releases the sink.
	Close(ctx context.Context) error
}

// openSink opens the output cfg names. sends bounds an HTTP output's requests: it outlives
// the run's context by the drain (see Run).
func openSink(cfg Config, sends context.Context) (sink, error) {
	switch {
	case cfg.Output != "":
		f, err := os.OpenFile(cfg.Output, os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			return nil, fmt.Errorf("wordcount: output: %w", err)
		}
		return &fileSink{f: f}, nil
	case cfg.OutputURL != "":
		return &httpSink{url: cfg.OutputURL, client: &http.Client{Timeout: 5 * time.Second}, log: cfg.Logger, sends: sends}, nil
	default:
		return &lineSink{w: bufio.NewWriter(cfg.Stdout)}, nil
	}
}

// lineSink writes JSON lines to stdout through a buffer.
type lineSink struct {
	w *bufio.Writer
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

func (s *lineSink) Close(ctx context.Context) error { return s.Flush(ctx) }

// fileSink appends JSON lines to a file that other workers may append to too: records are
// kept whole in a buffer and written together, under an exclusive flock of the file, at the
// end of its complete lines (appendLines: a torn last line, left by a crash or a full disk,
// is cut off first and never joined by the next record).
type fileSink struct {
	f   *os.File
	buf bytes.Buffer
}

// fileBatch is how much a fileSink buffers before it writes.
const fileBatch = 64 << 10

func (s *fileSink) Write(ctx context.Context, r Record) error {
	if err := json.NewEncoder(&s.buf).Encode(r); err != nil {
		return err
	}
	if s.buf.Len() >= fileBatch {
		return s.Flush(ctx)
	}
	return nil
}

func (s *fileSink) Flush(context.Context) error {
	if s.buf.Len() == 0 {
		return nil
	}
	fd := int(s.f.Fd())
	for {
		err := unix.Flock(fd, unix.LOCK_EX)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wordcount: lock output: %w", err)
		}
	}
	err := appendLines(s.f, s.buf.Bytes())
	_ = unix.Flock(fd, unix.LOCK_UN)
	if err != nil {
		return err
	}
	s.buf.Reset()
	return nil
}

func (s *fileSink) Close(ctx context.Context) error {
	err := s.Flush(ctx)
	if cerr := s.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("wordcount: close output: %w", cerr)
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
	// sends is the context of the requests, not the run's: a POST in flight at a stop is
	// answered, within the drain (see post).
	sends context.Context
	buf   bytes.Buffer
	n     int
	last  time.Time
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
		// Flush retries until the batch is taken or ctx ends; a stop leaves the batch for
		// the drain (Close), which is no error of the run's.
		if err := s.Flush(ctx); err != nil && ctx.Err() == nil {
			return err
		}
	}
	return nil
}

func (s *httpSink) Flush(ctx context.Context) error {
	if s.n == 0 {
		return nil
	}
	pause := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := s.post()
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

// post sends the batch under s.sends, not ctx: a POST abandoned at a stop may have been taken
// by the server, and the drain would then send its records again. ctx ends the pauses
// between attempts.
func (s *httpSink) post() error {
	req, err := http.NewRequestWithContext(s.sends, http.MethodPost, s.url, bytes.NewReader(s.buf.Bytes()))
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
