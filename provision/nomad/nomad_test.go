package nomad_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/agents/sim"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/httpapi"
	"github.com/stormdock/stormdock/provision"
	"github.com/stormdock/stormdock/provision/nomad"
	"github.com/stormdock/stormdock/provision/provisiontest"
)

// env is a provider on a recorded Nomad, with a real master and simulated agents on the
// shared ZooKeeper playing what Nomad's clients would start.
type env struct {
	p      *nomad.Provider
	spec   provision.Spec
	rp     *replay
	events *eventLog
	fake   *fakeCluster
	tokens provision.Tokens
}

func newEnv(t *testing.T) *env {
	zk := testenv.ZKAddr(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	chroot := "/stormdock-nomadtest-" + hex.EncodeToString(b)
	spec := provision.Spec{
		Name: "rec", Agents: 2, DCs: []string{"dc-a", "dc-b"}, RacksPerDC: 2,
		Image: "stormdock/worker:latest", Store: "zk://" + zk + chroot, SessionTimeout: 2 * time.Second,
	}.WithDefaults()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{spec: spec, events: &eventLog{}}
	e.rp, _ = newReplay(t, "testdata/lifecycle.json", map[string]string{"STORE": spec.Store, "SPEC": string(raw)}, e.events)
	srv := httptest.NewServer(e.rp)
	t.Cleanup(srv.Close)
	e.fake = newFakeCluster(t, spec.Store, e.events)
	e.rp.onPhase["created"] = func() {
		e.fake.startMaster()
		e.fake.join("nomad-client-1", "dc-a", "r1")
		e.fake.join("nomad-client-2", "dc-b", "r1")
	}
	e.rp.onPhase["scaled-3"] = func() { e.fake.join("nomad-client-3", "dc-a", "r2") }
	e.rp.onPhase["scaled-2"] = func() { e.fake.leave("nomad-client-3") }
	e.rp.onPhase["destroyed"] = e.fake.stop
	e.tokens = provision.Tokens{Dir: t.TempDir()}
	e.p, err = nomad.New(nomad.Config{Address: srv.URL, Tokens: e.tokens, Poll: 50 * time.Millisecond, StartTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.fake.stop()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if s, err := provision.OpenStore(ctx, "zk://"+zk, nil); err == nil {
			_ = coord.DeleteTree(ctx, s, chroot)
			s.Close()
		}
	})
	return e
}

func TestSuite(t *testing.T) {
	provisiontest.RunSuite(t, func(t *testing.T) provisiontest.Env {
		e := newEnv(t)
		return provisiontest.Env{Provider: e.p, Spec: e.spec}
	})
}

// TestRecordedLifecycle checks what the provider sends Nomad: the job field by field, the
// scale requests, the drain through the master before the scale-in, and the purge.
func TestRecordedLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.p.Create(ctx, e.spec); err != nil {
		t.Fatalf("create: %v", err)
	}
	regs := e.rp.requests(http.MethodPut, "/v1/jobs")
	if len(regs) != 1 {
		t.Fatalf("%d register requests, want 1", len(regs))
	}
	checkJob(t, regs[0].Body, e.spec)

	if _, err := e.p.Scale(ctx, "rec", 3); err != nil {
		t.Fatalf("scale to 3: %v", err)
	}
	c, err := e.p.Scale(ctx, "rec", 2)
	if err != nil {
		t.Fatalf("scale to 2: %v", err)
	}
	if got := []string{c.Agents[0].Node, c.Agents[1].Node}; !slices.Equal(got, []string{"nomad-client-1", "nomad-client-2"}) {
		t.Errorf("agents after scale in: %v", got)
	}
	if c.Agents[1].DC != "dc-b" || c.Agents[0].Rack != "r1" {
		t.Errorf("agents' dc and rack come from their node records: %+v", c.Agents)
	}
	scales := e.rp.requests(http.MethodPut, "/v1/job/stormdock-rec/scale")
	if len(scales) != 2 {
		t.Fatalf("%d scale requests, want 2", len(scales))
	}
	for i, want := range []int64{3, 2} {
		var req struct {
			Count  *int64
			Target map[string]string
		}
		if err := json.Unmarshal(scales[i].Body, &req); err != nil {
			t.Fatal(err)
		}
		if req.Count == nil || *req.Count != want || req.Target["Group"] != "agents" || req.Target["Job"] != "stormdock-rec" {
			t.Errorf("scale request %d: count %v target %v, want %d of group agents", i, req.Count, req.Target, want)
		}
	}
	// The drain of the agent Nomad is about to stop comes before the scale-in, and its
	// undrain after.
	ev := e.events.list()
	drain := slices.Index(ev, "master POST /v1/nodes/nomad-client-3/drain")
	undrain := slices.Index(ev, "master POST /v1/nodes/nomad-client-3/undrain")
	scaleIn := -1
	for i, s := range ev {
		if s == "nomad PUT /v1/job/stormdock-rec/scale" {
			scaleIn = i // the last one
		}
	}
	if drain < 0 || undrain < 0 || !(drain < scaleIn && scaleIn < undrain) {
		t.Errorf("drain at %d, scale-in at %d, undrain at %d; want drain < scale-in < undrain: %v", drain, scaleIn, undrain, ev)
	}

	if err := e.p.Destroy(ctx, "rec"); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	dels := e.rp.requests(http.MethodDelete, "/v1/job/stormdock-rec")
	if len(dels) != 1 || !strings.Contains(dels[0].Query, "purge=true") {
		t.Errorf("deregister requests %+v, want one with purge=true", dels)
	}
}

