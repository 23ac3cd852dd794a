package placement_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/placement"
)

// The parsers must never panic, and what they accept must survive a trip through JSON:
// parse, write JSON, parse that, write JSON again gives the same bytes.
// Run longer with: go test -fuzz FuzzParseInventory ./placement/ (and the others).

func seed(f *testing.F, names ...string) {
	for _, name := range names {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
}

func roundTrip[T any](t *testing.T, v *T, parse func([]byte) (*T, error)) {
	first, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("accepted input does not marshal: %v", err)
	}
	again, err := parse(first)
	if err != nil {
		t.Fatalf("own JSON %s rejected: %v", first, err)
	}
	second, err := json.Marshal(again)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, second) {
		t.Fatalf("JSON round trip changed\n%s\n%s", first, second)
	}
}

func FuzzParseInventory(f *testing.F) {
	seed(f, "cluster.json")
	f.Add([]byte("nodes:\n- {id: n, dc: d, rack: r, slots: 2, memory: 1.5Gi, cpu: 500m}\n"))
	f.Add([]byte(`{"nodes":[{"id":"n","dc":"d","rack":"r","slots":1,"memory":1048576,"cpu":"2"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		inv, err := cluster.ParseInventory(data)
		if err != nil {
			return
		}
		roundTrip(t, inv, cluster.ParseInventory)
	})
}

func FuzzParseJobSpec(f *testing.F) {
	seed(f, "wordcount.yaml", "mirror.yaml", "gold.json")
	f.Add([]byte("name: a\ntenant: t\nworkers: 1\nresources: {memory: 4Mi, cpu: 1m}\ncommand: [x]\ngracePeriod: 1m30s\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		j, err := cluster.ParseJobSpec(data)
		if err != nil {
			return
		}
		roundTrip(t, j, cluster.ParseJobSpec)
	})
}

// FuzzPlan feeds whatever the parsers accept to the planner, which must not panic and
// must keep its invariants.
func FuzzPlan(f *testing.F) {
	clusterJSON, _ := os.ReadFile(filepath.Join("testdata", "cluster.json"))
	for _, name := range []string{"wordcount.yaml", "mirror.yaml", "gold.json"} {
		data, _ := os.ReadFile(filepath.Join("testdata", name))
		f.Add(clusterJSON, data)
	}
	f.Fuzz(func(t *testing.T, clusterData, jobData []byte) {
		inv, err := cluster.ParseInventory(clusterData)
		if err != nil || len(inv.Nodes) > 64 {
			return
		}
		j, err := cluster.ParseJobSpec(jobData)
		if err != nil || j.TotalWorkers() > 256 {
			return
		}
		in := placement.Input{Nodes: inv.Nodes, Jobs: []cluster.JobSpec{*j}}
		verify(t, in, plan(t, in), true)
	})
}
