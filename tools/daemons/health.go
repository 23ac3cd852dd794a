package daemons

import (
	"errors"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/healthcheck"
)

// healthFlags returns the agent's health-check flags (package healthcheck's Config) with
// healthcheck.DefaultConfig's values.
func healthFlags() []cli.Flag {
	d := healthcheck.DefaultConfig()
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

// localHealthFlags are the health-check flags of a local cluster (`stormdock up`): applied
// to every node, whose cgroup parent the cluster chooses itself.
func localHealthFlags() []cli.Flag {
	var out []cli.Flag
	for _, f := range healthFlags() {
		switch f.Names()[0] {
		case "health-dir", "health-interval", "health-script-interval", "health-script-timeout",
			"mem-high", "mem-low", "mem-critical", "throttle-hold":
			out = append(out, f)
		}
	}
	return out
}

// healthConfig reads the values of the command's health-check flags (healthFlags, or a
// subset of them such as localHealthFlags: the others keep healthcheck.DefaultConfig's
// values) and validates them.
func healthConfig(c *cli.Context) (healthcheck.Config, error) {
	if c == nil {
		return healthcheck.Config{}, errors.New("healthcheck: no command-line context")
	}
	defined := map[string]bool{}
	if c.Command != nil {
		for _, f := range c.Command.Flags {
			for _, n := range f.Names() {
				defined[n] = true
			}
		}
	}
	cfg := healthcheck.DefaultConfig()
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
		return healthcheck.Config{}, err
	}
	return cfg, nil
}
