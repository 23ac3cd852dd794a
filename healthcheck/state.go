package healthcheck

import (
	"fmt"
	"math"
	"time"

	"github.com/stormdock/stormdock/cluster"
)

// NodeState is what the health checks conclude about the node: what the agent advertises.
type NodeState struct {
	// Health is cluster.HealthHealthy, HealthThrottled or HealthUnhealthy.
	Health string
	// Slots is the node's configured slot count; Withheld how many of them to hold back
	// from new work (all of them when unhealthy).
	Slots    int
	Withheld int
	// Reason says why, in one line, for logs and the status record.
	Reason string
	// Script and Output name the health script that made the node unhealthy or throttled,
	// with its deciding line, trimmed.
	Script string
	Output string
	// KillWorkers is set when the node is unhealthy by a script and the operator asked for
	// running workers to be stopped then (--health-kill-workers). The agent decides.
	KillWorkers bool
	// MemUsed is the used fraction when the state was decided.
	MemUsed float64
	// Since is when the state last changed.
	Since time.Time
}

// Available is how many slots may take new work: Slots - Withheld.
func (s NodeState) Available() int { return max(s.Slots-s.Withheld, 0) }

// Apply writes the state into the node record the agent registers: Throttled is the slots
// withheld, and an unhealthy node is Unschedulable. The agent ORs in its own reasons (drain)
// after this.
func (s NodeState) Apply(n *cluster.Node) {
	n.Throttled = s.Withheld
	n.Unschedulable = s.Health == cluster.HealthUnhealthy
}

// same reports whether two states advertise the same thing; Reason and MemUsed move with
// every probe and are not a change by themselves.
func (s NodeState) same(o NodeState) bool {
	return s.Health == o.Health && s.Slots == o.Slots && s.Withheld == o.Withheld &&
		s.Script == o.Script && s.KillWorkers == o.KillWorkers
}

// memView is the memory side of a decision.
type memView struct {
	withheld  int
	used      float64
	source    string
	th        Thresholds
	releaseAt time.Time
}

// decide combines the memory throttle and the scripts' latest results. A failing script
// beats everything (the node takes nothing new); otherwise the larger of the memory
// throttle and a warning script's share decides the slots withheld. It leaves Reason empty:
// describe writes it, only when the state changed, so that a steady probe formats no strings.
func decide(slots int, mem memView, scripts []ScriptResult, warnShare float64, killOnError bool) NodeState {
	s := NodeState{Health: cluster.HealthHealthy, Slots: slots, MemUsed: mem.used}
	for _, r := range scripts {
		if r.Status == ScriptError {
			s.Health, s.Withheld = cluster.HealthUnhealthy, slots
			s.Script, s.Output, s.KillWorkers = r.Name, r.Output, killOnError
			return s
		}
	}
	var warn *ScriptResult
	for i := range scripts {
		if scripts[i].Status == ScriptWarn {
			warn = &scripts[i]
			break
		}
	}
	warnWithheld := 0
	if warn != nil && slots > 0 {
		warnWithheld = min(max(int(math.Ceil(float64(slots)*warnShare-1e-9)), 1), slots)
	}
	switch {
	case mem.withheld == 0 && warnWithheld == 0:
	case mem.withheld >= warnWithheld:
		s.Health, s.Withheld = cluster.HealthThrottled, mem.withheld
	default:
		s.Health, s.Withheld = cluster.HealthThrottled, warnWithheld
		s.Script, s.Output = warn.Name, warn.Output
	}
	return s
}

// describe fills in s.Reason from what decide chose.
func describe(s *NodeState, mem memView) {
	switch {
	case s.Health == cluster.HealthUnhealthy:
		s.Reason = fmt.Sprintf("health script %s failed: %s", s.Script, s.Output)
	case s.Health == cluster.HealthThrottled && s.Script != "":
		s.Reason = fmt.Sprintf("health script %s warns: %s", s.Script, s.Output)
	case s.Health == cluster.HealthThrottled:
		s.Reason = memReason(mem)
	default:
		s.Reason = fmt.Sprintf("memory %.1f%% used (%s)", 100*mem.used, mem.source)
	}
}

func memReason(m memView) string {
	switch {
	case m.used >= m.th.Critical:
		return fmt.Sprintf("memory %.1f%% used (%s), at or above critical mark %.0f%%", 100*m.used, m.source, 100*m.th.Critical)
	case m.used >= m.th.High:
		return fmt.Sprintf("memory %.1f%% used (%s), at or above high-water mark %.0f%%", 100*m.used, m.source, 100*m.th.High)
	case !m.releaseAt.IsZero():
		return fmt.Sprintf("memory %.1f%% used (%s), below low-water mark %.0f%%: release after %v hold",
			100*m.used, m.source, 100*m.th.Low, m.th.Hold)
	default:
		return fmt.Sprintf("memory %.1f%% used (%s), holding until below low-water mark %.0f%% for %v",
			100*m.used, m.source, 100*m.th.Low, m.th.Hold)
	}
}
