package healthcheck

import (
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

// parseFlags runs a tiny cli app with Flags() and returns what ConfigFromCLI made of args.
func parseFlags(t *testing.T, args ...string) (Config, error) {
	t.Helper()
	var cfg Config
	var cfgErr error
	app := &cli.App{Name: "agent", Flags: Flags(), Action: func(c *cli.Context) error {
		cfg, cfgErr = ConfigFromCLI(c)
		return nil
	}}
	if err := app.Run(append([]string{"agent"}, args...)); err != nil {
		t.Fatalf("app.Run: %v", err)
	}
	return cfg, cfgErr
}

func TestFlagsDefaults(t *testing.T) {
	cfg, err := parseFlags(t)
	if err != nil {
		t.Fatal(err)
	}
	if cfg != DefaultConfig() {
		t.Errorf("defaults from flags %+v\nwant %+v", cfg, DefaultConfig())
	}
	if cfg.HealthInterval > 250*time.Millisecond {
		t.Errorf("default probe interval %v is too slow for the 1 s goal", cfg.HealthInterval)
	}
}

func TestFlagsParse(t *testing.T) {
	cfg, err := parseFlags(t, "--health-dir", "/etc/stormdock/health", "--health-interval", "100ms",
		"--mem-high", "0.8", "--mem-low", "0.6", "--mem-critical", "0.9", "--throttle-hold", "1m",
		"--cgroup-parent", "/stormdock-node1", "--health-kill-workers", "--health-script-timeout", "2s")
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.HealthDir, want.HealthInterval = "/etc/stormdock/health", 100*time.Millisecond
	want.MemHigh, want.MemLow, want.MemCritical, want.ThrottleHold = 0.8, 0.6, 0.9, time.Minute
	want.CgroupParent, want.KillWorkersOnUnhealthy, want.ScriptTimeout = "/stormdock-node1", true, 2*time.Second
	if cfg != want {
		t.Errorf("got %+v\nwant %+v", cfg, want)
	}
}

func TestFlagsValidate(t *testing.T) {
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
		_, err := parseFlags(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: err %v, want one line containing %q", tc.args, err, tc.want)
		}
	}
	if cfg := DefaultConfig(); cfg.Validate() != nil {
		t.Errorf("defaults invalid: %v", cfg.Validate())
	}
}
