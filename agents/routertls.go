package agents

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/pki"
	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/multidc"
)

// Output routers serve HTTPS: the agent issues each router it starts a certificate from the
// cluster's router CA (multidc.EnsureRouterCA) for the node's advertised address, and gives
// each link worker the CA's certificate, so that a link worker talks to no one else. Routers
// and link workers run as their tenants' uids: each gets its own copies, owned by it.
const (
	routerCertFile = "router.crt"
	routerKeyFile  = "router.key"
	routerCAFile   = "router-ca.crt"
)

// routerCA is the router CA, read from the store once.
type routerCA struct {
	mu sync.Mutex
	ca *multidc.RouterCA
}

func (a *Agent) routerCA(ctx context.Context) (multidc.RouterCA, error) {
	a.rca.mu.Lock()
	defer a.rca.mu.Unlock()
	if a.rca.ca != nil {
		return *a.rca.ca, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ca, err := multidc.EnsureRouterCA(ctx, a.store)
	if err != nil {
		return multidc.RouterCA{}, err
	}
	a.rca.ca = &ca
	return ca, nil
}

// isRouter reports whether the assignment is a mirrored job's output router.
func isRouter(wa cluster.WorkerAssignment) bool { return wa.System && isRouterName(wa.Key.Job) }

// isLinkWorker reports whether the assignment is a link worker of a mirrored job (it sends
// to the routers).
func isLinkWorker(wa cluster.WorkerAssignment) bool { return !wa.System && wa.OutputToken != "" }

// Names of a router's copies of the store's TLS files in its lease directory: it runs as
// its tenant's uid, which cannot read the agent's.
const (
	storeCAFile   = "store-ca.crt"
	storeCertFile = "store-client.crt"
	storeKeyFile  = "store-client.key"
)

// prepareRouterTLS writes, in the worker's lease directory and owned by its user u, a
// router's certificate and key (the key 0400) and its copies of the store's TLS files, or a
// link worker's copy of the router CA's certificate.
func (a *Agent) prepareRouterTLS(ctx context.Context, id string, wa cluster.WorkerAssignment, mode string, u *isolation.User) error {
	if !isRouter(wa) && !isLinkWorker(wa) {
		return nil
	}
	ca, err := a.routerCA(ctx)
	if err != nil {
		return fmt.Errorf("router TLS of %s: %w", id, err)
	}
	dir := filepath.Dir(a.leaseFile(id))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("router TLS of %s: %w", id, err)
	}
	if isLinkWorker(wa) {
		if err := writeOwned(filepath.Join(dir, routerCAFile), []byte(ca.Cert), 0o444, u); err != nil {
			return fmt.Errorf("router CA of %s: %w", id, err)
		}
		return nil
	}
	certPEM, keyPEM, err := ca.Issue(pki.CertHosts(a.cfg.Node.Addr))
	if err != nil {
		return fmt.Errorf("router certificate of %s: %w", id, err)
	}
	type file struct {
		name string
		b    []byte
		perm os.FileMode
	}
	// The CA too: a router of a fencing sink asks the other router whether it leads.
	files := []file{{routerKeyFile, keyPEM, 0o400}, {routerCertFile, certPEM, 0o444}, {routerCAFile, []byte(ca.Cert), 0o444}} // the key first
	for _, f := range []struct {
		src, name string
		perm      os.FileMode
	}{{a.cfg.StoreTLS.CA, storeCAFile, 0o444}, {a.cfg.StoreTLS.Cert, storeCertFile, 0o444}, {a.cfg.StoreTLS.Key, storeKeyFile, 0o400}} {
		if f.src == "" {
			continue
		}
		b, err := os.ReadFile(f.src)
		if err != nil {
			return fmt.Errorf("store TLS files for router %s: %w", id, err)
		}
		files = append(files, file{f.name, b, f.perm})
	}
	for _, f := range files {
		if err := writeOwned(filepath.Join(dir, f.name), f.b, f.perm, u); err != nil {
			return fmt.Errorf("router TLS of %s: %s: %w", id, f.name, err)
		}
	}
	return nil
}

// routerTLSEnv adds the router TLS files, and a router's copies of the store's, to a
// worker's environment.
func (a *Agent) routerTLSEnv(env map[string]string, id string, wa cluster.WorkerAssignment, mode string) {
	switch {
	case isRouter(wa):
		env[multidc.EnvRouterCert] = a.workerPath(id, mode, routerCertFile)
		env[multidc.EnvRouterKey] = a.workerPath(id, mode, routerKeyFile)
		env[multidc.EnvRouterCA] = a.workerPath(id, mode, routerCAFile)
		for _, f := range [][3]string{{EnvStoreCA, a.cfg.StoreTLS.CA, storeCAFile}, {EnvStoreCert, a.cfg.StoreTLS.Cert, storeCertFile}, {EnvStoreKey, a.cfg.StoreTLS.Key, storeKeyFile}} {
			if f[1] != "" {
				env[f[0]] = a.workerPath(id, mode, f[2])
			}
		}
	case isLinkWorker(wa):
		env[multidc.EnvRouterCA] = a.workerPath(id, mode, routerCAFile)
	}
}
