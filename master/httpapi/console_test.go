package httpapi_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master/desired"
)

// The console edits a job's spec as YAML and checks it with a dry run before it sends it:
// these are the routes it uses, and what they answer for bad input.

// TestSpecEditDryRunAndProblems: GET .../spec gives YAML that reads back to the job's
// spec; a dry run of an edited spec answers the changes and stores nothing (the store
// compared, no event); a spec with errors answers every problem with its field and line
// and changes nothing; the real update then makes the generation the dry run described,
// and the earlier generation's spec stays readable.
func TestSpecEditDryRunAndProblems(t *testing.T) {
	f := newAPIFixture(t)
	call := func(method, target, token string, body any) (int, []byte) {
		t.Helper()
		var b []byte
		if body != nil {
			b, _ = json.Marshal(body)
		}
		status, out, _ := f.raw(t, method, target, token, b)
		return status, []byte(out)
	}
	status, body := call("GET", "/v1/jobs/demo-job/spec", f.admin, nil)
	var text api.JobSpecText
	if status != http.StatusOK || json.Unmarshal(body, &text) != nil || text.Generation != 1 {
		t.Fatalf("GET spec: %d %s", status, body)
	}
	spec, err := cluster.ParseJobSpec([]byte(text.Spec))
	if err != nil {
		t.Fatalf("the spec as served does not parse: %v\n%s", err, text.Spec)
	}
	rec, _, err := desired.ReadJob(f.tc.Ctx, f.tc.Admin, "demo-job")
	if err != nil || !slices.Equal(spec.Command, rec.Spec.Command) || spec.Workers != rec.Spec.Workers || spec.Resources != rec.Spec.Resources {
		t.Fatalf("served spec %+v; stored %+v (%v)", spec, rec.Spec, err)
	}
	if status, body := call("GET", "/v1/jobs/demo-job/spec", f.tokens["other"], nil); status != http.StatusForbidden && status != http.StatusNotFound {
		t.Errorf("tenant other reads demo's spec: %d %s", status, body)
	}

	edited := strings.Replace(text.Spec, "'1000'", "'2000'", 1)
	edited = strings.Replace(edited, "- \"1000\"", "- \"2000\"", 1)
	if edited == text.Spec {
		t.Fatalf("cannot find the command's argument in\n%s", text.Spec)
	}
	edited += "env:\n  MODE: fast\n"
	before := f.settled(t)
	evsBefore, _ := f.m.Events().Query(api.EventFilter{Kinds: []string{api.EventAPICall}}, 0)
	status, body = call("POST", "/v1/jobs/demo-job/update", f.admin, api.UpdateRequest{Spec: edited, DryRun: true})
	var dry api.UpdateReply
	if status != http.StatusOK || json.Unmarshal(body, &dry) != nil {
		t.Fatalf("dry run: %d %s", status, body)
	}
	var fields []string
	for _, c := range dry.Changes {
		fields = append(fields, fmt.Sprintf("%s: %q -> %q", c.Field, c.From, c.To))
	}
	want := []string{`command[1]: "1000" -> "2000"`, `env.MODE: "" -> "fast"`}
	if !dry.DryRun || !dry.Changed || dry.Job.Generation != 2 || !slices.Equal(fields, want) {
		t.Errorf("dry run answered dryRun %v, changed %v, generation %d, changes %q; want %q", dry.DryRun, dry.Changed, dry.Job.Generation, fields, want)
	}

	// Bad specs: every problem with its field and line; the tenant checked against the
	// running job is located too.
	bad := []struct {
		name, spec string
		problems   []api.Problem
	}{
		{"decoder", "name: demo-job\ntenant: demo\nworkers: zero\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [sleep, '1']\ncolour: red\n",
			[]api.Problem{{Field: "workers", Line: 3, Msg: `must be a whole number, not str "zero"`}, {Field: "colour", Line: 6, Msg: "unknown field"}}},
		{"against the job", "name: demo-job\ntenant: other\nworkers: 2\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [sleep, '1']\n",
			[]api.Problem{{Field: "tenant", Line: 2, Msg: "a job cannot move to another tenant (demo -> other): submit it there under a new name"}}},
		{"syntax", "name: demo-job\ntenant: [demo\n", []api.Problem{{Line: 2, Msg: "did not find expected ',' or ']'"}}},
	}
	for _, b := range bad {
		for _, dryRun := range []bool{true, false} {
			status, body := call("POST", "/v1/jobs/demo-job/update", f.admin, api.UpdateRequest{Spec: b.spec, DryRun: dryRun})
			var eb api.ErrorBody
			if status != http.StatusBadRequest || json.Unmarshal(body, &eb) != nil || eb.Code != "bad_input" {
				t.Errorf("%s (dry run %v): %d %s; want 400 bad_input", b.name, dryRun, status, body)
				continue
			}
			if !slices.Equal(eb.Problems, b.problems) {
				t.Errorf("%s (dry run %v): problems\n %+v\nwant\n %+v", b.name, dryRun, eb.Problems, b.problems)
			}
		}
	}
	if after := dump(f.tc.Ctx, t, f.tc.Admin); !maps.Equal(before, after) {
		t.Fatalf("the dry run or a bad spec changed the store:\n%s", diffDumps(before, after))
	}
	if evs, _ := f.m.Events().Query(api.EventFilter{Kinds: []string{api.EventAPICall}}, 0); len(evs) != len(evsBefore) {
		t.Errorf("a dry run or a refused update made api.call events: %+v", evs[len(evsBefore):])
	}

	// The update itself is what the dry run said.
	status, body = call("POST", "/v1/jobs/demo-job/update", f.admin, api.UpdateRequest{Spec: edited})
	var up api.UpdateReply
	if status != http.StatusOK || json.Unmarshal(body, &up) != nil || up.DryRun || !up.Changed || up.Job.Generation != dry.Job.Generation ||
		!slices.Equal(up.Changes, dry.Changes) || up.Job.Spec.Env["MODE"] != "fast" {
		t.Fatalf("update: %d %s", status, body)
	}
	testenv.Eventually(t, "an api.call event for the update", testenv.Timeout(5*time.Second), func() bool {
		evs, _ := f.m.Events().Query(api.EventFilter{Kinds: []string{api.EventAPICall}, Job: "demo-job"}, 0)
		return len(evs) > 0 && strings.Contains(evs[len(evs)-1].Reason, "update")
	})
	status, body = call("GET", "/v1/jobs/demo-job/spec?generation=1", f.admin, nil)
	if status != http.StatusOK || json.Unmarshal(body, &text) != nil || text.Generation != 1 || strings.Contains(text.Spec, "MODE") {
		t.Errorf("GET spec of generation 1: %d %s", status, body)
	}
	for q, want := range map[string]int{"?generation=9": 404, "?generation=0": 400, "?generation=x": 400} {
		if status, body := call("GET", "/v1/jobs/demo-job/spec"+q, f.admin, nil); status != want {
			t.Errorf("GET spec%s: %d %s; want %d", q, status, body, want)
		}
	}
}

