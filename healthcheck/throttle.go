package healthcheck

import (
	"fmt"
	"math"
	"time"
)

// Thresholds are the memory marks, as fractions of the node's memory in use (see
// Sample.Used), and how long pressure must stay low before slots come back.
type Thresholds struct {
	// High: at or above it, slots are withheld.
	High float64
	// Low: slots come back only after pressure stayed below it for Hold.
	Low float64
	// Critical: at or above it, every slot is withheld and workers are evicted.
	Critical float64
	Hold     time.Duration
}

// Validate checks 0 < Low < High < Critical <= 1 and Hold >= 0.
func (th Thresholds) Validate() error {
	switch {
	case !(th.Low > 0):
		return fmt.Errorf("--mem-low %v must be above 0", th.Low)
	case !(th.Low < th.High):
		return fmt.Errorf("--mem-low %v must be below --mem-high %v", th.Low, th.High)
	case !(th.High < th.Critical):
		return fmt.Errorf("--mem-high %v must be below --mem-critical %v", th.High, th.Critical)
	case !(th.Critical <= 1):
		return fmt.Errorf("--mem-critical %v must be at most 1", th.Critical)
	case th.Hold < 0:
		return fmt.Errorf("--throttle-hold %v must not be negative", th.Hold)
	}
	return nil
}

// Target is the step function: how many of slots to withhold at a used fraction, with no
// history.
//
//	used <  High             0
//	High <= used < Critical  ceil(slots * (used-High)/(Critical-High)), at least 1
//	used >= Critical         slots
//
// So the first slot goes as soon as the high mark is reached, and the rest go evenly as
// pressure climbs to the critical mark. Target is non-decreasing in used.
func (th Thresholds) Target(used float64, slots int) int {
	if slots <= 0 || math.IsNaN(used) || used < th.High {
		return 0
	}
	if used >= th.Critical {
		return slots
	}
	// The epsilon keeps float noise from adding a slot: 6*(0.9-0.8)/(0.95-0.8) is
	// 4.000000000000001 in float64, and must withhold 4, not 5.
	w := int(math.Ceil(float64(slots)*(used-th.High)/(th.Critical-th.High) - 1e-9))
	return min(max(w, 1), slots)
}

// Throttle is the hysteresis state machine over Target. It is pure: the caller passes the
// time, so tests drive it with any clock.
//
// Withholding rises at once to Target when pressure grows (protecting the node is urgent) and
// never falls while pressure is at or above Low. Everything is released only once pressure
// has stayed below Low for Hold, measured from the first sample below Low: one sample back
// above Low restarts the wait. Releasing in one go is deliberate: below Low the step function
// would release everything anyway, and one release per Hold is the least the master sees.
type Throttle struct {
	th       Thresholds
	withheld int
	lowSince time.Time // first sample of the current run below Low; zero when not below
}

// NewThrottle returns a throttle withholding nothing.
func NewThrottle(th Thresholds) *Throttle { return &Throttle{th: th} }

// Thresholds returns the marks the throttle uses.
func (t *Throttle) Thresholds() Thresholds { return t.th }

// Withheld is the number of slots withheld now.
func (t *Throttle) Withheld() int { return t.withheld }

// ReleaseAt is when the withheld slots will come back if pressure stays below Low, or the
// zero time when no release is pending.
func (t *Throttle) ReleaseAt() time.Time {
	if t.withheld == 0 || t.lowSince.IsZero() {
		return time.Time{}
	}
	return t.lowSince.Add(t.th.Hold)
}

// Observe feeds one sample of the used fraction taken at now, for a node of slots slots, and
// returns how many slots to withhold. A NaN sample carries no information and changes nothing.
func (t *Throttle) Observe(now time.Time, used float64, slots int) int {
	if math.IsNaN(used) {
		return t.withheld
	}
	if used < t.th.Low {
		if t.lowSince.IsZero() || now.Before(t.lowSince) { // a clock that went back restarts the wait
			t.lowSince = now
		}
		if t.withheld > 0 && now.Sub(t.lowSince) >= t.th.Hold {
			t.withheld = 0
		}
	} else {
		t.lowSince = time.Time{}
	}
	if w := t.th.Target(used, slots); w > t.withheld {
		t.withheld = w
	}
	t.withheld = min(t.withheld, max(slots, 0))
	return t.withheld
}
