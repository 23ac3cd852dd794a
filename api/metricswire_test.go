package api

import (
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

func randomNodeMetrics(r *rand.Rand) NodeMetrics {
	names := []string{"cpu", "memory", "input_backlog", "lines_processed_total", "q", ""}
	m := NodeMetrics{Node: "n-" + string(rune('a'+r.IntN(26))), At: time.UnixMilli(1 + r.Int64N(1<<42)).UTC(),
		Interval: time.Duration(r.IntN(60000)) * time.Millisecond}
	if r.IntN(10) == 0 {
		m.At = time.Time{} // an agent before its first round
	}
	for range r.IntN(5) {
		j := NodeJobMetrics{Job: names[r.IntN(len(names))], Tenant: "t", Workers: r.IntN(20), Failed: r.IntN(3)}
		if r.IntN(2) == 0 {
			j.Problem = "worker 3: no answer within 2s"
		}
		for range r.IntN(8) {
			s := SeriesSample{Name: names[r.IntN(len(names))], Labels: `a="b\"c"`[:r.IntN(8)], Counter: r.IntN(2) == 0,
				Sum: r.NormFloat64() * 1e6, Min: -r.Float64(), Max: r.Float64(), N: r.IntN(100)}
			if s.Counter {
				s.Total = r.Float64() * 1e12
			}
			j.Series = append(j.Series, s)
		}
		m.Jobs = append(m.Jobs, j)
	}
	return m
}

// TestNodeMetricsRoundTrip: what MarshalNodeMetrics writes, UnmarshalNodeMetrics reads back
// equal (property, over random answers).
func TestNodeMetricsRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		m := randomNodeMetrics(r)
		b := MarshalNodeMetrics(m)
		got, err := UnmarshalNodeMetrics(b)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if len(m.Jobs) == 0 {
			m.Jobs = []NodeJobMetrics{}
		}
		for k := range m.Jobs {
			if m.Jobs[k].Series == nil {
				m.Jobs[k].Series = []SeriesSample{}
			}
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("case %d:\n got %+v\nwant %+v", i, got, m)
		}
		// Every cut is refused, never read as a shorter answer.
		if cut := r.IntN(len(b)); cut > 0 {
			if _, err := UnmarshalNodeMetrics(b[:cut]); err == nil {
				t.Fatalf("case %d: %d of %d bytes read as an answer", i, cut, len(b))
			}
		}
	}
}

func TestNodeMetricsRefused(t *testing.T) {
	good := MarshalNodeMetrics(NodeMetrics{Node: "n", Jobs: []NodeJobMetrics{{Job: "j", Series: []SeriesSample{{Name: "x", Sum: 1, N: 1}}}}})
	nan := MarshalNodeMetrics(NodeMetrics{Node: "n", Jobs: []NodeJobMetrics{{Job: "j", Series: []SeriesSample{{Name: "x", Sum: math.NaN()}}}}})
	for name, tc := range map[string]struct {
		b    []byte
		want string
	}{
		"json":     {[]byte(`{"node":"n"}`), "not the node metrics form"},
		"empty":    {nil, "not the node metrics form"},
		"trailing": {append(append([]byte{}, good...), 0), "after the end"},
		"nan":      {nan, "not a finite number"},
		"huge":     {append([]byte(nodeMetricsMagic), make([]byte, MaxNodeMetricsBytes)...), "over"},
		"strings":  {append([]byte(nodeMetricsMagic+"\x01n\x00\x00"), 0xff, 0xff, 0xff, 0x7f), "strings"},
	} {
		_, err := UnmarshalNodeMetrics(tc.b)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", name, err, tc.want)
		}
	}
}

// FuzzUnmarshalNodeMetrics: any bytes decode or are refused, without a panic, and what
// decodes encodes back to the same bytes.
func FuzzUnmarshalNodeMetrics(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		f.Add(MarshalNodeMetrics(randomNodeMetrics(r)))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := UnmarshalNodeMetrics(b)
		if err != nil {
			return
		}
		again, err := UnmarshalNodeMetrics(MarshalNodeMetrics(m))
		if err != nil || !reflect.DeepEqual(again, m) {
			t.Fatalf("decoded %+v does not round-trip: %v", m, err)
		}
	})
}