// TestEndOneAvoidance: an undrain naming a job ends that job's avoidance of the node alone
// (its strikes forgotten), keeps the node's draining and its other avoidances; one naming
// a job the node does not avoid changes nothing. Tenants cannot.
func TestEndOneAvoidance(t *testing.T) {
	f := newAPIFixture(t)
	node := slices.Sorted(maps.Keys(f.m.NodeEntries()))[0]
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	if err := desired.UpdateNodeConf(f.tc.Ctx, f.tc.Admin, node, func(c *cluster.NodeConf) {
		c.Draining = true
		c.Avoid = []string{"demo-job", "other-job"}
		c.Avoided = []cluster.Avoidance{{Job: "demo-job", Since: until.Add(-time.Hour), Until: until, Strikes: 2}, {Job: "other-job", Until: until, Strikes: 1}}
	}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the master sees the avoidances", testenv.Timeout(5*time.Second), func() bool {
		_, ok := f.m.Snapshot().View().Confs()[node].Avoidance("demo-job")
		return ok
	})
	st, err := api.NewClient(f.srv.URL, f.admin)
	if err != nil {
		t.Fatal(err)
	}
	js, err := st.Job(f.tc.Ctx, "demo-job")
	if err != nil || len(js.Avoided) != 1 || !js.Avoided[0].Since.Equal(until.Add(-time.Hour)) || js.Avoided[0].Strikes != 2 {
		t.Fatalf("job status avoided %+v, %v", js.Avoided, err)
	}
	body := []byte(`{"job": "demo-job"}`)
	if status, out, _ := f.raw(t, "POST", "/v1/nodes/"+node+"/undrain", f.tokens["demo"], body); status != http.StatusForbidden {
		t.Errorf("a tenant ended an avoidance: %d %s", status, out)
	}
	before := f.settled(t)
	for b, want := range map[string]int{`{"job": "nope"}`: 404, `{"job": "Bad_Name"}`: 400, `{"job": 3}`: 400} {
		if status, out, _ := f.raw(t, "POST", "/v1/nodes/"+node+"/undrain", f.admin, []byte(b)); status != want {
			t.Errorf("undrain %s: %d %s; want %d", b, status, out, want)
		}
	}
	if after := dump(f.tc.Ctx, t, f.tc.Admin); !maps.Equal(before, after) {
		t.Fatalf("refused undrains changed the store:\n%s", diffDumps(before, after))
	}
	if status, out, _ := f.raw(t, "POST", "/v1/nodes/"+node+"/undrain", f.admin, body); status != http.StatusOK {
		t.Fatalf("undrain demo-job: %d %s", status, out)
	}
	testenv.EventuallyWith(t, "demo-job's avoidance ended alone", testenv.Timeout(5*time.Second), func() (bool, string) {
		c := f.m.Snapshot().View().Confs()[node]
		_, demo := c.Avoidance("demo-job")
		_, other := c.Avoidance("other-job")
		return !demo && other && c.Draining && slices.Equal(c.Avoid, []string{"other-job"}), fmt.Sprintf("%+v", c)
	})
}

