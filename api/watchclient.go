package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// ReadEvents reads server-sent events from r and calls fn with each event's type and data
// until r ends, or fn returns an error, which ReadEvents returns. Comments and retry fields
// are skipped.
func ReadEvents(r io.Reader, fn func(event string, data []byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 256<<20)
	event, data := "", []byte(nil)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) == 0:
			if data != nil {
				if event == "" {
					event = "message"
				}
				if err := fn(event, data); err != nil {
					return err
				}
			}
			event, data = "", nil
		case bytes.HasPrefix(line, []byte("event:")):
			event = string(bytes.TrimSpace(line[len("event:"):]))
		case bytes.HasPrefix(line, []byte("data:")):
			d := bytes.TrimPrefix(line[len("data:"):], []byte(" "))
			if data != nil {
				data = append(data, '\n')
			}
			data = append(data, d...)
		}
	}
	return sc.Err()
}

// Watch streams the cluster map (GET /v1/watch): fn gets the map after the snapshot and
// after every delta, until ctx is done, the stream ends or fn returns an error.
func (c *Client) Watch(ctx context.Context, fn func(m *ClusterMap) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/watch", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/event-stream")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	// A stream has no overall timeout: it ends with ctx.
	resp, err := (&http.Client{Transport: c.http.Transport}).Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("cannot reach the master at %s: %v", c.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return ParseError(resp.StatusCode, data, fmt.Sprintf("master answered %s to GET /v1/watch", resp.Status))
	}
	var m *ClusterMap
	err = ReadEvents(resp.Body, func(event string, data []byte) error {
		switch event {
		case EventSnapshot:
			m = &ClusterMap{}
			if err := json.Unmarshal(data, m); err != nil {
				return fmt.Errorf("read watch snapshot: %w", err)
			}
		case EventDelta:
			if m == nil {
				return errors.New("watch: a delta before the snapshot")
			}
			var d ClusterDelta
			if err := json.Unmarshal(data, &d); err != nil {
				return fmt.Errorf("read watch delta: %w", err)
			}
			m.Apply(d)
		case EventEnd:
			var eb ErrorBody
			_ = json.Unmarshal(data, &eb)
			return &Error{Status: http.StatusUnauthorized, Code: eb.Code, Msg: eb.Error}
		default:
			return nil
		}
		return fn(m)
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return err
	}
	return errors.New("watch: the master ended the stream")
}

// Links returns a mirrored job's links as its router reports them.
func (c *Client) Links(ctx context.Context, job string) (Links, error) {
	var out Links
	err := c.doJSON(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(job)+"/links", nil, &out)
	return out, err
}

// Failover asks a mirrored job's router to make link to active ("" for the most advanced
// live standby).
func (c *Client) Failover(ctx context.Context, job, to string) (Links, error) {
	var out Links
	err := c.doJSON(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(job)+"/failover", FailoverRequest{To: to}, &out)
	return out, err
}
