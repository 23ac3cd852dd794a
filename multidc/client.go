package multidc

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/ctxtime"
)

// APIError is a router's answer other than 2xx: Code is its HTTP status. It wraps the
// *api.Error of its body, so that errors.Is matches the api package's sentinels
// (api.ErrNotReady, api.ErrBadInput, ...) and api.ExitCode works on it as on a master's.
type APIError struct {
	Code int
	Msg  string
	err  *api.Error
}

func (e *APIError) Unwrap() error { return e.err }

func (e *APIError) Error() string {
	return fmt.Sprintf("router: %d %s: %s", e.Code, http.StatusText(e.Code), e.Msg)
}

// Retryable reports whether the request may succeed when sent again: backpressure, a router
// that is starting, or a server error.
func (e *APIError) Retryable() bool {
	return e.Code == http.StatusTooManyRequests || e.Code >= 500
}

// Client calls a router's API: what the CLI uses.
type Client struct {
	base string
	hc   *http.Client
	// Token is the job's sender token, needed for a failover.
	Token string
}

// NewClient returns a client of the router at base (https://HOST:PORT, or http:// for a router without TLS).
func NewClient(base string) (*Client, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("multidc: router URL %q: want https://HOST:PORT", base)
	}
	return &Client{base: strings.TrimSuffix(base, "/"), hc: &http.Client{Timeout: 10 * time.Second}}, nil
}

// TrustRouterCA makes the client trust pool (the router CA's, RouterCA.Pool) for an https
// router.
func (c *Client) TrustRouterCA(pool *x509.CertPool) {
	c.hc = httpClient(10*time.Second, pool)
}

// RouterURL reads where a job's router serves its API, from its record in the store.
func RouterURL(ctx context.Context, kv coord.KV, job string) (string, error) {
	rec, ok, err := ReadRecord(ctx, kv, job)
	if err != nil {
		return "", err
	}
	if !ok || rec.Router == "" {
		return "", fmt.Errorf("multidc: no router record for job %q at %s/%s: is the job mirrored and its router running?", job, cluster.RoutersKey, job)
	}
	return rec.Router, nil
}

// Status returns the router's live status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	err := c.do(ctx, http.MethodGet, "/v1/status", nil, &st)
	return st, err
}

// Failover asks the router of job to make link to active ("" for the most advanced live
// standby).
func (c *Client) Failover(ctx context.Context, job, to string) (Status, error) {
	q := url.Values{}
	if job != "" {
		q.Set("job", job)
	}
	if to != "" {
		q.Set("to", to)
	}
	var st Status
	err := c.do(ctx, http.MethodPost, "/v1/failover?"+q.Encode(), nil, &st)
	return st, err
}

func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("multidc: %w", err)
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("multidc: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("multidc: read answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		return apiError(resp.StatusCode, b)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("multidc: decode answer of %s %s: %w", method, path, err)
	}
	return nil
}

func apiError(status int, body []byte) *APIError {
	e := api.ParseError(status, body, strings.TrimSpace(string(body)))
	return &APIError{Code: status, Msg: e.Msg, err: e}
}

// RestartError says that the router restarted since the sender's previous request: the
// records it held but had not delivered are gone, so the worker must rewind its input to
// NextOffset and send everything again from there.
type RestartError struct {
	NextOffset int64
}

func (e *RestartError) Error() string {
	return fmt.Sprintf("multidc: the router restarted: rewind the input to offset %d", e.NextOffset)
}