// checkJob checks the registered job field by field.
func checkJob(t *testing.T, body []byte, spec provision.Spec) {
	t.Helper()
	var req struct{ Job map[string]any }
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatalf("register body: %v", err)
	}
	j := req.Job
	get := func(m any, path ...any) any {
		for _, p := range path {
			switch k := p.(type) {
			case string:
				mm, _ := m.(map[string]any)
				m = mm[k]
			case int:
				a, _ := m.([]any)
				if k >= len(a) {
					return nil
				}
				m = a[k]
			}
		}
		return m
	}
	eq := func(what string, got, want any) {
		t.Helper()
		gb, _ := json.Marshal(got)
		wb, _ := json.Marshal(want)
		if string(gb) != string(wb) {
			t.Errorf("%s = %s, want %s", what, gb, wb)
		}
	}
	eq("ID", j["ID"], "stormdock-rec")
	eq("Type", j["Type"], "service")
	eq("Datacenters", j["Datacenters"], []string{"dc-a", "dc-b"})
	eq("Meta.stormdock.cluster", get(j, "Meta", "stormdock.cluster"), "rec")
	eq("Meta.stormdock.store", get(j, "Meta", "stormdock.store"), spec.Store)
	var metaSpec provision.Spec
	if err := json.Unmarshal([]byte(get(j, "Meta", "stormdock.spec").(string)), &metaSpec); err != nil || metaSpec.Store != spec.Store || metaSpec.Agents != 2 {
		t.Errorf("Meta.stormdock.spec = %+v (%v)", metaSpec, err)
	}
	groups, _ := j["TaskGroups"].([]any)
	if len(groups) != 2 {
		t.Fatalf("TaskGroups: %d, want master and agents", len(groups))
	}
	master, agents := groups[0], groups[1]
	eq("master.Name", get(master, "Name"), "master")
	eq("master.Count", get(master, "Count"), 1)
	eq("master network", get(master, "Networks", 0, "DynamicPorts", 0, "Label"), "api")
	eq("agents.Name", get(agents, "Name"), "agents")
	eq("agents.Count", get(agents, "Count"), 2)
	eq("agents distinct_hosts", get(agents, "Constraints", 0, "Operand"), "distinct_hosts")
	eq("agents rack constraint", []any{get(agents, "Constraints", 1, "LTarget"), get(agents, "Constraints", 1, "Operand")}, []string{"${meta.rack}", "is_set"})
	eq("spread dc attribute", get(agents, "Spreads", 0, "Attribute"), "${node.datacenter}")
	eq("spread dc targets", get(agents, "Spreads", 0, "SpreadTarget"), []map[string]any{{"Value": "dc-a", "Percent": 50}, {"Value": "dc-b", "Percent": 50}})
	eq("spread rack attribute", get(agents, "Spreads", 1, "Attribute"), "${meta.rack}")

	task := get(agents, "Tasks", 0)
	eq("agent driver", get(task, "Driver"), "docker")
	eq("agent image", get(task, "Config", "image"), spec.Image)
	eq("agent command", get(task, "Config", "command"), "/stormdock")
	eq("agent network_mode", get(task, "Config", "network_mode"), "host")
	eq("agent readonly_rootfs", get(task, "Config", "readonly_rootfs"), true)
	eq("agent tmpfs", get(task, "Config", "mount", 0, "type"), "tmpfs")
	eq("agent tmpfs target", get(task, "Config", "mount", 0, "target"), "/state")
	eq("agent MemoryMB", get(task, "Resources", "MemoryMB"), 2048)
	eq("agent CPU MHz", get(task, "Resources", "CPU"), 2000)
	eq("agent env", get(task, "Env", "STORMDOCK_STORE"), spec.Store)
	args, _ := get(task, "Config", "args").([]any)
	flags := map[string]string{}
	for i := 0; i+1 < len(args); i++ {
		if a, _ := args[i].(string); strings.HasPrefix(a, "--") {
			flags[a], _ = args[i+1].(string)
		}
	}
	if len(args) == 0 || args[0] != "agent" {
		t.Errorf("agent args %v: want the agent command first", args)
	}
	for flag, want := range map[string]string{
		"--store": spec.Store, "--node-id": "${node.unique.name}", "--host": "${node.unique.name}",
		"--dc": "${node.datacenter}", "--rack": "${meta.rack}", "--slots": "4",
		"--memory": "1879048192", "--cpu": "2", "--state-dir": "/state", "--cgroups": "off", "--session-timeout": "2s",
	} {
		if flags[flag] != want {
			t.Errorf("agent %s = %q, want %q", flag, flags[flag], want)
		}
	}
	mtask := get(master, "Tasks", 0)
	eq("master image", get(mtask, "Config", "image"), spec.Image)
	eq("master MemoryMB", get(mtask, "Resources", "MemoryMB"), 512)
	margs, _ := get(mtask, "Config", "args").([]any)
	if len(margs) < 5 || margs[0] != "master" || !slices.Contains(margs, any("${NOMAD_ADDR_api}")) || !slices.Contains(margs, any(spec.Store)) {
		t.Errorf("master args %v: want master --store STORE --api ${NOMAD_ADDR_api}", margs)
	}
}

