package httpapi_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master/httpapi"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestAPI(t *testing.T) {
	tc := clustertest.NewSim(t)
	m, _, _ := tc.Master("m1")
	for _, n := range clustertest.Nodes(1, 1, 2) {
		tc.Node(n)
	}
	testenv.Eventually(t, "the master sees 2 nodes", 5*time.Second, func() bool { return len(m.NodeEntries()) == 2 })
	srv := httptest.NewServer(httpapi.New(m, httpapi.Config{}))
	defer srv.Close()
	ctx := tc.Ctx
	token := api.NewToken()
	if _, err := tc.Admin.Create(ctx, cluster.AdminTokenKey, []byte(api.HashToken(token)), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	cl, err := api.NewClient(srv.URL, token)
	if err != nil {
		t.Fatal(err)
	}
	anon, _ := api.NewClient(srv.URL, "")
	if _, err := anon.Jobs(ctx); err == nil || !strings.Contains(err.Error(), "missing API token") {
		t.Fatalf("call without token: %v", err)
	}
	forged, _ := api.NewClient(srv.URL, "sdt_forged")
	if _, err := forged.Jobs(ctx); err == nil || !strings.Contains(err.Error(), "invalid API token") {
		t.Fatalf("call with a wrong token: %v", err)
	}
	spec := "name: wc\ntenant: search\nworkers: 4\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [sleep, '1000']\n"

	_, err = cl.SubmitJob(ctx, []byte(spec))
	if !errors.Is(err, api.ErrNotFound) || !strings.Contains(err.Error(), `unknown tenant "search"`) {
		t.Fatalf("submit for unknown tenant: %v", err)
	}
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "search", MaxWorkers: 6}); err != nil {
		t.Fatal(err)
	}
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "search"}); !errors.Is(err, api.ErrExists) {
		t.Fatalf("second create: %v", err)
	}
	_, err = cl.SubmitJob(ctx, []byte("name: wc\nworkers: 0\n"))
	if !errors.Is(err, api.ErrBadInput) || !strings.Contains(err.Error(), "workers: must be at least 1 (line 2)") {
		t.Fatalf("bad spec: %v", err)
	}
	if _, err := cl.SubmitJob(ctx, []byte(spec)); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SubmitJob(ctx, []byte(spec)); !errors.Is(err, api.ErrExists) {
		t.Fatalf("duplicate submit: %v", err)
	}
	_, err = cl.SubmitJob(ctx, []byte(strings.Replace(spec, "name: wc", "name: wc2", 1)))
	if !errors.Is(err, api.ErrQuota) || err.Error() != "tenant search: 4 of 6 workers used, asked for 4 more" {
		t.Fatalf("over quota: %v", err)
	}
	if _, err := cl.ScaleJob(ctx, "wc", 7); !errors.Is(err, api.ErrQuota) || !strings.Contains(err.Error(), "4 of 6 workers used, asked for 3 more") {
		t.Fatalf("scale over quota: %v", err)
	}
	testenv.Eventually(t, "4 running", 5*time.Second, func() bool {
		st, err := cl.Job(ctx, "wc")
		return err == nil && st.Summary.Running == 4
	})
	// 2 nodes x 4 slots: scaling to 6 fits; the quota allows 6.
	if _, err := cl.ScaleJob(ctx, "wc", 6); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "6 running", 5*time.Second, func() bool {
		st, err := cl.Job(ctx, "wc")
		return err == nil && st.Summary.Running == 6
	})
	// A tenant token sees and changes only its tenant's jobs.
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "ads"}); err != nil {
		t.Fatal(err)
	}
	adsToken, err := cl.TenantToken(ctx, "ads")
	if err != nil {
		t.Fatal(err)
	}
	ads, _ := api.NewClient(srv.URL, adsToken)
	if _, err := ads.ScaleJob(ctx, "wc", 1); !errors.Is(err, api.ErrForbidden) || !strings.Contains(err.Error(), "the token of tenant ads cannot act on tenant search's jobs") {
		t.Fatalf("cross-tenant scale: %v", err)
	}
	if _, err := ads.KillJob(ctx, "wc", 0); !errors.Is(err, api.ErrForbidden) {
		t.Fatalf("cross-tenant kill: %v", err)
	}
	if _, err := ads.SubmitJob(ctx, []byte(strings.Replace(spec, "name: wc", "name: wc3", 1))); !errors.Is(err, api.ErrForbidden) {
		t.Fatalf("cross-tenant submit: %v", err)
	}
	if jobs, err := ads.Jobs(ctx); err != nil || len(jobs) != 0 {
		t.Fatalf("tenant ads sees %v, %v", jobs, err)
	}
	if err := ads.CreateTenant(ctx, cluster.Tenant{Name: "evil"}); !errors.Is(err, api.ErrForbidden) {
		t.Fatalf("tenant creating a tenant: %v", err)
	}
	if st, err := cl.Job(ctx, "wc"); err != nil || st.Summary.Workers != 6 {
		t.Fatalf("refused calls changed the job: %+v, %v", st.Summary, err)
	}
	nodes, err := cl.Nodes(ctx)
	if err != nil || len(nodes) != 2 || nodes[0].SlotsUsed+nodes[1].SlotsUsed != 6 {
		t.Fatalf("nodes = %+v, %v", nodes, err)
	}
	if err := cl.DrainNode(ctx, "nope", true); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("drain unknown node: %v", err)
	}
	if _, err := cl.Job(ctx, "nope"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("unknown job: %v", err)
	}
	if _, err := cl.KillJob(ctx, "wc", time.Second); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "job removed", 5*time.Second, func() bool {
		_, err := cl.Job(ctx, "wc")
		return errors.Is(err, api.ErrNotFound)
	})
	if len(tc.Assignments()) != 0 {
		t.Errorf("killed job still assigned: %v", tc.Assignments())
	}
}
