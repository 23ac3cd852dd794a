package api

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Blocking queries, as Nomad's: the reads of jobs, a job, nodes, data centers and tenants
// answer with IndexHeader, and a read that sends an index back (?index=N&wait=D) is held
// by the master until what it answers differs from what was answered at index N, or D
// elapses (it then answers the same, with the same index). Indexes are the master's own:
// they grow while it runs, per viewer (a tenant's indexes move with what its token shows,
// nothing else), and say nothing about what changed. An index the master did not give
// (another master's, or its own before a restart) is answered at once.

// IndexHeader carries an answer's index: where its content last changed.
const IndexHeader = "X-Stormdock-Index"

const (
	// DefaultQueryWait is how long a blocking query waits when it does not say.
	DefaultQueryWait = 5 * time.Minute
	// MaxQueryWait caps a blocking query's wait; longer ones wait this long. The master
	// adds up to a sixteenth of the wait at random, so that clients that started together
	// do not all come back together.
	MaxQueryWait = 10 * time.Minute
)

// QueryOptions make a read a blocking query.
type QueryOptions struct {
	// WaitIndex, when not 0, is the index (QueryMeta.LastIndex) of an earlier answer of
	// the same read: the master answers once what it would answer differs from that, or
	// WaitTime elapsed. 0 answers at once.
	WaitIndex uint64
	// WaitTime bounds the wait; 0 is the master's default (DefaultQueryWait).
	WaitTime time.Duration
}

// QueryMeta is what a read's answer says of itself.
type QueryMeta struct {
	// LastIndex is the answer's index, to send as the next read's WaitIndex; 0 when the
	// master does not give one (a master from before blocking queries).
	LastIndex uint64
}

// query reads path (which may hold a query of its own) into out, as a blocking query when q
// says so. A read that waits is bounded by the wait and its jitter, and by ctx, rather than
// by the client's timeout for ordinary requests.
func (c *Client) query(ctx context.Context, path string, q QueryOptions, out any) (QueryMeta, error) {
	hc := c.http
	if q.WaitIndex > 0 {
		v := url.Values{}
		v.Set("index", strconv.FormatUint(q.WaitIndex, 10))
		wait := DefaultQueryWait
		if q.WaitTime > 0 {
			wait = min(q.WaitTime, MaxQueryWait)
			v.Set("wait", wait.String())
		}
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		path += sep + v.Encode()
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait+wait/16+c.http.Timeout)
		defer cancel()
		hc = &http.Client{Transport: c.http.Transport}
	}
	h, err := c.roundTrip(ctx, hc, http.MethodGet, path, nil, "", out)
	var meta QueryMeta
	if h != nil {
		meta.LastIndex, _ = strconv.ParseUint(h.Get(IndexHeader), 10, 64)
	}
	return meta, err
}

// JobsWith lists the jobs, as a blocking query when q says so.
func (c *Client) JobsWith(ctx context.Context, q QueryOptions) ([]JobSummary, QueryMeta, error) {
	var out []JobSummary
	meta, err := c.query(ctx, "/v1/jobs", q, &out)
	return out, meta, err
}

// JobWith returns one job with its workers, as a blocking query when q says so.
func (c *Client) JobWith(ctx context.Context, name string, q QueryOptions) (JobStatus, QueryMeta, error) {
	var out JobStatus
	meta, err := c.query(ctx, "/v1/jobs/"+url.PathEscape(name), q, &out)
	return out, meta, err
}

// JobSummaryWith returns one job's record and summary without its workers, as a blocking
// query when q says so: what waiting for a job to settle needs, at the same cost whatever
// the job's size. A job that does not exist (ErrNotFound) has an index too: a blocking
// query on it returns when the job comes.
func (c *Client) JobSummaryWith(ctx context.Context, name string, q QueryOptions) (JobStatus, QueryMeta, error) {
	var out JobStatus
	meta, err := c.query(ctx, "/v1/jobs/"+url.PathEscape(name)+"?workers=false", q, &out)
	return out, meta, err
}

// NodesWith lists the live nodes, as a blocking query when q says so.
func (c *Client) NodesWith(ctx context.Context, q QueryOptions) ([]NodeView, QueryMeta, error) {
	var out []NodeView
	meta, err := c.query(ctx, "/v1/nodes", q, &out)
	return out, meta, err
}

// DCsWith lists the data centers, as a blocking query when q says so.
func (c *Client) DCsWith(ctx context.Context, q QueryOptions) ([]DCView, QueryMeta, error) {
	var out []DCView
	meta, err := c.query(ctx, "/v1/dcs", q, &out)
	return out, meta, err
}

// TenantsWith lists the tenants with their use, as a blocking query when q says so.
func (c *Client) TenantsWith(ctx context.Context, q QueryOptions) ([]TenantView, QueryMeta, error) {
	var out []TenantView
	meta, err := c.query(ctx, "/v1/tenants", q, &out)
	return out, meta, err
}
