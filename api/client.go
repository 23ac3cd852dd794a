package api

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/ctxtime"
)

// Client talks to a master's HTTP API.
type Client struct {
	base  string
	token string
	http  *http.Client
}

// ClientOption changes how a Client connects.
type ClientOption func(*http.Transport)

// WithRootCAs makes the client trust the certificates signed by the CAs in pool (for an
// https:// master), instead of the system's.
func WithRootCAs(pool *x509.CertPool) ClientOption {
	return func(t *http.Transport) {
		t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
}

// NewClient returns a client for the master at base ("http://127.0.0.1:7070", or
// https://); token, when set, is sent as a bearer token.
func NewClient(base, token string, opts ...ClientOption) (*Client, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return nil, fmt.Errorf("master address %q must be like http://127.0.0.1:7070 or https://HOST:PORT", base)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	for _, o := range opts {
		o(tr)
	}
	return &Client{base: strings.TrimSuffix(base, "/"), token: token, http: &http.Client{Timeout: 30 * time.Second, Transport: tr}}, nil
}

// CloseIdleConnections closes the connections the client keeps open for its next requests.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

// CAPool is the CAs in the PEM files given, and these alone: a client given a cluster's CA
// trusts no other for it (and does not pay for reading the system's, some 15 ms a run).
// Without files it is the system's.
func CAPool(files ...string) (*x509.CertPool, error) {
	if len(files) == 0 {
		return x509.SystemCertPool()
	}
	pool := x509.NewCertPool()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read CA: %w", err)
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("read CA: %s holds no PEM certificate", f)
		}
	}
	return pool, nil
}

// connError explains a failure to reach the master, in particular the ways TLS goes wrong.
func (c *Client) connError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var rec tls.RecordHeaderError
	switch {
	case errors.As(err, &unknown):
		return fmt.Errorf("the master at %s has a certificate this client does not trust (%v): give its CA with --ca FILE or STORMDOCK_CA (a master makes DATA/ca.crt)", c.base, err)
	case errors.As(err, &host):
		return fmt.Errorf("the master at %s has a certificate for other names (%v): connect by a name or address it covers", c.base, err)
	case errors.As(err, &rec), strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return fmt.Errorf("the master at %s does not serve TLS: use %s", c.base, strings.Replace(c.base, "https://", "http://", 1))
	}
	return fmt.Errorf("cannot reach the master at %s: %v (is it running? set --master or STORMDOCK_MASTER)", c.base, err)
}

func (c *Client) do(ctx context.Context, method, path string, body []byte, contentType string, out any) error {
	_, err := c.roundTrip(ctx, c.http, method, path, body, contentType, out)
	return err
}

// roundTrip sends one request with hc and decodes its answer into out; it returns the
// answer's header whenever there was an answer, an error's too.
func (c *Client) roundTrip(ctx context.Context, hc *http.Client, method, path string, body []byte, contentType string, out any) (http.Header, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, c.connError(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return resp.Header, fmt.Errorf("read answer of %s %s: %w", method, path, err)
	}
	if resp.StatusCode == http.StatusBadRequest && bytes.Contains(data, []byte("HTTP request to an HTTPS server")) {
		return resp.Header, &Error{Status: resp.StatusCode, Code: "bad_input", Msg: fmt.Sprintf("the master at %s serves HTTPS: use %s", c.base,
			strings.Replace(c.base, "http://", "https://", 1))}
	}
	if resp.StatusCode >= 300 {
		return resp.Header, ParseError(resp.StatusCode, data, fmt.Sprintf("master answered %s to %s %s", resp.Status, method, path))
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.Header, fmt.Errorf("read answer of %s %s: %w", method, path, err)
		}
	}
	return resp.Header, nil
}

func (c *Client) doJSON(ctx context.Context, method, path string, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	return c.do(ctx, method, path, body, "application/json", out)
}

// SubmitJob sends a job spec as written (YAML or JSON); the master validates it.
func (c *Client) SubmitJob(ctx context.Context, spec []byte) (cluster.JobRecord, error) {
	var rec cluster.JobRecord
	err := c.do(ctx, http.MethodPost, "/v1/jobs", spec, "application/yaml", &rec)
	return rec, err
}

// Jobs lists the jobs.
func (c *Client) Jobs(ctx context.Context) ([]JobSummary, error) {
	out, _, err := c.JobsWith(ctx, QueryOptions{})
	return out, err
}

