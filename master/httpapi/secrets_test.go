package httpapi_test

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents/sim"
	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/keyring"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/httpapi"
)

// nodeKeys is a simulated node's identity: what the real agent makes in its state dir.
type nodeKeys struct {
	sign ed25519.PrivateKey
	seal *ecdh.PrivateKey
}

func newNodeKeys(t *testing.T) nodeKeys {
	_, sign, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	seal, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return nodeKeys{sign: sign, seal: seal}
}

func (k nodeKeys) public() *cluster.NodeIdentity {
	return &cluster.NodeIdentity{Sign: k.sign.Public().(ed25519.PublicKey), Seal: k.seal.PublicKey().Bytes()}
}

// askSecrets sends node's request for workers' secrets, signed with signer, and opens the
// answer with opener: the values by worker, or the error.
func askSecrets(t *testing.T, url, node string, workers []cluster.WorkerKey, signer, opener nodeKeys) (map[cluster.WorkerKey]api.WorkerSecrets, int, error) {
	t.Helper()
	body, _ := json.Marshal(api.NodeSecretsRequest{Node: node, Workers: workers})
	req, _ := http.NewRequest(http.MethodPost, url+api.NodeSecretsPath(node), bytes.NewReader(body))
	if signer.sign != nil {
		req.Header.Set("Authorization", api.SignNodeRequest(signer.sign, http.MethodPost, api.NodeSecretsPath(node), body, time.Now(), api.NodeTokenTTL))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, resp.StatusCode, api.ParseError(resp.StatusCode, data, resp.Status)
	}
	var rep api.NodeSecretsReply
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	plain, err := api.OpenForNode(opener.seal, node, body, rep.Sealed)
	if err != nil {
		return nil, resp.StatusCode, err
	}
	var ns api.NodeSecrets
	if err := json.Unmarshal(plain, &ns); err != nil {
		t.Fatal(err)
	}
	out := map[cluster.WorkerKey]api.WorkerSecrets{}
	for _, w := range ns.Workers {
		out[w.Key] = w
	}
	return out, resp.StatusCode, nil
}

