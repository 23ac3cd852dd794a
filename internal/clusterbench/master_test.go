package clusterbench

import (
	"math"
	"testing"
)

// TestServerQuantile reads quantiles from the difference of two scrapes of a histogram, as
// Prometheus' histogram_quantile does.
func TestServerQuantile(t *testing.T) {
	const r = "GET /v1/jobs"
	key := func(le string) string { return apiRequests + "|" + r + "|" + le }
	before := map[string]float64{key("0.001"): 10, key("0.002"): 10, key("0.004"): 10, key("+Inf"): 10}
	// 100 more requests: 50 within 1ms, 40 in (1ms, 2ms], 9 in (2ms, 4ms], 1 beyond 4ms.
	after := map[string]float64{key("0.001"): 60, key("0.002"): 100, key("0.004"): 109, key("+Inf"): 110,
		apiRequests + "|GET /v1/jobs/{name}|0.001": 500}
	for _, c := range []struct {
		q, want float64
	}{
		{0.5, 1},    // the 50th request, at the first bucket's bound
		{0.7, 1.5},  // 20 of the next bucket's 40: half way through it
		{0.99, 4},   // the 99th: the last of the third bucket
		{0.995, 4},  // beyond the last bound: that bound
		{0.25, 0.5}, // 25 of the first bucket's 50, from 0
	} {
		if got := serverQuantile(before, after, r, c.q); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("q%v = %vms, want %vms", c.q, got, c.want)
		}
	}
	if got := serverQuantile(after, after, r, 0.99); got != 0 {
		t.Errorf("no requests between the scrapes: %vms, want 0", got)
	}
	if got := serverQuantile(nil, nil, "GET /none", 0.99); got != 0 {
		t.Errorf("a route never answered: %vms, want 0", got)
	}
}
