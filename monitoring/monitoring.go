// Package monitoring ships stormdock's Prometheus alert rules (alerts.yml), Grafana
// dashboard (dashboard.json) and an example Prometheus configuration (prometheus.yml, which
// scrapes with the cluster's scrape token), and says which metrics they use, so tests can
// hold them to what runs.
package monitoring

import (
	_ "embed"
	"regexp"
	"slices"
	"strings"
)

// Rules is the Prometheus rules file; Dashboard the Grafana dashboard (JSON model).
var (
	//go:embed alerts.yml
	Rules []byte
	//go:embed dashboard.json
	Dashboard []byte
)

var metricName = regexp.MustCompile(`\bstormdock_(master|agent|router)_[a-z0-9_]+`)

// MetricNames lists, sorted, the metric names the rules and the dashboard use: series as
// exported at /metrics, so a histogram's _bucket, _sum and _count stand for the histogram's
// name.
func MetricNames() []string {
	var out []string
	for _, src := range [][]byte{Rules, Dashboard} {
		for _, m := range metricName.FindAll(src, -1) {
			name := string(m)
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if n, ok := strings.CutSuffix(name, suffix); ok && strings.HasSuffix(n, "_seconds") {
					name = n
				}
			}
			if !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	slices.Sort(out)
	return out
}