// TestSecretsAPI: tenants manage their own secrets and the admin every tenant's; values go
// in and never come back out (answers, lists, events, the master's log); a job names only its
// tenant's secrets; the leader hands a node the values of the workers it assigned to it,
// on the node's own signature, sealed to the node's own key; nothing else gets one.
func TestSecretsAPI(t *testing.T) {
	tc := clustertest.NewSim(t)
	ring := newRing(t)
	var logs testenv.Buffer
	m, _, _ := tc.Master("m1", func(c *master.Config) {
		c.Keyring = ring
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	testenv.Eventually(t, "leading", 5*time.Second, m.Leader)
	off, _, _ := tc.Master("m2") // a master without a keyring: secrets are off there
	srv, _ := tc.API(m, httpapi.Config{})
	offSrv, _ := tc.API(off, httpapi.Config{})
	ctx := tc.Ctx
	admin, _ := api.NewClient(srv.URL, tc.AdminToken())
	tokens := map[string]*api.Client{}
	for _, tn := range []string{"acme", "other"} {
		if err := admin.CreateTenant(ctx, cluster.Tenant{Name: tn}); err != nil {
			t.Fatal(err)
		}
		tok, err := admin.TenantToken(ctx, tn)
		if err != nil {
			t.Fatal(err)
		}
		tokens[tn], _ = api.NewClient(srv.URL, tok)
	}
	const value = "s3cret-ab12cd34ef"
	if _, err := tokens["other"].SetSecret(ctx, "acme", "db", []byte(value)); !errors.Is(err, api.ErrForbidden) {
		t.Errorf("another tenant sets acme's secret: %v", err)
	}
	rep, err := tokens["acme"].SetSecret(ctx, "acme", "db", []byte(value))
	if err != nil || rep.Version != 1 || !rep.Changed || rep.UpdatedBy != "tenant/acme" {
		t.Fatalf("acme sets its secret: %+v %v", rep, err)
	}
	if _, err := admin.SetSecret(ctx, "other", "theirs", []byte("other-value")); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.SetSecret(ctx, "acme", "Bad/Name", []byte(value)); !errors.Is(err, api.ErrBadInput) && !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a bad secret name: %v", err)
	}
	if _, err := tokens["acme"].Secrets(ctx, "other"); !errors.Is(err, api.ErrForbidden) {
		t.Errorf("acme lists other's secrets: %v", err)
	}
	mine, err := tokens["acme"].Secrets(ctx, "")
	if err != nil || len(mine) != 1 || mine[0].Name != "db" || mine[0].Tenant != "acme" {
		t.Errorf("acme's own list: %+v %v", mine, err)
	}
	all, err := admin.Secrets(ctx, "")
	if err != nil || len(all) != 2 {
		t.Errorf("the admin's list: %+v %v", all, err)
	}
	if b, _ := json.Marshal(all); bytes.Contains(b, []byte(value)) {
		t.Errorf("the list shows a value: %s", b)
	}
	if err := tokens["other"].DeleteSecret(ctx, "acme", "db"); !errors.Is(err, api.ErrForbidden) {
		t.Errorf("other deletes acme's secret: %v", err)
	}

	// A job names its own tenant's secrets only; on the master without a keyring, none.
	spec := func(name, tenant, secret string) []byte {
		return []byte("name: " + name + "\ntenant: " + tenant + "\nworkers: 2\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [sleep, '1000']\nsecrets: [" + secret + "]\n")
	}
	if _, err := tokens["other"].SubmitJob(ctx, spec("steal", "other", "db")); !errors.Is(err, api.ErrBadInput) || !strings.Contains(err.Error(), "tenant other has no secret db") {
		t.Errorf("other's job naming acme's secret: %v", err)
	}
	adminToken := tc.AdminToken()
	offClient, _ := api.NewClient(offSrv.URL, adminToken)
	admin, _ = api.NewClient(srv.URL, adminToken) // AdminToken replaced the token
	if _, err := offClient.SubmitJob(ctx, spec("off", "acme", "db")); !errors.Is(err, api.ErrBadInput) || !strings.Contains(err.Error(), "secrets are off on this cluster") {
		t.Errorf("a job with secrets on a master without a keyring: %v", err)
	}
	for _, name := range []string{"steal", "off"} {
		if _, err := admin.Job(ctx, name); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("refused job %s stored: %v", name, err)
		}
	}

	// Two nodes with identities; acme's job runs on them.
	keys := map[string]nodeKeys{"n1": newNodeKeys(t), "n2": newNodeKeys(t)}
	for id, k := range keys {
		tc.Agent(cluster.Node{ID: id, DC: "dc-a", Rack: "r1", Slots: 1, Memory: 4 << 30, CPU: 4000},
			sim.Config{Identity: func(string) *cluster.NodeIdentity { return k.public() }})
	}
	if _, err := tokens["acme"].SubmitJob(ctx, spec("wc", "acme", "db")); err != nil {
		t.Fatal(err)
	}
	var where map[cluster.WorkerKey]string
	testenv.Eventually(t, "both workers assigned", 10*time.Second, func() bool {
		where = tc.Assignments()
		return len(where) == 2
	})
	w0 := cluster.WorkerKey{Job: "wc", Worker: 0}
	node := where[w0]
	otherNode := "n1"
	if node == "n1" {
		otherNode = "n2"
	}
	got, _, err := askSecrets(t, srv.URL, node, []cluster.WorkerKey{w0}, keys[node], keys[node])
	if err != nil || len(got[w0].Secrets) != 1 || string(got[w0].Secrets[0].Value) != value || got[w0].Secrets[0].Version != 1 {
		t.Fatalf("the node's own worker: %+v %v", got, err)
	}
	// Another node asks for it: no value, a one-line reason.
	got, _, err = askSecrets(t, srv.URL, otherNode, []cluster.WorkerKey{w0}, keys[otherNode], keys[otherNode])
	if err != nil || len(got[w0].Secrets) != 0 || !strings.Contains(got[w0].Error, "is not assigned to node "+otherNode) {
		t.Errorf("another node asks for the worker: %+v %v", got, err)
	}
	// Without the node's signature, or signed with another node's key: refused.
	for name, signer := range map[string]nodeKeys{"unsigned": {}, "other node's key": keys[otherNode]} {
		if _, status, err := askSecrets(t, srv.URL, node, []cluster.WorkerKey{w0}, signer, keys[node]); status != http.StatusUnauthorized || err == nil {
			t.Errorf("%s: status %d %v; want 401", name, status, err)
		}
	}
	// The answer opens only with the node's key: a copy read off the wire is of no use.
	if _, _, err := askSecrets(t, srv.URL, node, []cluster.WorkerKey{w0}, keys[node], keys[otherNode]); err == nil {
		t.Error("the sealed answer opened with another node's key")
	}
	// A master that does not lead answers no node.
	if _, status, err := askSecrets(t, offSrv.URL, node, []cluster.WorkerKey{w0}, keys[node], keys[node]); status != http.StatusServiceUnavailable || err == nil {
		t.Errorf("a standby master: %d %v; want 503", status, err)
	}

	// A new value makes a new version, which the worker's assignment names.
	if rep, err := admin.SetSecret(ctx, "acme", "db", []byte(value+"-2")); err != nil || rep.Version != 2 {
		t.Fatalf("rotate: %+v %v", rep, err)
	}
	testenv.Eventually(t, "the assignment names version 2", 10*time.Second, func() bool {
		a, err := readAssignment(ctx, tc, node)
		return err == nil && len(a) > 0 && a[0].Secrets[0].Version == 2
	})
	if err := admin.DeleteSecret(ctx, "acme", "db"); !errors.Is(err, api.ErrConflict) {
		t.Errorf("delete of a secret job wc names: %v", err)
	}

	// Nothing the API answers, records or logs holds a value.
	evs, err := admin.Events(ctx, api.EventFilter{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	st, err := admin.Job(ctx, "wc")
	if err != nil {
		t.Fatal(err)
	}
	for what, v := range map[string]any{"events": evs, "job status": st} {
		b, _ := json.Marshal(v)
		if bytes.Contains(b, []byte(value)) {
			t.Errorf("%s hold the value", what)
		}
	}
	if strings.Contains(logs.String(), value) {
		t.Error("the master's log holds the value")
	}
	if !strings.Contains(logs.String(), "principal=node/"+node) {
		t.Errorf("no audit line for the node's request in:\n%s", logs.String())
	}
}

// readAssignment reads node's workers as the leader wrote them.
func readAssignment(ctx context.Context, tc *clustertest.Sim, node string) ([]cluster.WorkerAssignment, error) {
	key, _ := cluster.AssignmentKey(node)
	e, err := tc.Admin.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	var na cluster.NodeAssignment
	if err := json.Unmarshal(e.Value, &na); err != nil {
		return nil, err
	}
	return na.Workers, nil
}

// TestOutputSecretInClearRefused: on a cluster with secrets on and the tenant's secret
// there, a mirrored job whose output would get that secret unencrypted over a network is
// bad_input at submit and at an update, and the store is left as it was; the same job
// with an encrypted (or loopback) output is taken.
func TestOutputSecretInClearRefused(t *testing.T) {
	tc := clustertest.NewSim(t)
	ring := newRing(t)
	m, _, _ := tc.Master("m1", func(c *master.Config) { c.Keyring = ring })
	testenv.Eventually(t, "leading", 5*time.Second, m.Leader)
	srv, _ := tc.API(m, httpapi.Config{})
	ctx := tc.Ctx
	admin, _ := api.NewClient(srv.URL, tc.AdminToken())
	if err := admin.CreateTenant(ctx, cluster.Tenant{Name: "acme"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.SetSecret(ctx, "acme", "sinkpass", []byte("pw-0f3a")); err != nil {
		t.Fatal(err)
	}
	spec := func(name, output string) []byte {
		return []byte("name: " + name + "\ntenant: acme\nworkers: 1\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [sleep, '60']\n" +
			"links: [dc-a, dc-b]\noutput: " + output + "\noutputSecret: sinkpass\n")
	}
	if _, err := admin.SubmitJob(ctx, spec("wc", "https://hook.example/in")); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.SubmitJob(ctx, spec("local", "nats://127.0.0.1:4222/out")); err != nil {
		t.Fatal(err)
	}
	before := dump(ctx, t, tc.Admin)
	for _, c := range []struct{ output, says string }{
		{"http://hook.example/in", "http://hook.example would get it as a bearer token over plain HTTP: use https://"},
		{"postgres://app@db.example:5432/orders?table=out&sslmode=disable", "the postgres sink at db.example:5432 with sslmode=disable may send the role's password unencrypted: add sslmode=verify-full"},
		{"nats://router@nats.example:4222/out", "the nats sink at nats.example:4222 would get the password or token over plain NATS: add ?tls=true"},
	} {
		if _, err := admin.SubmitJob(ctx, spec("leak", c.output)); !errors.Is(err, api.ErrBadInput) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("submit with output %s: %v; want bad input saying %q", c.output, err, c.says)
		}
		if _, err := admin.UpdateJob(ctx, "wc", spec("wc", c.output), api.PolicyOverrides{}); !errors.Is(err, api.ErrBadInput) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("update to output %s: %v; want bad input saying %q", c.output, err, c.says)
		}
	}
	if after := dump(ctx, t, tc.Admin); !maps.Equal(before, after) {
		t.Fatalf("the refused submits and updates changed the store:\n%s", diffDumps(before, after))
	}
}

// newRing makes a masters' keyring in a temporary file.
func newRing(t *testing.T) *keyring.File {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secrets.key")
	if _, err := keyring.Generate(path); err != nil {
		t.Fatal(err)
	}
	ring, err := keyring.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return ring
}