// TestJobStatusExplainsUnplaced: a job's status carries the placement engine's explanation
// of its unplaced workers, check by check, grouped, as the console's Why tab shows it.
func TestJobStatusExplainsUnplaced(t *testing.T) {
	f := newAPIFixture(t)
	cl, err := api.NewClient(f.srv.URL, f.tokens["demo"])
	if err != nil {
		t.Fatal(err)
	}
	spec := "name: picky\ntenant: demo\nworkers: 2\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [sleep, '1000']\nplacement: {nodeLabels: {disk: ssd}}\n"
	if _, err := cl.SubmitJob(f.tc.Ctx, []byte(spec)); err != nil {
		t.Fatal(err)
	}
	var st api.JobStatus
	testenv.EventuallyWith(t, "picky's workers explained", testenv.Timeout(10*time.Second), func() (bool, string) {
		st, err = cl.Job(f.tc.Ctx, "picky")
		return err == nil && len(st.Why) == 1 && len(st.Why[0].Rejected) > 0, fmt.Sprintf("%+v %v", st.Why, err)
	})
	w := st.Why[0]
	want := api.UnplacedWhy{Workers: []int{0, 1}, Reason: "0 of 2 nodes fit: missing label disk=ssd (2)", Fit: 0, Total: 2,
		Rejected: []api.Rejection{{Check: "label", Text: "missing label disk=ssd", Nodes: 2, Failing: 2}}}
	if w.Reason != want.Reason || !slices.Equal(w.Workers, want.Workers) || w.Total != 2 || !slices.Equal(w.Rejected, want.Rejected) {
		t.Errorf("why %+v\nwant %+v", w, want)
	}
	for _, wv := range st.Workers {
		if wv.State != api.WorkerUnplaced || wv.Reason != want.Reason {
			t.Errorf("worker %+v", wv)
		}
	}
}
