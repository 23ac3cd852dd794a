package agents

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/atomicfile"
	"github.com/stormdock/stormdock/internal/pki"
	"github.com/stormdock/stormdock/multidc"
)

// Output routers serve HTTPS: the agent issues each router it starts a certificate from the
// cluster's router CA (multidc.EnsureRouterCA) for the node's advertised address, and gives
// each link worker the CA's certificate, so that a link worker talks to no one else.
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

// prepareRouterTLS writes, in the worker's lease directory, a router's certificate and key
// (readable by the agent's user alone, which routers run as) or a link worker's copy of the
// router CA's certificate (world-readable: a certificate is public).
func (a *Agent) prepareRouterTLS(ctx context.Context, id string, wa cluster.WorkerAssignment) error {
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
		if err := atomicfile.WriteFile(filepath.Join(dir, routerCAFile), []byte(ca.Cert), 0o644); err != nil {
			return fmt.Errorf("router CA of %s: %w", id, err)
		}
		return nil
	}
	certPEM, keyPEM, err := ca.Issue(pki.CertHosts(a.cfg.Node.Addr))
	if err != nil {
		return fmt.Errorf("router certificate of %s: %w", id, err)
	}
	// The key first: a certificate without its key serves nothing.
	if err := atomicfile.WriteFile(filepath.Join(dir, routerKeyFile), keyPEM, 0o600); err != nil {
		return fmt.Errorf("router key of %s: %w", id, err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, routerCertFile), certPEM, 0o644); err != nil {
		return fmt.Errorf("router certificate of %s: %w", id, err)
	}
	return nil
}

// routerTLSEnv adds the router TLS files to a worker's environment.
func (a *Agent) routerTLSEnv(env map[string]string, id string, wa cluster.WorkerAssignment, mode string) {
	dir := filepath.Dir(a.leaseFile(id))
	switch {
	case isRouter(wa):
		env[multidc.EnvRouterCert] = filepath.Join(dir, routerCertFile)
		env[multidc.EnvRouterKey] = filepath.Join(dir, routerKeyFile)
	case isLinkWorker(wa):
		if mode == cluster.IsolationDocker {
			dir = containerLeaseDir
		}
		env[multidc.EnvRouterCA] = filepath.Join(dir, routerCAFile)
	}
}
