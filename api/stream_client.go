package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// eventQuery is f as GET /v1/events's query.
func eventQuery(f EventFilter) url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"job": f.Job, "node": f.Node, "dc": f.DC} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if !f.Since.IsZero() {
		q.Set("since", f.Since.UTC().Format(time.RFC3339))
	}
	if f.After > 0 {
		q.Set("after", strconv.FormatInt(f.After, 10))
	}
	return q
}

// Events lists the events kept that f takes, oldest first; limit > 0 keeps the newest
// limit. f.Tenant is not sent: the token decides what a caller sees.
func (c *Client) Events(ctx context.Context, f EventFilter, limit int) ([]Event, error) {
	q := eventQuery(f)
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out []Event
	err := c.doJSON(ctx, http.MethodGet, "/v1/events?"+q.Encode(), nil, &out)
	return out, err
}

// stream opens a long answer: no overall timeout, only ctx.
func (c *Client) stream(ctx context.Context, path string, header http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := (&http.Client{Transport: c.http.Transport}).Do(req)
	if err != nil {
		return nil, c.connError(err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var eb ErrorBody
		if json.Unmarshal(data, &eb) != nil || eb.Error == "" {
			eb.Error = fmt.Sprintf("master answered %s to GET %s", resp.Status, path)
		}
		return nil, &Error{Status: resp.StatusCode, Code: eb.Code, Msg: eb.Error}
	}
	return resp, nil
}

// FollowEvents passes every event f takes to fn as the masters record them, the kept ones
// first, until ctx is done (it then returns nil) or fn fails. A dropped connection, or a
// master that answers 503, is retried, continuing after the last event passed; other
// errors end it.
func (c *Client) FollowEvents(ctx context.Context, f EventFilter, fn func(Event) error) error {
	backoff := 200 * time.Millisecond
	for {
		q := eventQuery(f)
		q.Set("follow", "true")
		resp, err := c.stream(ctx, "/v1/events?"+q.Encode(), nil)
		if err == nil {
			backoff = 200 * time.Millisecond
			err = readEvents(resp.Body, func(e Event) error {
				f.After, f.Since = e.ID, time.Time{}
				return fn(e)
			})
			resp.Body.Close()
			var fe fnError
			if errors.As(err, &fe) {
				return fe.err
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		var ae *Error
		if errors.As(err, &ae) && ae.Status != http.StatusServiceUnavailable {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

type fnError struct{ err error }

func (e fnError) Error() string { return e.err.Error() }

// readEvents reads a server-sent event stream until it ends.
func readEvents(r io.Reader, fn func(Event) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var data strings.Builder
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if data.Len() > 0 {
				var e Event
				if err := json.Unmarshal([]byte(data.String()), &e); err != nil {
					return fmt.Errorf("read event: %w", err)
				}
				data.Reset()
				if err := fn(e); err != nil {
					return fnError{err}
				}
			}
		case strings.HasPrefix(line, "data: "):
			data.WriteString(line[len("data: "):])
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return io.ErrUnexpectedEOF
}

// Logs writes a worker's log to w: GET /v1/jobs/{name}/logs, relayed by the master from the
// worker's agent. With r.Follow it returns when ctx is done (nil) or the stream breaks.
func (c *Client) Logs(ctx context.Context, job string, r LogRequest, w io.Writer) error {
	resp, err := c.stream(ctx, "/v1/jobs/"+url.PathEscape(job)+"/logs?"+r.Query().Encode(), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(flushWriter{w}, resp.Body)
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the log of %s: %w", job, err)
	}
	return nil
}

// flushWriter writes through to w, flushing it when it buffers (a bufio.Writer).
type flushWriter struct{ w io.Writer }

func (f flushWriter) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	if fl, ok := f.w.(interface{ Flush() error }); ok && err == nil {
		err = fl.Flush()
	}
	return n, err
}
