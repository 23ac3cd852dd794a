package monitoring

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/stormdock/stormdock/internal/testenv"
)

// TestRulesParse runs promtool (Debian's prometheus package; scripts/test installs it) on
// the rules file.
func TestRulesParse(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		testenv.Missing(t, "promtool: %v (apt-get install prometheus)", err)
	}
	out, err := exec.Command(promtool, "check", "rules", "alerts.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
	// And a broken file fails, so that the check above means something.
	bad := filepath.Join(t.TempDir(), "bad.yml")
	if err := os.WriteFile(bad, []byte("groups:\n  - name: x\n    rules:\n      - alert: X\n        expr: sum(\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", bad).CombinedOutput(); err == nil {
		t.Fatalf("promtool accepted a broken expression:\n%s", out)
	}
}

// TestPrometheusConfig: the example configuration passes promtool (with its files made in a
// temporary directory: promtool opens them) and every scrape sends the scrape token from a
// file, keeping the series' own job label.
func TestPrometheusConfig(t *testing.T) {
	src, err := os.ReadFile("prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			HonorLabels   bool   `yaml:"honor_labels"`
			Authorization struct {
				Type            string `yaml:"type"`
				CredentialsFile string `yaml:"credentials_file"`
			} `yaml:"authorization"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(src, &cfg); err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	if len(cfg.ScrapeConfigs) != 3 {
		t.Errorf("want scrapes of masters, agents and routers, got %d", len(cfg.ScrapeConfigs))
	}
	for _, sc := range cfg.ScrapeConfigs {
		if sc.Authorization.Type != "Bearer" || filepath.Base(sc.Authorization.CredentialsFile) != "metrics.token" || !sc.HonorLabels {
			t.Errorf("scrape %s: authorization %+v, honor_labels %v: want the Bearer scrape token from metrics.token, and honor_labels", sc.JobName, sc.Authorization, sc.HonorLabels)
		}
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		testenv.Missing(t, "promtool: %v (apt-get install prometheus)", err)
	}
	dir := t.TempDir()
	for name, body := range map[string]string{"metrics.token": "sdt_example\n", "ca.crt": "", "routers.json": "[]\n", "alerts.yml": string(Rules)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	conf := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(conf, []byte(strings.ReplaceAll(string(src), "/etc/prometheus/stormdock/", dir+"/")), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "check", "config", conf).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
}

// TestDashboard checks the dashboard is a Grafana model whose panels all query Prometheus.
func TestDashboard(t *testing.T) {
	var d struct {
		Title  string `json:"title"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(Dashboard, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	graphs := 0
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		graphs++
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if !metricName.MatchString(tg.Expr) {
				t.Errorf("panel %q queries no stormdock metric: %q", p.Title, tg.Expr)
			}
		}
	}
	if graphs < 20 {
		t.Errorf("%d panels", graphs)
	}
}

func TestMetricNames(t *testing.T) {
	names := MetricNames()
	for _, want := range []string{"stormdock_master_leader", "stormdock_router_link_lag", "stormdock_master_reconcile_duration_seconds", "stormdock_agent_health_state"} {
		found := false
		for _, n := range names {
			found = found || n == want
		}
		if !found {
			t.Errorf("MetricNames lacks %s: %v", want, names)
		}
	}
}