// Sender is the worker side of the ingest protocol: it posts batches of records of one
// link's worker, retrying on backpressure and unavailability, sends heartbeats, and tells
// the worker when the router restarted (RestartError, Rewind). A job has more than one
// router (one leads, the others stand by in other data centers): the sender heartbeats to
// every one of them (Heartbeats), sends records to the one that leads (the one that answers
// them: a standby answers 503), and moves to another as soon as that one answers as the
// leader, cancelling a request still waiting on the old one. So a standby that takes over
// is used within a heartbeat, not after a request timed out on a leader that is cut off.
// Safe for concurrent use.
type Sender struct {
	link            string
	worker, workers int
	hc              *http.Client
	// Token is the job's sender token (ReadTokenFile), sent with every request.
	Token string
	// MinBackoff and MaxBackoff bound the wait between retries (defaults 10 ms, 100 ms: a
	// standby that takes over is used within a tenth of a second).
	MinBackoff, MaxBackoff time.Duration

	mu    sync.Mutex
	bases []string // the routers' URLs
	cur   int      // the one requests go to
	// unreachable holds until when a router that did not answer is passed over, so that a
	// standby answering "not leading" is asked again before a lost router's host costs
	// another request timeout.
	unreachable map[string]time.Time
	instance    string // the router instance that answered last
	rewind      int64  // -1, or where to rewind after a router restart not yet reported
	caErr       error  // the router CA named by EnvRouterCA is not readable
	// moved is closed when requests move to another router: a records request still
	// waiting on the old one gives up at once.
	moved chan struct{}
}

// sendTimeout bounds one records request of a sender, heartbeatTimeout one heartbeat. A
// router answers at once (it never holds a request: a full buffer is a 429), so a request
// without an answer within them went to a router whose host is lost or cut off: a partition
// drops packets, and only a timeout ends the request. The next request goes to the next
// router. They are not what makes a sender move to a router that took over: its heartbeat
// answer does (see Sender). Short timeouts would cut slow answers of a loaded router, and a
// cut connection counts against the worker's liveness there (Config.CloseGrace).
const (
	sendTimeout      = 2 * time.Second
	heartbeatTimeout = 2 * time.Second
)

// NewSender returns a sender for worker (of workers) of link, to the routers at bases (a
// comma-separated list of https://HOST:PORT). It trusts the router CA in the file its agent
// names in EnvRouterCA, and no other, for https routers; every request fails when that file
// is not readable.
func NewSender(bases, link string, worker, workers int) *Sender {
	var pool *x509.CertPool
	var caErr error
	if f := os.Getenv(EnvRouterCA); f != "" {
		pool, caErr = RouterPool(f)
	}
	s := &Sender{
		link: link, worker: worker, workers: workers,
		hc:         httpClient(0, pool), // each request has its own timeout
		caErr:      caErr,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		rewind: -1, moved: make(chan struct{}),
	}
	s.SetRouters(strings.Split(bases, ","))
	return s
}

