package daemons

import (
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/healthcheck"
)

// parseHealthFlags runs a tiny cli app with healthFlags() and returns what healthConfig made
// of args.
func parseHealthFlags(t *testing.T, args ...string) (healthcheck.Config, error) {
	t.Helper()
	var cfg healthcheck.Config
	var cfgErr error
	app := &cli.App{Name: "agent", Flags: healthFlags(), Action: func(c *cli.Context) error {
		cfg, cfgErr = healthConfig(c)
		return nil
	}}
	if err := app.Run(append([]string{"agent"}, args...)); err != nil {
		t.Fatalf("app.Run: %v", err)
	}
	return cfg, cfgErr
}

func TestHealthFlagsDefaults(t *testing.T) {
	cfg, err := parseHealthFlags(t)
	if err != nil {
		t.Fatal(err)
	}
	if cfg != healthcheck.DefaultConfig() {
		t.Errorf("defaults from flags %+v\nwant %+v", cfg, healthcheck.DefaultConfig())
	}
	if cfg.HealthInterval > 250*time.Millisecond {
		t.Errorf("default probe interval %v is too slow for the 1 s goal", cfg.HealthInterval)
	}
}

func TestHealthFlagsParse(t *testing.T) {
	cfg, err := parseHealthFlags(t, "--health-dir", "/etc/stormdock/health", "--health-interval", "100ms",
		"--mem-high", "0.8", "--mem-low", "0.6", "--mem-critical", "0.9", "--throttle-hold", "1m",
		"--cgroup-parent", "/stormdock-node1", "--health-kill-workers", "--health-script-timeout", "2s")
	if err != nil {
		t.Fatal(err)
	}
	want := healthcheck.DefaultConfig()
	want.HealthDir, want.HealthInterval = "/etc/stormdock/health", 100*time.Millisecond
	want.MemHigh, want.MemLow, want.MemCritical, want.ThrottleHold = 0.8, 0.6, 0.9, time.Minute
	want.CgroupParent, want.KillWorkersOnUnhealthy, want.ScriptTimeout = "/stormdock-node1", true, 2*time.Second
	if cfg != want {
		t.Errorf("got %+v\nwant %+v", cfg, want)
	}
}

func TestHealthFlagsValidate(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--mem-low", "0.9"}, "--mem-low 0.9 must be below --mem-high 0.85"},
		{[]string{"--mem-low", "0"}, "--mem-low 0 must be above 0"},
		{[]string{"--mem-high", "0.96"}, "--mem-high 0.96 must be below --mem-critical 0.95"},
		{[]string{"--mem-critical", "1.2"}, "--mem-critical 1.2 must be at most 1"},
		{[]string{"--throttle-hold", "-1s"}, "--throttle-hold -1s must not be negative"},
		{[]string{"--health-interval", "0s"}, "--health-interval 0s must be at least 1ms"},
		{[]string{"--health-script-timeout", "0s"}, "--health-script-timeout 0s must be positive"},
		{[]string{"--health-warn-withhold", "0"}, "--health-warn-withhold 0 must be in (0, 1]"},
	} {
		_, err := parseHealthFlags(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: err %v, want one line containing %q", tc.args, err, tc.want)
		}
	}
	if cfg := healthcheck.DefaultConfig(); cfg.Validate() != nil {
		t.Errorf("defaults invalid: %v", cfg.Validate())
	}
}
