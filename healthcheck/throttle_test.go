package healthcheck

import (
	"math/rand/v2"
	"testing"
	"time"
)

var testTh = Thresholds{High: 0.80, Low: 0.70, Critical: 0.95, Hold: 10 * time.Second}

func TestTargetSteps(t *testing.T) {
	// 8 slots between 0.80 and 0.95: one slot per 1.875 points.
	for _, tc := range []struct {
		used float64
		want int
	}{
		{0, 0}, {0.5, 0}, {0.7999, 0},
		{0.80, 1}, {0.8001, 1}, {0.81875, 1}, {0.82, 2}, {0.875, 4}, {0.9, 6}, {0.949, 8},
		{0.95, 8}, {1.0, 8}, {1.5, 8},
	} {
		if got := testTh.Target(tc.used, 8); got != tc.want {
			t.Errorf("Target(%v, 8) = %d, want %d", tc.used, got, tc.want)
		}
	}
	if got := (Thresholds{High: 0.8, Low: 0.7, Critical: 0.95}).Target(0.9, 6); got != 4 {
		t.Errorf("float noise: Target(0.9, 6) = %d, want 4", got)
	}
	if got := testTh.Target(0.99, 0); got != 0 {
		t.Errorf("no slots: %d", got)
	}
}

func TestThrottleHysteresis(t *testing.T) {
	tr := NewThrottle(testTh)
	t0 := time.Unix(0, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	steps := []struct {
		sec  float64
		used float64
		want int
	}{
		{0, 0.50, 0},
		{1, 0.85, 3},    // above high: withhold at once
		{2, 0.90, 6},    // more pressure: more
		{3, 0.82, 6},    // less pressure but above low: keep
		{4, 0.75, 6},    // between low and high: keep
		{5, 0.60, 6},    // below low: the hold starts
		{14, 0.60, 6},   // 9 s below: keep
		{14.5, 0.71, 6}, // back above low: the hold resets
		{15, 0.60, 6},
		{24.9, 0.60, 6},
		{25, 0.60, 0}, // 10 s below since 15: release
		{26, 0.96, 8}, // critical: all
	}
	for _, s := range steps {
		if got := tr.Observe(at(s.sec), s.used, 8); got != s.want {
			t.Fatalf("t=%vs used=%v: withheld %d, want %d", s.sec, s.used, got, s.want)
		}
	}
	// Fewer slots than withheld: clamp.
	if got := tr.Observe(at(27), 0.96, 3); got != 3 {
		t.Errorf("after slots shrank: %d", got)
	}
}

// TestThrottleProperties drives random pressure traces and checks the promises of Throttle:
// withheld stays in [0, slots]; it never falls unless every sample of the last Hold was below
// Low; it is at least Target at every sample; and at any moment a higher sample would never
// withhold less than a lower one.
func TestThrottleProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for trace := 0; trace < 500; trace++ {
		slots := rng.IntN(17)
		th := Thresholds{Low: 0.1 + 0.5*rng.Float64(), Hold: time.Duration(rng.IntN(20)) * time.Second}
		th.High = th.Low + 0.01 + 0.2*rng.Float64()
		th.Critical = min(1, th.High+0.01+0.2*rng.Float64())
		if th.Validate() != nil {
			continue
		}
		tr := NewThrottle(th)
		now := time.Unix(1e9, 0)
		type obs struct {
			at   time.Time
			used float64
		}
		var hist []obs
		prev := 0
		for i := 0; i < 300; i++ {
			now = now.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
			used := rng.Float64() * 1.1
			if rng.IntN(4) == 0 { // long calm stretches, so that releases happen
				used = th.Low * rng.Float64()
			}
			// Monotone in pressure: from the same state, a higher sample withholds no less.
			other := *tr
			u2 := used + rng.Float64()*(1.1-used)
			hi := other.Observe(now, u2, slots)
			got := tr.Observe(now, used, slots)
			if hi < got {
				t.Fatalf("trace %d: used %v -> %d but higher %v -> %d", trace, used, got, u2, hi)
			}
			hist = append(hist, obs{now, used})
			if got < 0 || got > slots {
				t.Fatalf("trace %d: withheld %d outside [0, %d]", trace, got, slots)
			}
			if tgt := th.Target(used, slots); got < tgt {
				t.Fatalf("trace %d: withheld %d below target %d at used %v", trace, got, tgt, used)
			}
			if got < prev {
				// No flapping: the run of samples below Low that ends now began at least
				// Hold ago.
				k := len(hist) - 1
				for k > 0 && hist[k-1].used < th.Low {
					k--
				}
				if hist[len(hist)-1].used >= th.Low {
					t.Fatalf("trace %d: released at %v with used %v >= low %v", trace, now, used, th.Low)
				}
				if now.Sub(hist[k].at) < th.Hold {
					t.Fatalf("trace %d: released after %v below low, hold %v", trace, now.Sub(hist[k].at), th.Hold)
				}
				if got != 0 {
					t.Fatalf("trace %d: partial release to %d", trace, got)
				}
			}
			prev = got
		}
	}
}

func TestThresholdsValidate(t *testing.T) {
	for _, bad := range []Thresholds{
		{Low: 0, High: 0.5, Critical: 0.9},
		{Low: 0.6, High: 0.5, Critical: 0.9},
		{Low: 0.5, High: 0.5, Critical: 0.9},
		{Low: 0.5, High: 0.9, Critical: 0.9},
		{Low: 0.5, High: 0.8, Critical: 1.1},
		{Low: 0.5, High: 0.8, Critical: 0.9, Hold: -1},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
	if err := (Thresholds{Low: 0.5, High: 0.8, Critical: 1}).Validate(); err != nil {
		t.Error(err)
	}
}
