// Package promtest reads metric values out of a Prometheus registry, for tests that check
// what a component reports.
package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Value returns the value of the gauge or counter name whose labels include labels (a nil
// map matches any series); it fails the test when there is none.
func Value(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}
