package healthcheck

import (
	"errors"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"
)

// Config is the agent's health-check configuration, one field per flag.
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

// DefaultConfig returns the defaults the flags have.
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

// Flags returns the agent's health-check flags with DefaultConfig's values.
func Flags() []cli.Flag {
	d := DefaultConfig()
	const cat = "health checks"
	return []cli.Flag{
		&cli.StringFlag{Name: "health-dir", Category: cat, Value: d.HealthDir,
			Usage: "run every executable in `DIR` as a health script: a line starting ERROR or a non-zero exit makes the node unhealthy, WARN throttles it"},
		&cli.DurationFlag{Name: "health-interval", Category: cat, Value: d.HealthInterval,
			Usage: "memory probe period"},
		&cli.DurationFlag{Name: "health-script-interval", Category: cat, Value: d.ScriptInterval,
			Usage: "how often each health script runs"},
		&cli.DurationFlag{Name: "health-script-timeout", Category: cat, Value: d.ScriptTimeout,
			Usage: "a health script running longer is killed (its whole process group) and fails"},
		&cli.Float64Flag{Name: "mem-high", Category: cat, Value: d.MemHigh,
			Usage: "fraction of node memory in use at which worker slots start to be withheld"},
		&cli.Float64Flag{Name: "mem-low", Category: cat, Value: d.MemLow,
			Usage: "withheld slots come back once memory use stayed below this fraction for --throttle-hold"},
		&cli.Float64Flag{Name: "mem-critical", Category: cat, Value: d.MemCritical,
			Usage: "fraction of node memory at which every slot is withheld and workers are evicted, lowest priority first"},
		&cli.DurationFlag{Name: "throttle-hold", Category: cat, Value: d.ThrottleHold,
			Usage: "how long memory must stay below --mem-low before withheld slots come back"},
		&cli.StringFlag{Name: "cgroup-parent", Category: cat, Value: d.CgroupParent,
			Usage: "cgroup `PATH` holding the workers' cgroups; a memory limit on it counts as the node's memory; inside a cgroup delegated to the agent's user (systemd Delegate=yes) no root is needed"},
		&cli.DurationFlag{Name: "evict-cooldown", Category: cat, Value: d.EvictCooldown,
			Usage: "wait after each eviction before probing memory again"},
		&cli.Float64Flag{Name: "health-warn-withhold", Category: cat, Value: d.WarnWithhold,
			Usage: "fraction of slots withheld while a health script warns"},
		&cli.BoolFlag{Name: "health-kill-workers", Category: cat, Value: d.KillWorkersOnUnhealthy,
			Usage: "stop running workers when a health script fails the node (default: keep them, take no new ones)"},
	}
}

// LocalFlags are the health-check flags of a local cluster (`stormdock up`): applied to
// every node, whose cgroup parent the cluster chooses itself.
func LocalFlags() []cli.Flag {
	var out []cli.Flag
	for _, f := range Flags() {
		switch f.Names()[0] {
		case "health-dir", "health-interval", "health-script-interval", "health-script-timeout",
			"mem-high", "mem-low", "mem-critical", "throttle-hold":
			out = append(out, f)
		}
	}
	return out
}

// ConfigFromCLI reads the values of the command's health-check flags (Flags, or a subset
// of them such as LocalFlags: the others keep DefaultConfig's values) and validates them.
func ConfigFromCLI(c *cli.Context) (Config, error) {
	if c == nil {
		return Config{}, errors.New("healthcheck: no command-line context")
	}
	defined := map[string]bool{}
	if c.Command != nil {
		for _, f := range c.Command.Flags {
			for _, n := range f.Names() {
				defined[n] = true
			}
		}
	}
	cfg := DefaultConfig()
	str := func(name string, v *string) {
		if defined[name] {
			*v = c.String(name)
		}
	}
	dur := func(name string, v *time.Duration) {
		if defined[name] {
			*v = c.Duration(name)
		}
	}
	frac := func(name string, v *float64) {
		if defined[name] {
			*v = c.Float64(name)
		}
	}
	str("health-dir", &cfg.HealthDir)
	dur("health-interval", &cfg.HealthInterval)
	dur("health-script-interval", &cfg.ScriptInterval)
	dur("health-script-timeout", &cfg.ScriptTimeout)
	frac("mem-high", &cfg.MemHigh)
	frac("mem-low", &cfg.MemLow)
	frac("mem-critical", &cfg.MemCritical)
	dur("throttle-hold", &cfg.ThrottleHold)
	str("cgroup-parent", &cfg.CgroupParent)
	dur("evict-cooldown", &cfg.EvictCooldown)
	frac("health-warn-withhold", &cfg.WarnWithhold)
	if defined["health-kill-workers"] {
		cfg.KillWorkersOnUnhealthy = c.Bool("health-kill-workers")
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}
