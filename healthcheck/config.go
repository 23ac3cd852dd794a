package healthcheck

import (
	"fmt"
	"time"
)

// Config is the agent's health-check configuration. The command line fills it, one flag
// per field (the flags are declared by the CLI, in tools/daemons, not here).
type Config struct {
	// HealthDir holds the health scripts (--health-dir); empty runs none.
	HealthDir string
	// HealthInterval is the memory probe period (--health-interval). It bounds how late a
	// crossing of the high mark is seen, so it is short; a probe costs microseconds.
	HealthInterval time.Duration
	// ScriptInterval and ScriptTimeout: how often each health script runs and how long it
	// may take before its process group is killed.
	ScriptInterval time.Duration
	ScriptTimeout  time.Duration
	// MemHigh, MemLow, MemCritical, ThrottleHold: see Thresholds.
	MemHigh      float64
	MemLow       float64
	MemCritical  float64
	ThrottleHold time.Duration
	// CgroupParent is the cgroup holding the workers' cgroups (--cgroup-parent); a memory
	// limit on it counts as the node's memory. It must be the isolation driver's parent.
	CgroupParent string
	// EvictCooldown is the wait after each eviction before probing again.
	EvictCooldown time.Duration
	// WarnWithhold is the share of slots a WARN line from a script withholds.
	WarnWithhold float64
	// KillWorkersOnUnhealthy asks the agent to stop running workers when a script fails the
	// node. Off by default: a broken health script should not take the jobs down with it.
	KillWorkersOnUnhealthy bool
}

// DefaultConfig returns the defaults, which are the flags' defaults too.
func DefaultConfig() Config {
	return Config{
		HealthInterval: 250 * time.Millisecond,
		ScriptInterval: 10 * time.Second,
		ScriptTimeout:  5 * time.Second,
		MemHigh:        0.85,
		MemLow:         0.75,
		MemCritical:    0.95,
		ThrottleHold:   30 * time.Second,
		CgroupParent:   "/stormdock",
		EvictCooldown:  time.Second,
		WarnWithhold:   0.5,
	}
}

// Thresholds returns the memory marks of the configuration.
func (c Config) Thresholds() Thresholds {
	return Thresholds{High: c.MemHigh, Low: c.MemLow, Critical: c.MemCritical, Hold: c.ThrottleHold}
}

// Validate reports the first problem in one line naming the flag.
func (c Config) Validate() error {
	if err := c.Thresholds().Validate(); err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	switch {
	case c.HealthInterval < time.Millisecond:
		return fmt.Errorf("healthcheck: --health-interval %v must be at least 1ms", c.HealthInterval)
	case c.ScriptInterval <= 0:
		return fmt.Errorf("healthcheck: --health-script-interval %v must be positive", c.ScriptInterval)
	case c.ScriptTimeout <= 0:
		return fmt.Errorf("healthcheck: --health-script-timeout %v must be positive", c.ScriptTimeout)
	case c.EvictCooldown < 0:
		return fmt.Errorf("healthcheck: --evict-cooldown %v must not be negative", c.EvictCooldown)
	case !(c.WarnWithhold > 0 && c.WarnWithhold <= 1):
		return fmt.Errorf("healthcheck: --health-warn-withhold %v must be in (0, 1]", c.WarnWithhold)
	}
	return nil
}
