package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseJobSpecValid(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "wordcount.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	j, err := ParseJobSpec(data)
	if err != nil {
		t.Fatalf("ParseJobSpec: %v", err)
	}
	want := &JobSpec{
		Name: "wordcount", Tenant: "search", Workers: 8,
		Resources: Resources{Memory: 256 << 20, CPU: 500},
		Isolation: "process",
		Command:   []string{"stormdock", "worker", "wordcount"},
		Placement: PlacementSpec{Spread: []string{"dc", "rack"}, MaxPerNode: 2, DCs: []string{"dc-a", "dc-b"},
			NodeLabels: map[string]string{"disk": "ssd"}},
		Priority: 100,
	}
	if !reflect.DeepEqual(j, want) {
		t.Errorf("got %+v\nwant %+v", j, want)
	}
}

func TestParseJobSpecJSON(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "mirrored.json"))
	if err != nil {
		t.Fatal(err)
	}
	j, err := ParseJobSpec(data)
	if err != nil {
		t.Fatalf("ParseJobSpec: %v", err)
	}
	if j.Resources.CPU != 500 || j.Grace() != 5*time.Second || j.TotalWorkers() != 4 || !j.Mirrored() {
		t.Errorf("unexpected %+v", j)
	}
	keys := j.Keys()
	if len(keys) != 4 || keys[2] != (WorkerKey{Job: "mirror", Link: "dc-b", Worker: 0}) {
		t.Errorf("keys = %v", keys)
	}
}

func TestParseJobSpecProblems(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "bad.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = ParseJobSpec(data)
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("want *ValidationError, got %v", err)
	}
	got := map[string]string{}
	for _, p := range ve.Problems {
		got[p.Path] = p.String()
	}
	for path, want := range map[string]string{
		"name":                "(line 1)",
		"workers":             "workers: must be at least 1 (line 3)",
		"resources.memory":    "(line 5)",
		"isolation":           "isolation: must be process or docker, not \"vm\" (line 7)",
		"placement.spread[1]": "(line 10)",
		"placement.colour":    "placement.colour: unknown field (line 11)",
		"links":               "(line 12)",
		"output":              "output: is required",
	} {
		if !strings.Contains(got[path], want) {
			t.Errorf("problem for %s = %q, want it to contain %q", path, got[path], want)
		}
	}
	if len(ve.Problems) != 8 {
		t.Errorf("got %d problems, want 8: %v", len(ve.Problems), ve)
	}
}

