package httpapi_test

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/httpapi"
)

// TestSubmitFileSinkConfined: a mirrored job's file sink is taken at submit and update only
// below SINKDIR/<its tenant>/; without a sink dir file sinks are refused. Each refusal is one
// line naming what is allowed, and stores nothing.
func TestSubmitFileSinkConfined(t *testing.T) {
	const sinkDir = "/srv/sinks"
	tc := clustertest.NewSim(t)
	on, _, _ := tc.Master("m1", func(c *master.Config) { c.SinkDir = sinkDir })
	testenv.Eventually(t, "leading", 5*time.Second, on.Leader)
	off, _, _ := tc.Master("m2")
	ctx := tc.Ctx
	token := api.NewToken()
	if _, err := tc.Admin.Create(ctx, cluster.AdminTokenKey, []byte(api.HashToken(token)), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	client := func(m *master.Master) *api.Client {
		srv := httptest.NewServer(httpapi.New(m, httpapi.Config{}))
		t.Cleanup(srv.Close)
		c, _ := api.NewClient(srv.URL, token)
		return c
	}
	withDir, without := client(on), client(off)
	for _, tn := range []string{"acme", "other"} {
		if err := withDir.CreateTenant(ctx, cluster.Tenant{Name: tn}); err != nil {
			t.Fatal(err)
		}
	}
	spec := func(name, out string) []byte {
		return fmt.Appendf(nil, "name: %s\ntenant: acme\nworkers: 1\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [sleep, '1000']\nlinks: [dc-a, dc-b]\noutput: %s\n", name, out)
	}
	for i, c := range []struct {
		name   string
		cl     *api.Client
		output string
		want   string // "" accepted
	}{
		{"no sink dir", without, "file:///srv/sinks/acme/out.jsonl", "file sinks are off on this cluster: the operator sets --sink-dir"},
		{"outside", withDir, "file:///root/victim.txt", "name a file below /srv/sinks/acme/"},
		{"another tenant's", withDir, "file:///srv/sinks/other/out.jsonl", "name a file below /srv/sinks/acme/"},
		{"dot dot", withDir, "file:///srv/sinks/acme/../../../etc/ld.so.preload", "not a clean path"},
		{"escaped dot dot", withDir, "file:///srv/sinks/acme/%2e%2e/other/x", "not a clean path"},
		{"the tenant's dir itself", withDir, "file:///srv/sinks/acme", "name a file below /srv/sinks/acme/"},
		{"below the tenant's dir", withDir, "file:///srv/sinks/acme/a/out.jsonl?fsync=always", ""},
		{"http sink without a sink dir", without, "http://127.0.0.1:1/in", ""},
	} {
		name := fmt.Sprintf("mj%d", i)
		_, err := c.cl.SubmitJob(ctx, spec(name, c.output))
		if c.want == "" {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		if !errors.Is(err, api.ErrBadInput) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v; want a one-line bad_input with %q", c.name, err, c.want)
		}
		if _, err := withDir.Job(ctx, name); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("%s: refused job stored: %v", c.name, err)
		}
	}
	// An update to a sink outside is refused too, and the job keeps its output.
	_, err := withDir.UpdateJob(ctx, "mj6", spec("mj6", "file:///etc/cron.d/x"), api.PolicyOverrides{})
	if !errors.Is(err, api.ErrBadInput) || !strings.Contains(err.Error(), "name a file below /srv/sinks/acme/") {
		t.Fatalf("update outside the sink dir: %v", err)
	}
	st, err := withDir.Job(ctx, "mj6")
	if err != nil || st.Job.Spec.Output != "file:///srv/sinks/acme/a/out.jsonl?fsync=always" {
		t.Fatalf("after a refused update: %+v %v", st.Job.Spec.Output, err)
	}
}