// fakeCluster plays what the Nomad job would run: a real master (in process, serving its
// API on an httptest server) and simulated agents (agents/sim: the agent that passes the
// conformance suite, without worker processes).
type fakeCluster struct {
	t      *testing.T
	url    string
	events *eventLog

	mu     sync.Mutex
	srv    *httptest.Server
	cancel context.CancelFunc
	done   chan struct{}
	master coord.Store
	agents map[string]*sim.Agent
}

func newFakeCluster(t *testing.T, url string, events *eventLog) *fakeCluster {
	return &fakeCluster{t: t, url: url, events: events, agents: map[string]*sim.Agent{}}
}

func (f *fakeCluster) open() coord.Store {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := coord.Open(ctx, f.url, coord.Options{SessionTimeout: 2 * time.Second})
	if err != nil {
		f.t.Errorf("fake cluster: %v", err)
		return nil
	}
	return s
}

func (f *fakeCluster) startMaster() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.srv != nil {
		return
	}
	s := f.open()
	if s == nil {
		return
	}
	var m *master.Master
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			f.events.add("master POST " + r.URL.Path)
		}
		httpapi.New(m, httpapi.Config{Gatherer: prometheus.NewRegistry()}).ServeHTTP(w, r)
	}))
	var err error
	m, err = master.New(s, master.Config{ID: "m1", API: f.srv.URL, Logger: slog.Default()})
	if err != nil {
		f.t.Errorf("fake master: %v", err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.master, f.cancel, f.done = s, cancel, make(chan struct{})
	go func() {
		defer close(f.done)
		_ = m.Run(ctx)
	}()
}

func (f *fakeCluster) join(id, dc, rack string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := sim.Start(ctx, sim.Config{Store: f.url, Options: coord.Options{SessionTimeout: 2 * time.Second}, Heartbeat: 100 * time.Millisecond},
		cluster.Node{ID: id, Host: id, DC: dc, Rack: rack, Slots: 4, Memory: 1 << 30, CPU: 2000})
	if err != nil {
		f.t.Errorf("simulated agent %s: %v", id, err)
		return
	}
	f.mu.Lock()
	f.agents[id] = a
	f.mu.Unlock()
}

func (f *fakeCluster) leave(id string) {
	f.mu.Lock()
	s := f.agents[id]
	delete(f.agents, id)
	f.mu.Unlock()
	if s != nil {
		s.Close()
	}
}

func (f *fakeCluster) stop() {
	f.mu.Lock()
	agents := f.agents
	f.agents = map[string]*sim.Agent{}
	cancel, done, srv, master := f.cancel, f.done, f.srv, f.master
	f.cancel, f.srv, f.master = nil, nil, nil
	f.mu.Unlock()
	for _, s := range agents {
		s.Close()
	}
	if cancel != nil {
		cancel()
		<-done
	}
	if srv != nil {
		srv.Close()
	}
	if master != nil {
		master.Close()
	}
}

// The nomad provider refuses a zks:// store in one line, before it asks Nomad anything:
// its allocations would get no TLS files.
func TestCreateRefusesTLSStore(t *testing.T) {
	p, err := nomad.New(nomad.Config{Address: "http://127.0.0.1:1", Tokens: provision.Tokens{Dir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	spec := provision.Spec{Name: "tls", Agents: 1, Image: "stormdock/worker:latest", Store: "zks://zk:2281/tls",
		StoreTLS: coord.TLSFiles{CA: "ca.pem"}}
	_, err = p.Create(context.Background(), spec)
	if !errors.Is(err, provision.ErrBadSpec) || !strings.Contains(err.Error(), "does not speak TLS to ZooKeeper yet") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("create on zks://: %v; want a one-line bad spec", err)
	}
}
