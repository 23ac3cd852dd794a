package docker_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord/zktest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/provision"
	pdocker "github.com/stormdock/stormdock/provision/docker"
)

// TestCreateOnTLSStore: a cluster created on a ZooKeeper that serves TLS only and wants a
// client certificate (ssl.clientAuth=need) comes up, runs a job and scales out: its master
// and every agent speak TLS with the files given to create. Judged from the host: the files
// are kept in the cluster's directory (the key 0400) and reach the containers as read-only
// bind mounts named on their command lines, the key never in a container's environment,
// command line or labels. A zks:// store with no CA is refused before anything starts.
func TestCreateOnTLSStore(t *testing.T) {
	srv := zktest.Start(t, zktest.Options{TLS: true, ClientAuth: true})
	cert, key, err := srv.ClientCert("cluster")
	if err != nil {
		t.Fatal(err)
	}
	p, spec, dc := newProvider(t, 1)
	spec.Store = srv.URL("/stormdock-test-" + spec.Name)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(4*time.Minute))
	defer cancel()

	if _, err := p.Create(ctx, spec); !errors.Is(err, provision.ErrBadSpec) || !strings.Contains(err.Error(), "--store-ca") {
		t.Fatalf("create on zks:// without --store-ca: %v; want a bad spec naming --store-ca", err)
	}
	spec.StoreTLS.CA = srv.CAFile()
	spec.StoreTLS.Cert, spec.StoreTLS.Key = cert, key
	c, err := p.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if c.Store != spec.Store || c.Ready() != 1 {
		t.Fatalf("cluster on %s with %d/%d agents registered", c.Store, c.Ready(), len(c.Agents))
	}

	tokens := provision.Tokens{Dir: p.TokenDir()}
	kept, err := tokens.StoreTLS(spec.Name)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, _ := os.ReadFile(key)
	for _, f := range []struct {
		path string
		mode os.FileMode
	}{{kept.CA, 0o444}, {kept.Cert, 0o444}, {kept.Key, 0o400}} {
		fi, err := os.Stat(f.path)
		if err != nil || fi.Mode().Perm() != f.mode {
			t.Errorf("kept store TLS file %q: %v, mode %v; want %v", f.path, err, fi.Mode().Perm(), f.mode)
		}
	}
	// The key is the master's uid's (the image's USER, 65534), in the operator's 0700
	// directory.
	if fi, err := os.Stat(kept.Key); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 65534 {
		t.Errorf("kept key %s: %v; want it owned by uid 65534", kept.Key, err)
	}
	if fi, err := os.Stat(filepath.Dir(kept.Key)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("cluster directory: %v, mode %v; want 0700", err, fi.Mode().Perm())
	}
	if b, _ := os.ReadFile(kept.Key); string(b) != string(keyPEM) {
		t.Errorf("kept key %s is not the key given", kept.Key)
	}

	// The containers as the engine shows them: a job runs, then a second agent (scale
	// reads the files from the cluster's directory, not from the spec label) joins.
	cl := apiClient(t, tokens, c)
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "t1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SubmitJob(ctx, jobSpec(1)); err != nil {
		t.Fatal(err)
	}
	settled(t, cl, 1, time.Minute)
	if c, err = p.Scale(ctx, spec.Name, 2); err != nil {
		t.Fatal(err)
	}
	if c.Ready() != 2 {
		t.Fatalf("%d/2 agents registered after scale", c.Ready())
	}
	ctrs, err := dc.ContainerList(ctx, container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", pdocker.LabelCluster+"="+spec.Name))})
	if err != nil || len(ctrs) != 3 {
		t.Fatalf("containers: %d, %v; want the master and 2 agents", len(ctrs), err)
	}
	secret := strings.TrimSpace(string(keyPEM))
	for _, ct := range ctrs {
		info, err := dc.ContainerInspect(ctx, ct.ID)
		if err != nil {
			t.Fatal(err)
		}
		args := strings.Join(info.Args, " ")
		for _, want := range []string{"--store " + spec.Store, "--store-ca /etc/stormdock/store-tls/ca.pem",
			"--store-cert /etc/stormdock/store-tls/cert.pem", "--store-key /etc/stormdock/store-tls/key.pem"} {
			if !strings.Contains(args, want) {
				t.Errorf("container %s: command line %q lacks %q", info.Name, args, want)
			}
		}
		for _, src := range []string{kept.CA, kept.Cert, kept.Key} {
			if !slices.ContainsFunc(info.Mounts, func(m container.MountPoint) bool { return m.Source == src && !m.RW }) {
				t.Errorf("container %s: no read-only mount of %s: %+v", info.Name, src, info.Mounts)
			}
		}
		where := map[string]string{"command line": args, "environment": strings.Join(info.Config.Env, "\n")}
		for k, v := range info.Config.Labels {
			where["label "+k] = v
		}
		for what, s := range where {
			if strings.Contains(s, secret) || strings.Contains(s, key) {
				t.Errorf("container %s: the store's client key (or its path on the host) is in its %s", info.Name, what)
			}
		}
	}
	// Destroy reaches the store over TLS too (its admin token's hash goes) and leaves
	// nothing on the engine; the TLS files stay, with the credentials, for the chroot.
	if err := p.Destroy(ctx, spec.Name); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(t, dc, spec.Name); len(left) > 0 {
		t.Errorf("destroy left %v", left)
	}
	if f, err := tokens.StoreTLS(spec.Name); err != nil || f != kept {
		t.Errorf("store TLS files after destroy: %+v, %v; want them kept", f, err)
	}
}