func TestDecodeTable(t *testing.T) {
	base := "name: a\ntenant: t\nworkers: 1\nresources: {memory: 64Mi, cpu: 1}\ncommand: [x]\n"
	tests := []struct {
		name, yaml, want string
	}{
		{"empty", "", "the document is empty"},
		{"syntax", "name: [a\n", "line"},
		// The decoder's parser names the line before: the unclosed { is on line 2, the
		// key indented one space too few on line 4.
		{"unclosed flow mapping", "name: a\nresources: {memory: 64Mi\ntenant: t\n", "did not find expected ',' or '}' (line 2)"},
		{"misplaced key", "name: a\nresources:\n  memory: 64Mi\n cpu: 1\n", "did not find expected key (line 4)"},
		{"scanner's own line", "name: a\n tenant: t\n", "mapping values are not allowed in this context (line 2)"},
		{"wrong type", strings.Replace(base, "workers: 1", "workers: many", 1), "workers: must be a whole number, not str \"many\" (line 3)"},
		{"flow mapping column", strings.Replace(base, "cpu: 1", "cpu: fast", 1), "resources.cpu: cpu quantity \"fast\""},
		{"docker needs image", base + "isolation: docker\n", "image: is required for docker isolation"},
		{"stormdock env", base + "env: {STORMDOCK_JOB: x}\n", "env.STORMDOCK_JOB: STORMDOCK_ and _STORMDOCK_ variables are set by stormdock itself (line 6)"},
		{"driver env", base + "env: {_STORMDOCK_ISOLATION_USER: \"0:0:\"}\n", "env._STORMDOCK_ISOLATION_USER: STORMDOCK_ and _STORMDOCK_ variables are set by stormdock itself (line 6)"},
		{"link not in dcs", base + "placement: {dcs: [a, b]}\nlinks: [a, c]\noutput: file:///x\n", "links[1]: \"c\" is not in placement.dcs (line 7)"},
		{"bad output", base + "output: ftp://x\n", "output: must be a file://, http(s)://, postgres:// or nats:// URL"},
		{"grace", base + "gracePeriod: soon\n", "gracePeriod: must be a duration like 30s or 1m (line 6)"},
		{"priority", base + "priority: 5000\n", "priority: must be between 0 and 1000 (line 6)"},
		{"secret name", base + "secrets: [db, ../etc]\n", "secrets[1]: secret name \"../etc\" must be 1-63 letters, digits, '_', '-' or '.', starting with a letter or digit (line 6)"},
		{"secret twice", base + "secrets: [db, db]\n", "secrets[1]: \"db\" is listed twice"},
		{"secret dot", base + "secrets: [.hidden]\n", "secrets[0]: secret name \".hidden\" must be"},
		{"output secret unmirrored", base + "outputSecret: sinkpass\n", "outputSecret: goes with a mirrored job's output"},
		{"output secret name", base + "links: [a, b]\noutput: file:///x\noutputSecret: a/b\n", "outputSecret: secret name \"a/b\" must be"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseJobSpec([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestParseInventory(t *testing.T) {
	good := `{"nodes":[{"id":"n1","dc":"dc-a","rack":"r1","slots":16,"memory":"64Gi","cpu":32,"labels":{"disk":"ssd"},"used":{"slots":1,"memory":"256Mi","cpu":0.5}}]}`
	inv, err := ParseInventory([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	n := inv.Nodes[0]
	if n.Memory != 64<<30 || n.CPU != 32000 || n.Used.Memory != 256<<20 || n.Used.CPU != 500 || n.Labels["disk"] != "ssd" {
		t.Errorf("unexpected node %+v", n)
	}
	bad := `{"nodes":[{"id":"n1","dc":"a","rack":"r","slots":1},{"id":"n1","rack":"r","slots":-1,"extra":1}]}`
	_, err = ParseInventory([]byte(bad))
	for _, want := range []string{"nodes[1].id: \"n1\" is already used by nodes[0]", "nodes[1].dc: is required", "nodes[1].slots: must not be negative", "nodes[1].extra: unknown field"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want it to contain %q", err, want)
		}
	}
}

// TestFormatJobSpecRoundTrips: the YAML the console's editor starts from reads back to the
// same spec, for every valid spec in testdata, and is YAML an operator would write (no
// empty fields).
func TestFormatJobSpecRoundTrips(t *testing.T) {
	for _, name := range []string{"wordcount.yaml", "mirrored.json", "update.yaml"} {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", name))
			if err != nil {
				t.Fatal(err)
			}
			spec, err := ParseJobSpec(data)
			if err != nil {
				t.Fatal(err)
			}
			out, err := FormatJobSpec(*spec)
			if err != nil {
				t.Fatal(err)
			}
			again, err := ParseJobSpec(out)
			if err != nil {
				t.Fatalf("the formatted spec does not parse: %v\n%s", err, out)
			}
			if !reflect.DeepEqual(spec, again) {
				t.Errorf("round trip changed the spec\n got %+v\nwant %+v\n%s", again, spec, out)
			}
			// The JSON of a job record's spec (the editor's other start) reads back too.
			js, err := json.Marshal(spec)
			if err != nil {
				t.Fatal(err)
			}
			if again, err := ParseJobSpec(js); err != nil || !reflect.DeepEqual(spec, again) {
				t.Errorf("the spec's JSON reads back as %+v, %v\n%s", again, err, js)
			}
			for _, empty := range []string{": \"\"", ": []", ": {}", ": 0\n", "null"} {
				if strings.Contains(string(out), empty) {
					t.Errorf("formatted spec holds %q:\n%s", empty, out)
				}
			}
		})
	}
}

// TestLocateProblemsFoundAfterDecoding: problems found by checks after decoding (an
// update's, against the running job) get their fields' lines.
func TestLocateProblemsFoundAfterDecoding(t *testing.T) {
	data := []byte("name: wc\ntenant: search\nworkers: 2\nlinks:\n  - dc-a\n  - dc-b\nresources: {memory: 64Mi, cpu: 0.1}\n")
	err := error(&ValidationError{What: "update", Problems: []FieldError{
		{Path: "tenant", Msg: "cannot change"}, {Path: "links[1]", Msg: "cannot change"}, {Path: "resources.memory", Msg: "x"},
		{Path: "placement.dcs", Msg: "not in the source"}, {Msg: "no path"}}})
	Locate(data, &JobSpec{}, fmt.Errorf("wrapped: %w", err))
	var got []int
	for _, p := range err.(*ValidationError).Problems {
		got = append(got, p.Line)
	}
	if want := []int{2, 6, 7, 0, 0}; !reflect.DeepEqual(got, want) {
		t.Errorf("lines %v, want %v", got, want)
	}
	Locate([]byte(":::"), &JobSpec{}, err)    // not YAML: nothing happens
	Locate(data, &JobSpec{}, errors.New("x")) // not a validation error
}
