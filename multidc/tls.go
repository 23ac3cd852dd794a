package multidc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/pki"
)

// Routers serve HTTPS with a certificate their agent issues from the cluster's router CA,
// kept in the store (cluster.RouterCAKey, made by whichever master or agent needs it
// first). Link workers get the CA's certificate as a file (EnvRouterCA); masters and the
// CLI read it from the store.

// Environment of a router and of link workers, set by their agent.
const (
	// EnvRouterCert and EnvRouterKey name the router's certificate and key files.
	EnvRouterCert = "STORMDOCK_ROUTER_CERT"
	EnvRouterKey  = "STORMDOCK_ROUTER_KEY"
	// EnvRouterCA names the file with the router CA's certificate, which a Sender trusts.
	EnvRouterCA = "STORMDOCK_ROUTER_CA"
)

// routerCertLifetime is how long a router's certificate lasts: the agent issues a new one
// at every start of the router.
const routerCertLifetime = 90 * 24 * time.Hour

// RouterCA is the router CA's record in the store.
type RouterCA struct {
	Cert string `json:"cert"` // PEM
	Key  string `json:"key"`  // PEM
}

// EnsureRouterCA reads the router CA from the store, making it first when there is none.
func EnsureRouterCA(ctx context.Context, kv coord.KV) (RouterCA, error) {
	for range 3 {
		e, err := kv.Get(ctx, cluster.RouterCAKey)
		if err == nil {
			var ca RouterCA
			if err := json.Unmarshal(e.Value, &ca); err != nil || ca.Cert == "" || ca.Key == "" {
				return RouterCA{}, fmt.Errorf("multidc: the router CA at %s is not readable", cluster.RouterCAKey)
			}
			return ca, nil
		}
		if !errors.Is(err, coord.ErrNotFound) {
			return RouterCA{}, fmt.Errorf("multidc: read the router CA: %w", err)
		}
		certPEM, keyPEM, err := pki.NewCA("stormdock router CA")
		if err != nil {
			return RouterCA{}, err
		}
		ca := RouterCA{Cert: string(certPEM), Key: string(keyPEM)}
		b, _ := json.Marshal(ca)
		_, err = kv.Create(ctx, cluster.RouterCAKey, b, coord.Persistent)
		if err == nil {
			return ca, nil
		}
		if !errors.Is(err, coord.ErrExists) {
			return RouterCA{}, fmt.Errorf("multidc: store the router CA: %w", err)
		}
		// Another process made it at the same moment: read theirs.
	}
	return RouterCA{}, errors.New("multidc: the router CA keeps changing")
}

// Pool is a certificate pool holding the CA alone.
func (ca RouterCA) Pool() (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(ca.Cert)) {
		return nil, fmt.Errorf("multidc: the router CA at %s holds no certificate", cluster.RouterCAKey)
	}
	return pool, nil
}

// Issue makes a router's certificate for hosts (its node's advertised address and the
// loopback names), PEM.
func (ca RouterCA) Issue(hosts []string) (certPEM, keyPEM []byte, err error) {
	cert, key, err := pki.ParseCA([]byte(ca.Cert), []byte(ca.Key))
	if err != nil {
		return nil, nil, err
	}
	return pki.IssueCert(cert, key, hosts, routerCertLifetime)
}

// RouterPool reads the router CA's certificate from a file (EnvRouterCA).
func RouterPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("multidc: router CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("multidc: router CA %s holds no PEM certificate", file)
	}
	return pool, nil
}

// httpClient is an HTTP client with timeout that trusts pool (nil: the system's roots) for
// https routers.
func httpClient(timeout time.Duration, pool *x509.CertPool) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Timeout: timeout, Transport: tr}
}

// NewPeerClient is the client a router asks another router with (Config.PeerClient): it
// trusts the router CA in file (EnvRouterCA) and no other.
func NewPeerClient(file string) (*http.Client, error) {
	pool, err := RouterPool(file)
	if err != nil {
		return nil, err
	}
	return httpClient(peerTimeout, pool), nil
}
