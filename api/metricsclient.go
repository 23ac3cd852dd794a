package api

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"github.com/stormdock/stormdock/cluster"
)

// JobMetrics returns a job's series from since ("30m", an RFC 3339 time, "" for the whole
// window); series names some (by name, or name{labels}), none for all.
func (c *Client) JobMetrics(ctx context.Context, name string, series []string, since string) (JobMetrics, error) {
	return c.jobMetrics(ctx, name, series, since, false)
}

// JobMetricsDetail is JobMetrics with each point's min, max and count of workers.
func (c *Client) JobMetricsDetail(ctx context.Context, name string, series []string, since string) (JobMetrics, error) {
	return c.jobMetrics(ctx, name, series, since, true)
}

func (c *Client) jobMetrics(ctx context.Context, name string, series []string, since string, detail bool) (JobMetrics, error) {
	q := url.Values{}
	if detail {
		q.Set("detail", "true")
	}
	if len(series) > 0 {
		q.Set("series", strings.Join(series, ","))
	}
	if since != "" {
		q.Set("since", since)
	}
	path := "/v1/jobs/" + url.PathEscape(name) + "/metrics"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out JobMetrics
	err := c.doJSON(ctx, http.MethodGet, path, nil, &out)
	return out, err
}

// JobWorkerMetrics returns each of a job's workers' latest values, from their agents.
func (c *Client) JobWorkerMetrics(ctx context.Context, name string) (JobWorkerMetrics, error) {
	var out JobWorkerMetrics
	err := c.doJSON(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(name)+"/metrics/workers", nil, &out)
	return out, err
}

// LatestMetrics returns every job's latest values (the caller's own jobs, for a tenant).
func (c *Client) LatestMetrics(ctx context.Context) (JobsMetrics, error) {
	var out JobsMetrics
	err := c.doJSON(ctx, http.MethodGet, "/v1/metrics/latest", nil, &out)
	return out, err
}

// AutoscaleJob pauses (pause) or resumes a job's scaling policy.
func (c *Client) AutoscaleJob(ctx context.Context, name string, pause bool) (cluster.JobRecord, error) {
	var rec cluster.JobRecord
	err := c.doJSON(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(name)+"/autoscale", AutoscaleRequest{Pause: pause, Resume: !pause}, &rec)
	return rec, err
}

// RecordEvent records an external controller's event in the cluster's log (admin token;
// only the cluster.* kinds a controller may record).
func (c *Client) RecordEvent(ctx context.Context, e Event) error {
	return c.doJSON(ctx, http.MethodPost, "/v1/events", e, nil)
}
