package tools

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/tools/bench"
	"github.com/stormdock/stormdock/tools/commands/plan"
)

var fixtures = filepath.Join("..", "placement", "testdata")

// runCmd runs one of the commands this file tests (plan, bench) as the binary would and
// returns its output and exit code.
func runCmd(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	app := &cli.App{Name: "stormdock", Writer: &out, ErrWriter: &out,
		Commands: []*cli.Command{plan.Command, bench.Command}, ExitErrHandler: func(*cli.Context, error) {}}
	err := app.Run(append([]string{"stormdock"}, args...))
	code := 0
	var ec cli.ExitCoder
	switch {
	case errors.As(err, &ec):
		code = ec.ExitCode()
		out.WriteString(err.Error())
	case err != nil:
		t.Fatalf("run %v: %v", args, err)
	}
	return out.String(), code
}

func fixture(name string) string { return filepath.Join(fixtures, name) }

func planArgs(format string) []string {
	return []string{"plan", "--cluster", fixture("cluster.json"), "--job", fixture("wordcount.yaml"),
		"--job", fixture("mirror.yaml"), "--job", fixture("gold.json"), "--current", fixture("current.json"), "-o", format}
}

// The JSON output is the documented example in testdata/plan.json.
func TestPlanJSON(t *testing.T) {
	got, code := runCmd(t, planArgs("json")...)
	want, err := os.ReadFile(fixture("plan.json"))
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 || got != string(want) {
		t.Errorf("exit %d, output\n%s\nwant (testdata/plan.json)\n%s", code, got, want)
	}
}

func TestPlanTable(t *testing.T) {
	got, code := runCmd(t, planArgs("table")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, got)
	}
	for _, want := range []string{"20 placed, 2 unplaced, 4 moves", "UNPLACED", "gold        8-9      0 of 8 nodes fit:",
		"wordcount        1       b3    b1  node draining", "retired          0       a2    -   job removed"} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	for _, line := range strings.Split(got, "\n") {
		if len(line) > plan.Width {
			t.Errorf("line longer than %d: %q", plan.Width, line)
		}
	}
}

func TestPlanInvalidInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	badJob := write("bad.yaml", "name: Bad\ntenant: t\nworkers: 0\nresources: {memory: 1Gi, cpu: 1}\ncommand: [x]\n")
	badCluster := write("c.json", `{"nodes":[{"id":"n1","dc":"a","rack":"r","slots":-1}]}`)
	badCur := write("cur.json", `{"placements":[{"job":"x","worker":0,"node":"a"},{"job":"x","worker":0,"node":"b"}]}`)
	got, code := runCmd(t, "plan", "--cluster", badCluster, "--job", badJob, "--job", fixture("wordcount.yaml"),
		"--job", fixture("wordcount.yaml"), "--job", filepath.Join(dir, "none.yaml"), "--current", badCur)
	if code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	lines := strings.Split(strings.TrimSpace(got), "\n")
	wants := []string{
		"c.json: nodes[0].slots: must not be negative (line 1)",
		"bad.yaml: name: \"Bad\" must be",
		"bad.yaml: workers: must be at least 1 (line 3)",
		"job \"wordcount\" is already defined in",
		"none.yaml: no such file",
		"cur.json: placements[1]: worker x/0 placed twice",
	}
	if len(lines) != len(wants) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(wants), got)
	}
	for i, want := range wants {
		if !strings.HasPrefix(lines[i], "stormdock plan: ") || !strings.Contains(lines[i], want) {
			t.Errorf("line %d = %q, want it to contain %q", i, lines[i], want)
		}
	}
	for _, args := range [][]string{
		{"plan", "--cluster", fixture("cluster.json")},
		{"plan", "--cluster", fixture("cluster.json"), "--job", fixture("wordcount.yaml"), "stray"},
		{"plan", "--cluster", fixture("cluster.json"), "--job", fixture("wordcount.yaml"), "-o", "yaml"},
	} {
		if got, code := runCmd(t, args...); code != 2 || strings.Count(strings.TrimSpace(got), "\n") != 0 {
			t.Errorf("%v: exit %d, output %q; want exit 2 and one line", args, code, got)
		}
	}
}

func TestBenchPlacementSmall(t *testing.T) {
	got, code := runCmd(t, "bench", "placement", "--nodes", "200", "--jobs", "20", "--workers", "500",
		"--dcs", "2", "--racks", "4", "--runs", "1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, got)
	}
	for _, want := range []string{"200 nodes (2 dcs x 4 racks x 25 nodes", "full plan:", "placed 500, unplaced 0, moves 0, max skew",
		"placements/s", "peak heap", "moves of other workers: 0"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if _, code := runCmd(t, "bench", "placement", "--nodes", "0"); code != 2 {
		t.Errorf("--nodes 0: exit %d, want 2", code)
	}
}
