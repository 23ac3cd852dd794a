// Package provisiontest is the test suite every provision.Provider passes: one body run
// against each implementation (a real dockerd, a recorded Nomad), as containerd runs its
// content suite against every content store.
package provisiontest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stormdock/stormdock/provision"
)

// Env is one implementation under test.
type Env struct {
	Provider provision.Provider
	// Spec is the spec of a fresh cluster with 2 agents: a name and a store chroot of its
	// own, an image that exists.
	Spec provision.Spec
}

// RunSuite runs the suite; newEnv is called once per subtest and cleans up after itself
// with t.Cleanup.
func RunSuite(t *testing.T, newEnv func(t *testing.T) Env) {
	t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, newEnv(t)) })
	t.Run("Unknown", func(t *testing.T) { testUnknown(t, newEnv(t)) })
	t.Run("BadSpec", func(t *testing.T) { testBadSpec(t, newEnv(t)) })
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// checkAgents checks that c runs n registered agents with distinct nodes in spec's data
// centers, and a leading master.
func checkAgents(t *testing.T, c provision.Cluster, spec provision.Spec, n int) {
	t.Helper()
	if len(c.Agents) != n || c.Ready() != n {
		t.Fatalf("%s: %d agents, %d registered; want %d registered: %+v", c.Name, len(c.Agents), c.Ready(), n, c.Agents)
	}
	if !c.Master.Registered || c.API == "" || c.Master.State != "running" {
		t.Errorf("master = %+v, api %q: want running, leading, with an API URL", c.Master, c.API)
	}
	seen := map[string]bool{}
	for _, a := range c.Agents {
		if a.Node == "" || seen[a.Node] {
			t.Errorf("agent %+v: node id empty or repeated", a)
		}
		seen[a.Node] = true
		if !slices.Contains(spec.DCs, a.DC) || a.Rack == "" || a.State != "running" {
			t.Errorf("agent %+v: want running in one of %v with a rack", a, spec.DCs)
		}
	}
	if c.Store != spec.Store || c.Spec.Agents != n {
		t.Errorf("store %q, spec agents %d; want %q, %d", c.Store, c.Spec.Agents, spec.Store, n)
	}
}

func listed(t *testing.T, p provision.Provider, name string) (provision.Summary, bool) {
	t.Helper()
	all, err := p.List(ctxFor(t))
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, s := range all {
		if s.Name == name {
			return s, true
		}
	}
	return provision.Summary{}, false
}

func testLifecycle(t *testing.T, env Env) {
	ctx := ctxFor(t)
	p, spec := env.Provider, env.Spec
	c, err := p.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	checkAgents(t, c, spec, spec.Agents)
	if s, ok := listed(t, p, spec.Name); !ok || s.Agents != spec.Agents || s.Store != spec.Store {
		t.Errorf("List: %+v (found %v), want %d agents on %s", s, ok, spec.Agents, spec.Store)
	}
	if _, err := p.Create(ctx, spec); !errors.Is(err, provision.ErrExists) {
		t.Errorf("second Create: %v, want ErrExists", err)
	}

	grown, err := p.Scale(ctx, spec.Name, spec.Agents+1)
	if err != nil {
		t.Fatalf("Scale out: %v", err)
	}
	checkAgents(t, grown, spec, spec.Agents+1)
	for _, a := range c.Agents {
		if !slices.ContainsFunc(grown.Agents, func(b provision.Member) bool { return b.ID == a.ID }) {
			t.Errorf("scale out replaced agent %s", a.Name)
		}
	}

	shrunk, err := p.Scale(ctx, spec.Name, spec.Agents)
	if err != nil {
		t.Fatalf("Scale in: %v", err)
	}
	checkAgents(t, shrunk, spec, spec.Agents)
	for _, a := range shrunk.Agents {
		if !slices.ContainsFunc(c.Agents, func(b provision.Member) bool { return b.ID == a.ID }) {
			t.Errorf("scale in kept %s, which was not one of the first agents", a.Name)
		}
	}
	st, err := p.Status(ctx, spec.Name)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	checkAgents(t, st, spec, spec.Agents)

	if err := p.Destroy(ctx, spec.Name); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if _, err := p.Status(ctx, spec.Name); !errors.Is(err, provision.ErrNotFound) {
		t.Errorf("Status after Destroy: %v, want ErrNotFound", err)
	}
	if s, ok := listed(t, p, spec.Name); ok {
		t.Errorf("List after Destroy still has %+v", s)
	}
	if err := p.Destroy(ctx, spec.Name); !errors.Is(err, provision.ErrNotFound) {
		t.Errorf("second Destroy: %v, want ErrNotFound", err)
	}
}

func testUnknown(t *testing.T, env Env) {
	ctx := ctxFor(t)
	name := env.Spec.Name
	if _, err := env.Provider.Status(ctx, name); !errors.Is(err, provision.ErrNotFound) {
		t.Errorf("Status: %v, want ErrNotFound", err)
	}
	if _, err := env.Provider.Scale(ctx, name, 3); !errors.Is(err, provision.ErrNotFound) {
		t.Errorf("Scale: %v, want ErrNotFound", err)
	}
	if err := env.Provider.Destroy(ctx, name); !errors.Is(err, provision.ErrNotFound) {
		t.Errorf("Destroy: %v, want ErrNotFound", err)
	}
}

func testBadSpec(t *testing.T, env Env) {
	ctx := ctxFor(t)
	for _, tc := range []struct {
		what string
		edit func(*provision.Spec)
	}{
		{"upper-case name", func(s *provision.Spec) { s.Name = "Bad_Name" }},
		{"embedded store", func(s *provision.Spec) { s.Store = "mem://x" }},
		{"store without chroot", func(s *provision.Spec) { s.Store = "zk://127.0.0.1:2181" }},
		{"negative agents", func(s *provision.Spec) { s.Agents = -1 }},
		{"bad dc", func(s *provision.Spec) { s.DCs = []string{"DC A"} }},
	} {
		spec := env.Spec
		tc.edit(&spec)
		if _, err := env.Provider.Create(ctx, spec); !errors.Is(err, provision.ErrBadSpec) {
			t.Errorf("%s: Create: %v, want ErrBadSpec", tc.what, err)
		}
	}
	if _, err := env.Provider.Scale(ctx, env.Spec.Name, -1); !errors.Is(err, provision.ErrBadSpec) {
		t.Errorf("Scale -1: %v, want ErrBadSpec", err)
	}
}
