package cluster

import (
	"strings"
	"testing"
	"time"
)

// TestScalingPolicy: the scaling: block's problems, each a line saying what is wrong; a
// good block reads back with its defaults.
func TestScalingPolicy(t *testing.T) {
	base := "name: a\ntenant: t\nworkers: 2\nresources: {memory: 64Mi, cpu: 1}\ncommand: [x]\n"
	good := base + "scaling: {min: 2, max: 8, metric: input_backlog, target: 500, cooldownUp: 30s, maxStep: 2}\n"
	j, err := ParseJobSpec([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	p := j.Scaling
	if p == nil || p.Min != 2 || p.Max != 8 || p.Metric != "input_backlog" || p.Target != 500 || p.Up() != 30*time.Second ||
		p.Down() != DefaultCooldownDown || p.Window() != DefaultStabilization || p.MaxStep != 2 {
		t.Fatalf("parsed %+v", p)
	}
	for _, tc := range []struct{ name, block, want string }{
		{"min above max", "{min: 5, max: 3, metric: q, target: 1}", "scaling.min: 5 is above scaling.max 3"},
		{"min zero", "{min: 0, max: 3, metric: q, target: 1}", "scaling.min: must be at least 1"},
		{"workers outside", "{min: 3, max: 5, metric: q, target: 1}", "workers: 2 is outside scaling.min..max (3..5)"},
		{"no metric", "{min: 1, max: 3, target: 1}", "scaling.metric: is required"},
		{"metric with labels", "{min: 1, max: 3, metric: 'q{a=\"b\"}', target: 1}", "is not a metric name"},
		{"client library series", "{min: 1, max: 3, metric: go_goroutines, target: 1}", "the agents drop go_* series"},
		{"worker count", "{min: 1, max: 3, metric: workers, target: 1}", "workers cannot drive scaling"},
		{"zero target", "{min: 1, max: 3, metric: q, target: 0}", "scaling.target: must be a number above 0"},
		{"negative cooldown", "{min: 1, max: 3, metric: q, target: 1, cooldownDown: -1s}", "scaling.cooldownDown: must not be negative"},
		{"negative step", "{min: 1, max: 3, metric: q, target: 1, maxStep: -1}", "scaling.maxStep: must not be negative"},
		{"unknown field", "{min: 1, max: 3, metric: q, target: 1, interval: 5s}", "scaling.interval: unknown field"},
		{"too long a window", "{min: 1, max: 3, metric: q, target: 1, stabilization: 48h}", "scaling.stabilization: must be at most 24h"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseJobSpec([]byte(base + "scaling: " + tc.block + "\n"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