// Job returns one job with its workers.
func (c *Client) Job(ctx context.Context, name string) (JobStatus, error) {
	out, _, err := c.JobWith(ctx, name, QueryOptions{})
	return out, err
}

// JobSummary returns one job's record and summary without its workers: what polling for a
// job to settle needs, at the same cost whatever the job's size.
func (c *Client) JobSummary(ctx context.Context, name string) (JobStatus, error) {
	out, _, err := c.JobSummaryWith(ctx, name, QueryOptions{})
	return out, err
}

// ScaleJob sets a job's worker count.
func (c *Client) ScaleJob(ctx context.Context, name string, workers int) (cluster.JobRecord, error) {
	var rec cluster.JobRecord
	err := c.doJSON(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(name)+"/scale", ScaleRequest{Workers: workers}, &rec)
	return rec, err
}

// KillJob stops a job; grace 0 keeps the job's own grace period.
func (c *Client) KillJob(ctx context.Context, name string, grace time.Duration) (cluster.JobRecord, error) {
	var rec cluster.JobRecord
	err := c.doJSON(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(name)+"/kill", KillRequest{Grace: cluster.Duration(grace)}, &rec)
	return rec, err
}

// UpdateJob sends a changed spec (as written) for a running job.
func (c *Client) UpdateJob(ctx context.Context, name string, spec []byte, policy PolicyOverrides) (UpdateReply, error) {
	var out UpdateReply
	err := c.doJSON(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(name)+"/update", UpdateRequest{Spec: string(spec), Policy: policy}, &out)
	return out, err
}

// RollbackJob rolls a job back to generation to (0: the one before the current).
func (c *Client) RollbackJob(ctx context.Context, name string, to int64, policy PolicyOverrides) (UpdateReply, error) {
	var out UpdateReply
	err := c.doJSON(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(name)+"/rollback", RollbackRequest{To: to, Policy: policy}, &out)
	return out, err
}

// RestartJob restarts a job's workers in place, rolling.
func (c *Client) RestartJob(ctx context.Context, name string, req RestartRequest) (cluster.JobRecord, error) {
	var rec cluster.JobRecord
	err := c.doJSON(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(name)+"/restart", req, &rec)
	return rec, err
}

// RolloutAction pauses, resumes or promotes a job's rollout (action: pause, resume,
// promote).
func (c *Client) RolloutAction(ctx context.Context, name, action string) (cluster.JobRecord, error) {
	var rec cluster.JobRecord
	err := c.doJSON(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(name)+"/"+url.PathEscape(action), struct{}{}, &rec)
	return rec, err
}

// JobHistory lists a job's generations.
func (c *Client) JobHistory(ctx context.Context, name string) (JobHistory, error) {
	var out JobHistory
	err := c.doJSON(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(name)+"/history", nil, &out)
	return out, err
}

// Nodes lists the live nodes.
func (c *Client) Nodes(ctx context.Context) ([]NodeView, error) {
	out, _, err := c.NodesWith(ctx, QueryOptions{})
	return out, err
}

// DrainNode moves work off a node (drain true) or lets it take work again.
func (c *Client) DrainNode(ctx context.Context, id string, drain bool) error {
	verb := "undrain"
	if drain {
		verb = "drain"
	}
	return c.doJSON(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(id)+"/"+verb, nil, nil)
}

// EndAvoidance ends node id's avoidance of job's workers after crash loops there (an
// undrain naming the job), forgetting them; the node's draining stays as it is.
func (c *Client) EndAvoidance(ctx context.Context, id, job string) error {
	return c.doJSON(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(id)+"/undrain", UndrainRequest{Job: job}, nil)
}

// Tenants lists the tenants with their use.
func (c *Client) Tenants(ctx context.Context) ([]TenantView, error) {
	out, _, err := c.TenantsWith(ctx, QueryOptions{})
	return out, err
}

// CreateTenant creates a tenant.
func (c *Client) CreateTenant(ctx context.Context, t cluster.Tenant) error {
	return c.doJSON(ctx, http.MethodPost, "/v1/tenants", t, nil)
}

// UpdateTenant changes a tenant's caps (admin only) and returns the tenant as stored.
func (c *Client) UpdateTenant(ctx context.Context, name string, ch TenantChange) (cluster.Tenant, error) {
	var out cluster.Tenant
	err := c.doJSON(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(name)+"/update", ch, &out)
	return out, err
}

// Health tells whether the master answers and leads.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	err := c.doJSON(ctx, http.MethodGet, "/v1/health", nil, &h)
	return h, err
}

