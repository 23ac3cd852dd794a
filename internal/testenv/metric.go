package testenv

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric returns the value of the series name whose labels include labels (a nil map matches
// any series) from g: a gauge's or counter's value, a histogram's or summary's sample count.
// It fails the test when there is no such series.
func Metric(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
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
			switch {
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			case m.GetSummary() != nil:
				return float64(m.GetSummary().GetSampleCount())
			case m.GetUntyped() != nil:
				return m.GetUntyped().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}
