package cluster

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

func sampleWorker(job string, i int, gen int64, env map[string]string) WorkerAssignment {
	return WorkerAssignment{
		Key: WorkerKey{Job: job, Worker: i}, Generation: gen, Tenant: "search", Workers: 100000,
		Isolation: IsolationProcess, Command: []string{"stormdock", "worker", job}, Env: env,
		Resources: Resources{Memory: 256 << 20, CPU: 500}, Priority: 10, Grace: Duration(10 * time.Second),
		Output: "http://sink:9000/in",
	}
}

func TestAssignmentWireRoundTrip(t *testing.T) {
	env := map[string]string{"A": "1", "B": "2"}
	stop := sampleWorker("old", 3, 1, nil)
	stop.Stop, stop.Grace = true, Duration(time.Second)
	mirrored := sampleWorker("mir", 0, 2, nil)
	mirrored.Key.Link, mirrored.Routers, mirrored.OutputToken, mirrored.Output = "dc-a", []string{"http://r1", "http://r2"}, "tok", ""
	cases := map[string]NodeAssignment{
		"empty":       {Node: "n1", Workers: []WorkerAssignment{}, Session: 7},
		"nil workers": {Node: "n1"},
		"one job": {Node: "n1", DC: "dc-a", Rack: "r1", Session: 0x1234, Prepull: []string{"img@sha256:00"},
			Workers: []WorkerAssignment{sampleWorker("a", 0, 1, env), sampleWorker("a", 1, 1, env), sampleWorker("a", 7, 1, env)}},
		"mixed": {Node: "n2", Workers: []WorkerAssignment{sampleWorker("a", 0, 1, env), sampleWorker("a", 1, 2, env),
			sampleWorker("b", 0, 1, nil), stop, sampleWorker("a", 2, 1, env), mirrored}},
	}
	for name, a := range cases {
		t.Run(name, func(t *testing.T) {
			b, err := json.Marshal(a)
			if err != nil {
				t.Fatal(err)
			}
			var got NodeAssignment
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, a) {
				t.Fatalf("round trip changed the assignment:\n got %+v\nwant %+v\nwire %s", got, a, b)
			}
			again, _ := json.Marshal(got)
			if string(again) != string(b) {
				t.Fatalf("encoding is not stable:\n%s\n%s", b, again)
			}
		})
	}
}

// TestAssignmentWireReadsWholeWorkers: assignments written by masters before the compact
// form (every worker whole) still read.
func TestAssignmentWireReadsWholeWorkers(t *testing.T) {
	type oldAssignment NodeAssignment // no MarshalJSON: the old form
	a := NodeAssignment{Node: "n1", DC: "dc-a", Session: 9, Workers: []WorkerAssignment{sampleWorker("a", 0, 1, nil), sampleWorker("b", 4, 3, nil)}}
	b, err := json.Marshal(oldAssignment(a))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "templates") {
		t.Fatalf("old form has templates: %s", b)
	}
	var got NodeAssignment
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, a) {
		t.Fatalf("got %+v\nwant %+v", got, a)
	}
}

func TestAssignmentWireRejectsBadTemplate(t *testing.T) {
	var a NodeAssignment
	err := json.Unmarshal([]byte(`{"node":"n1","templates":[{"tenant":"x"}],"workers":[{"key":{"job":"a","worker":0},"t":1}]}`), &a)
	if err == nil || !strings.Contains(err.Error(), "template 1 of 1") {
		t.Fatalf("err = %v, want one naming the missing template", err)
	}
}

// TestAssignmentWireProperty: any assignment survives the round trip, and its encoding grows
// with its distinct workers, not with its workers.
func TestAssignmentWireProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		a := NodeAssignment{Node: fmt.Sprintf("n%d", i), Session: r.Int64()}
		for j := range r.IntN(40) {
			job := fmt.Sprintf("j%d", r.IntN(4))
			w := sampleWorker(job, j, int64(1+r.IntN(2)), map[string]string{"X": job})
			if r.IntN(5) == 0 {
				w.Stop = true
			}
			a.Workers = append(a.Workers, w)
		}
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		var got NodeAssignment
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if len(a.Workers) == 0 && got.Workers == nil {
			got.Workers = a.Workers
		}
		if !reflect.DeepEqual(got, a) {
			t.Fatalf("case %d: round trip changed the assignment\n got %+v\nwant %+v", i, got, a)
		}
	}
}

// TestRecordSizes bounds the largest records the store holds: an assignment of a node with
// many workers and a job of the most workers a job may have stay well under ZooKeeper's
// 1 MiB limit on a value (jute.maxbuffer).
func TestRecordSizes(t *testing.T) {
	const limit = 1 << 20
	env := map[string]string{}
	for i := range 64 {
		env[fmt.Sprintf("SETTING_%02d", i)] = strings.Repeat("v", 120) // an 8 KiB environment
	}
	a := NodeAssignment{Node: "node-with-many-workers", DC: "dc-a", Rack: "r1", Session: 1 << 40}
	for i := range 1000 {
		a.Workers = append(a.Workers, sampleWorker("big", i, 1, env))
	}
	for i := range 24 {
		a.Workers = append(a.Workers, sampleWorker(fmt.Sprintf("other-%02d", i%3), i, 1, env))
	}
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	type wholeAssignment NodeAssignment
	whole, _ := json.Marshal(wholeAssignment(a))
	t.Logf("figure: assignment of 1,024 workers of 4 jobs with an 8 KiB environment each: %d bytes (%d written whole)", len(b), len(whole))
	if len(b) > limit/4 {
		t.Errorf("assignment of 1,024 workers is %d bytes, over a quarter of ZooKeeper's 1 MiB limit", len(b))
	}

	spec := JobSpec{Name: "huge", Tenant: "search", Workers: MaxWorkersPerJob, Resources: Resources{Memory: 256 << 20, CPU: 500},
		Command: []string{"stormdock", "worker", "wordcount"}, Env: env,
		Placement: PlacementSpec{Spread: []string{DomainDC, DomainRack}}}
	rec, err := json.Marshal(JobRecord{Spec: spec, Generation: 1, State: JobRunning, Submitted: time.Now(), Updated: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("figure: record of a job of %d workers: %d bytes", MaxWorkersPerJob, len(rec))
	if len(rec) > limit/16 {
		t.Errorf("job record of %d workers is %d bytes", MaxWorkersPerJob, len(rec))
	}
	if err := spec.Validate(); err != nil {
		t.Fatalf("the 8 KiB environment is refused: %v", err)
	}
	spec.Env["HUGE"] = strings.Repeat("x", MaxCommandEnvBytes)
	if err := spec.Validate(); err == nil || !strings.Contains(err.Error(), "command and environment are") {
		t.Fatalf("a %d byte environment: err = %v, want it refused", MaxCommandEnvBytes, err)
	}
}