// SetRouters replaces the routers' URLs (a worker's live configuration changed: a router
// moved). The sender keeps to the router it used if it is still listed.
func (s *Sender) SetRouters(urls []string) {
	var bases []string
	for _, u := range urls {
		if u = strings.TrimSuffix(strings.TrimSpace(u), "/"); u != "" {
			bases = append(bases, u)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := ""
	if s.cur < len(s.bases) {
		old = s.bases[s.cur]
	}
	s.bases, s.cur = bases, 0
	for i, b := range bases {
		if b == old {
			s.cur = i
		}
	}
	if s.curLocked() != old {
		s.movedLocked()
	}
}

func (s *Sender) curLocked() string {
	if len(s.bases) == 0 {
		return ""
	}
	return s.bases[s.cur%len(s.bases)]
}

// movedLocked tells requests waiting on the router left that they are to give up.
func (s *Sender) movedLocked() {
	close(s.moved)
	s.moved = make(chan struct{})
}

// lead moves requests to base, which answered a heartbeat as the router that leads.
func (s *Sender) lead(base string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.unreachable, base)
	for i, b := range s.bases {
		if b == base && i != s.cur%len(s.bases) {
			s.cur = i
			s.movedLocked()
			return
		}
	}
}

// base is the router requests go to now, "" while none is known, and the channel closed
// when they move elsewhere.
func (s *Sender) base() (string, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.curLocked(), s.moved
}

// unreachableFor is how long a router that did not answer is passed over while another
// router answers: about the time a standby takes to lead once the leader is gone (it takes a
// fencing sink over on evidence within a second; else when the leader's session expired).
// A router passed over by mistake (slow, not gone) is tried again after it.
const unreachableFor = 2 * time.Second

// next moves to the next router after base failed or stood by (answered is false when base
// did not answer at all). Routers that did not answer lately are passed over while one
// that did is left.
func (s *Sender) next(base string, answered bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if !answered {
		if s.unreachable == nil {
			s.unreachable = map[string]time.Time{}
		}
		s.unreachable[base] = now.Add(unreachableFor)
	}
	n := len(s.bases)
	if n == 0 || s.bases[s.cur%n] != base {
		return
	}
	for i := 1; i <= n; i++ {
		c := (s.cur + i) % n
		if until, ok := s.unreachable[s.bases[c]]; !ok || now.After(until) {
			if c != s.cur%n {
				s.cur = c
				s.movedLocked()
			}
			return
		}
	}
	s.cur = (s.cur + 1) % n // none answered lately: go round
	s.movedLocked()
}

// errNoRouter: the worker's configuration names no router yet (the job's routers are
// starting).
var errNoRouter = errors.New("multidc: no router known yet")

func (s *Sender) authorize(req *http.Request) {
	if s.Token != "" {
		req.Header.Set("Authorization", "Bearer "+s.Token)
	}
}

// answered records which router instance answered, noting a restart.
func (s *Sender) answered(instance string, next int64) {
	if instance == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.instance != "" && s.instance != instance {
		if s.rewind < 0 || next < s.rewind {
			s.rewind = next
		}
	}
	s.instance = instance
}

// Rewind reports, once, that the router restarted since the last call, and where the
// input must be rewound to. Send reports the same as a *RestartError; an idle worker (no
// more input) polls Rewind, since it has records to send again too.
func (s *Sender) Rewind() (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	off := s.rewind
	s.rewind = -1
	return off, off >= 0
}

// Heartbeat sends one heartbeat to the router requests go to and returns its answer.
func (s *Sender) Heartbeat(ctx context.Context) (HeartbeatResult, error) {
	base, _ := s.base()
	if base == "" {
		return HeartbeatResult{}, errNoRouter
	}
	return s.heartbeatTo(ctx, base)
}

// heartbeatTo sends one heartbeat to the router at base. One that answers 200 leads, and
// requests go to it; one that does not answer, or stands by, is left if requests go to it.
func (s *Sender) heartbeatTo(ctx context.Context, base string) (HeartbeatResult, error) {
	q := url.Values{"link": {s.link}, "worker": {strconv.Itoa(s.worker)}}
	if s.workers > 0 {
		q.Set("workers", strconv.Itoa(s.workers))
	}
	if s.caErr != nil {
		return HeartbeatResult{}, s.caErr
	}
	hctx, cancel := context.WithTimeout(ctx, heartbeatTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(hctx, http.MethodPost, base+"/v1/heartbeat?"+q.Encode(), nil)
	if err != nil {
		return HeartbeatResult{}, err
	}
	s.authorize(req)
	resp, err := s.hc.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			s.next(base, false) // no answer: down or cut off
		}
		return HeartbeatResult{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		if resp.StatusCode >= 500 {
			s.next(base, true)
		}
		return HeartbeatResult{}, apiError(resp.StatusCode, b)
	}
	var res HeartbeatResult
	if err := json.Unmarshal(b, &res); err != nil {
		return HeartbeatResult{}, fmt.Errorf("multidc: heartbeat answer: %w", err)
	}
	s.lead(base)
	s.answered(res.Instance, res.NextOffset)
	return res, nil
}

// Heartbeats sends a heartbeat to every router every interval until ctx is done, each
// router on its own so that one that does not answer delays no other. Failures are
// ignored: the next beat is the retry, and a router that misses them fails the link over,
// as it should.
func (s *Sender) Heartbeats(ctx context.Context, interval time.Duration) {
	var wg sync.WaitGroup
	defer wg.Wait()
	beating := map[string]context.CancelFunc{}
	defer func() {
		for _, stop := range beating {
			stop()
		}
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		s.mu.Lock()
		bases := slices.Clone(s.bases)
		s.mu.Unlock()
		for _, b := range bases {
			if _, ok := beating[b]; ok {
				continue
			}
			bctx, stop := context.WithCancel(ctx)
			beating[b] = stop
			wg.Go(func() { s.beat(bctx, b, interval) })
		}
		for b, stop := range beating {
			if !slices.Contains(bases, b) {
				stop() // a router that moved away
				delete(beating, b)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// beat heartbeats to one router every interval (at once again when an answer took
// longer) until ctx is done.
func (s *Sender) beat(ctx context.Context, base string, interval time.Duration) {
	for {
		start := time.Now()
		_, _ = s.heartbeatTo(ctx, base)
		if ctxtime.Sleep(ctx, interval-time.Since(start)) != nil {
			return
		}
	}
}

// Send posts one batch of JSON-line records (each with its "offset" and "link") until the
// router took all of it, retrying the whole batch after 429, 503, other 5xx and connection
// errors. A 400 (the batch is wrong) is returned at once as an *APIError; a router restart
// as a *RestartError, after which the caller rewinds and sends again from there.
func (s *Sender) Send(ctx context.Context, batch []byte) error {
	q := "/v1/records?" + url.Values{"link": {s.link}, "worker": {strconv.Itoa(s.worker)}}.Encode()
	wait := s.MinBackoff
	for {
		if off, ok := s.Rewind(); ok {
			return &RestartError{NextOffset: off}
		}
		err := errNoRouter
		if base, moved := s.base(); base != "" {
			if err = s.post(ctx, base+q, batch, moved); err != nil {
				var ae *APIError
				if !errors.As(err, &ae) {
					s.next(base, false) // no answer: down or cut off
				} else if ae.Code >= 500 {
					s.next(base, true) // standing by, or not ready: try the next router
				}
			}
		}
		if off, ok := s.Rewind(); ok {
			return &RestartError{NextOffset: off}
		}
		if err == nil {
			return nil
		}
		var ae *APIError
		if errors.As(err, &ae) && !ae.Retryable() {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("multidc: send: %w (last error: %v)", ctx.Err(), err)
		}
		if ctxtime.Sleep(ctx, wait) != nil {
			return fmt.Errorf("multidc: send: %w (last error: %v)", ctx.Err(), err)
		}
		wait = min(2*wait, s.MaxBackoff)
	}
}

func (s *Sender) post(ctx context.Context, u string, batch []byte, moved <-chan struct{}) error {
	if s.caErr != nil {
		return s.caErr
	}
	ctx, cancel := context.WithTimeout(ctx, sendTimeout)
	defer cancel()
	go func() {
		select {
		case <-moved: // another router leads: this one's answer is not awaited
			cancel()
		case <-ctx.Done():
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(batch))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	s.authorize(req)
	resp, err := s.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusTooManyRequests {
		var res IngestResult
		if json.Unmarshal(b, &res) == nil {
			s.answered(res.Instance, res.NextOffset)
		}
	}
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	return apiError(resp.StatusCode, b)
}

// FollowConfig keeps the sender's routers those of the worker's live configuration (the
// file named by STORMDOCK_CONFIG, cluster.WorkerConfig), re-read whenever it changes, until
// ctx is done. The agent rewrites it when the job's routers move.
func (s *Sender) FollowConfig(ctx context.Context, path string) {
	var seen time.Time
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		if fi, err := os.Stat(path); err == nil && !fi.ModTime().Equal(seen) {
			var c cluster.WorkerConfig
			if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &c) == nil {
				seen = fi.ModTime()
				if len(c.Routers) > 0 {
					s.SetRouters(c.Routers)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