// SetRegistryAuth gives a tenant registry credentials (config, Docker's config.json), for
// its images alone; the admin may for any tenant, a tenant's token for its own. The answer
// names the registry hosts, never the credentials.
func (c *Client) SetRegistryAuth(ctx context.Context, tenant string, config []byte) ([]string, error) {
	var out RegistryAuthReply
	err := c.do(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(tenant)+"/registry-auth", config, "application/json", &out)
	return out.Hosts, err
}

// ClearRegistryAuth removes a tenant's registry credentials.
func (c *Client) ClearRegistryAuth(ctx context.Context, tenant string) error {
	return c.doJSON(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(tenant)+"/registry-auth/clear", nil, nil)
}

// SetSecret stores value as the tenant's secret name (a new version when it has one): the
// admin for any tenant, a tenant's token for its own. The value goes in the body alone.
func (c *Client) SetSecret(ctx context.Context, tenant, name string, value []byte) (SecretSetReply, error) {
	var out SecretSetReply
	err := c.do(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(tenant)+"/secrets/"+url.PathEscape(name), value, "application/octet-stream", &out)
	return out, err
}

// DeleteSecret removes the tenant's secret name.
func (c *Client) DeleteSecret(ctx context.Context, tenant, name string) error {
	return c.doJSON(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(tenant)+"/secrets/"+url.PathEscape(name)+"/delete", nil, nil)
}

// Secrets lists the tenant's secrets ("": every tenant's the caller may see), never values.
func (c *Client) Secrets(ctx context.Context, tenant string) ([]SecretView, error) {
	path := "/v1/secrets"
	if tenant != "" {
		path += "?tenant=" + url.QueryEscape(tenant)
	}
	var out []SecretView
	err := c.doJSON(ctx, http.MethodGet, path, nil, &out)
	return out, err
}

// RewrapSecrets seals every secret again with the masters' active key (admin only).
func (c *Client) RewrapSecrets(ctx context.Context) (SecretsRewrapReply, error) {
	var out SecretsRewrapReply
	err := c.doJSON(ctx, http.MethodPost, "/v1/secrets/rewrap", nil, &out)
	return out, err
}

// SharedImages lists the shared repository prefixes (admin only).
func (c *Client) SharedImages(ctx context.Context) ([]string, error) {
	var out SharedImages
	err := c.doJSON(ctx, http.MethodGet, "/v1/images/shared", nil, &out)
	return out.Prefixes, err
}

// ShareImages shares (share true) or unshares a repository prefix (admin only) and returns
// the list as stored.
func (c *Client) ShareImages(ctx context.Context, prefix string, share bool) ([]string, error) {
	path := "/v1/images/unshare"
	if share {
		path = "/v1/images/share"
	}
	var out SharedImages
	err := c.doJSON(ctx, http.MethodPost, path, SharePrefix{Prefix: prefix}, &out)
	return out.Prefixes, err
}

// TenantToken makes a new token for a tenant (admin only) and returns it.
func (c *Client) TenantToken(ctx context.Context, name string) (string, error) {
	var out TokenReply
	err := c.doJSON(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(name)+"/token", nil, &out)
	return out.Token, err
}

// DCs lists the data centers.
func (c *Client) DCs(ctx context.Context) ([]DCView, error) {
	out, _, err := c.DCsWith(ctx, QueryOptions{})
	return out, err
}

// FailDC moves every worker out of a data center and keeps new ones out.
func (c *Client) FailDC(ctx context.Context, dc string) (cluster.DCRecord, error) {
	var rec cluster.DCRecord
	err := c.doJSON(ctx, http.MethodPost, "/v1/dcs/"+url.PathEscape(dc)+"/fail", DCRequest{}, &rec)
	return rec, err
}

// RestoreDC lets work into a data center again; with rebalance, jobs spread back into it.
func (c *Client) RestoreDC(ctx context.Context, dc string, rebalance bool) (cluster.DCRecord, error) {
	var rec cluster.DCRecord
	err := c.doJSON(ctx, http.MethodPost, "/v1/dcs/"+url.PathEscape(dc)+"/restore", DCRequest{Rebalance: rebalance}, &rec)
	return rec, err
}

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
	if len(f.Kinds) > 0 {
		q.Set("kind", strings.Join(f.Kinds, ","))
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
		return nil, ParseError(resp.StatusCode, data, fmt.Sprintf("master answered %s to GET %s", resp.Status, path))
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
		if ctxtime.Sleep(ctx, backoff) != nil {
			return nil
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
