package master_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation/docker"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/httpapi"
)

// TestPinningPerTenant, against an htpasswd registry: a tenant pins its private image with
// the credentials it gave (`tenant registry-auth`, with its own token), another tenant
// naming that image, by tag or by digest, is not pinned and is told what to do, though the
// master's own credentials would reach the registry; once the admin shares the prefix the
// master pins it with its own. A tenant cannot set another's credentials or share; tenant
// list says only whether credentials are set and for which hosts; no credential is in the
// API's answers, events or the master's log.
func TestPinningPerTenant(t *testing.T) {
	testenv.DockerSocket(t)
	const user, pass = "acme", "s3cret-acme-pw-2"
	const mUser, mPass = "master", "s3cret-master-pw-3"
	srv := testenv.StartRegistry(t, map[string]string{user: pass, mUser: mPass})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cli, err := docker.Connect(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	tenantFile := srv.AuthFile(user, pass)
	tenantAuth, _ := images.LoadAuth(tenantFile)
	masterAuth, _ := images.LoadAuth(srv.AuthFile(mUser, mPass))
	hog := testenv.BuildBinary(t, "./isolation/testdata/hog")
	tag := fmt.Sprintf("%s/private/pin-%d:1", srv.Addr, os.Getpid())
	ims := images.New(cli, images.WithAuth(tenantAuth))
	img, err := ims.Build(ctx, images.BuildOptions{Tag: tag, Binary: hog, Labels: map[string]string{"io.stormdock.test.variant": "pinauth"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ims.Remove(context.Background(), img.ID) })
	dgst, err := ims.Push(ctx, tag, images.Progress{})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := images.ParseRef(tag)
	pinned, _ := r.WithDigest(dgst)

	logs := &testenv.Buffer{}
	tc := clustertest.NewSim(t)
	m, _, _ := tc.Master("m1", func(c *master.Config) {
		c.PinRetry = 100 * time.Millisecond
		c.Resolver = &images.Resolver{Auth: masterAuth}
		c.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	for _, n := range clustertest.Nodes(1, 1, 2) {
		n.Labels = map[string]string{"isolation/docker": "true"}
		tc.Node(n)
	}
	testenv.Eventually(t, "the master sees 2 nodes", 5*time.Second, func() bool { return len(m.MirrorView().Nodes()) == 2 })
	hs := httptest.NewServer(httpapi.New(m, httpapi.Config{}))
	defer hs.Close()
	token := api.NewToken()
	if _, err := tc.Admin.Create(ctx, cluster.AdminTokenKey, []byte(api.HashToken(token)), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	admin, _ := api.NewClient(hs.URL, token)
	clients := map[string]*api.Client{}
	for _, name := range []string{"a", "b"} {
		if err := admin.CreateTenant(ctx, cluster.Tenant{Name: name}); err != nil {
			t.Fatal(err)
		}
		tok, err := admin.TenantToken(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		clients[name], _ = api.NewClient(hs.URL, tok)
	}
	conf, _ := os.ReadFile(tenantFile)

	// Who may set what.
	for _, c := range []struct {
		name   string
		call   func() error
		sentry error
	}{
		{"b sets a's credentials", func() error { _, err := clients["b"].SetRegistryAuth(ctx, "a", conf); return err }, api.ErrForbidden},
		{"b clears a's credentials", func() error { return clients["b"].ClearRegistryAuth(ctx, "a") }, api.ErrForbidden},
		{"b shares a prefix", func() error { _, err := clients["b"].ShareImages(ctx, srv.Addr+"/private/", true); return err }, api.ErrForbidden},
		{"b lists the shared prefixes", func() error { _, err := clients["b"].SharedImages(ctx); return err }, api.ErrForbidden},
		{"a sends no config.json", func() error {
			_, err := clients["a"].SetRegistryAuth(ctx, "a", []byte(`{"auths": {"h": {"auth": "s3cret!!"}}}`))
			return err
		}, api.ErrBadInput},
		{"credentials for an unknown tenant", func() error { _, err := admin.SetRegistryAuth(ctx, "nobody", conf); return err }, api.ErrNotFound},
		{"a bad prefix", func() error { _, err := admin.ShareImages(ctx, "private/", true); return err }, api.ErrBadInput},
	} {
		err := c.call()
		var ae *api.Error
		if !errors.Is(err, c.sentry) || !errors.As(err, &ae) || strings.Contains(err.Error(), pass) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: %v; want %v, no secret", c.name, err, c.sentry)
		}
		if c.sentry == api.ErrForbidden && ae != nil && ae.Status != 403 {
			t.Errorf("%s: status %d; want 403", c.name, ae.Status)
		}
	}
	hosts, err := clients["a"].SetRegistryAuth(ctx, "a", conf)
	if err != nil || len(hosts) != 1 || hosts[0] != srv.Addr {
		t.Fatalf("a sets its own credentials: %v, %v; want hosts [%s]", hosts, err, srv.Addr)
	}

	spec := func(name, tenant, image string) []byte {
		return fmt.Appendf(nil, "name: %s\ntenant: %s\nworkers: 1\nisolation: docker\nimage: %s\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [/job, term]\n", name, tenant, image)
	}
	rec, err := clients["a"].SubmitJob(ctx, spec("wa", "a", tag))
	if err != nil || rec.Image == nil || rec.Image.Ref != pinned {
		t.Fatalf("a's job: %+v, %v; want pinned %s", rec.Image, err, pinned)
	}
	waitPinned(t, tc, "wa", 1, pinned)
	for _, c := range []struct{ job, image string }{{"wb", tag}, {"wb-digest", pinned}} {
		rec, err := clients["b"].SubmitJob(ctx, spec(c.job, "b", c.image))
		want := fmt.Sprintf("image %s: tenant b has no credentials for registry %s: give the tenant registry credentials with `stormdock tenant registry-auth b FILE`, or ask the admin to share it", c.image, srv.Addr)
		if err != nil || rec.Image == nil || rec.Image.Ref != "" || !strings.HasPrefix(rec.Image.Error, want) || !rec.Image.NoAccess {
			t.Fatalf("b's job naming %s: %+v, %v; want it unpinned with %q", c.image, rec.Image, err, want)
		}
		t.Logf("b's job %s: %s", c.job, rec.Image.Error)
	}
	waitPinned(t, tc, "wb", 1, "")

	// tenant list: yes and the hosts, never the credentials.
	for who, cl := range map[string]*api.Client{"admin": admin, "a": clients["a"], "b": clients["b"]} {
		ts, err := cl.Tenants(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(ts)
		for _, tv := range ts {
			if tv.RegistryAuth != (tv.Name == "a") || (tv.Name == "a" && (len(tv.RegistryHosts) != 1 || tv.RegistryHosts[0] != srv.Addr)) {
				t.Errorf("%s's tenant list: %s", who, b)
			}
		}
		if strings.Contains(string(b), pass) || strings.Contains(string(b), base64.StdEncoding.EncodeToString([]byte(user+":"+pass))) {
			t.Errorf("%s's tenant list shows the credentials: %s", who, b)
		}
	}

	// Shared: the master's credentials pin b's job.
	if ps, err := admin.ShareImages(ctx, srv.Addr+"/private/", true); err != nil || len(ps) != 1 || ps[0] != srv.Addr+"/private" {
		t.Fatalf("share: %v, %v", ps, err)
	}
	waitPinned(t, tc, "wb", 1, pinned)
	if ps, err := admin.ShareImages(ctx, srv.Addr+"/private", false); err != nil || len(ps) != 0 {
		t.Fatalf("unshare: %v, %v", ps, err)
	}
	if err := clients["a"].ClearRegistryAuth(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if ts, _ := admin.Tenants(ctx); len(ts) != 2 || ts[0].RegistryAuth {
		t.Errorf("after clear: %+v", ts)
	}

	evs, err := admin.Events(ctx, api.EventFilter{}, 1000)
	if err != nil {
		t.Fatal(err)
	}
	eb, _ := json.Marshal(evs)
	for _, secret := range []string{pass, mPass, base64.StdEncoding.EncodeToString([]byte(user + ":" + pass)), base64.StdEncoding.EncodeToString([]byte(mUser + ":" + mPass))} {
		if strings.Contains(string(eb), secret) || strings.Contains(logs.String(), secret) {
			t.Errorf("a credential (%s...) is in the events or the master's log", secret[:4])
		}
	}
	if !strings.Contains(logs.String(), "tenant registry credentials set") {
		t.Errorf("the change is not in the master's log")
	}
}
