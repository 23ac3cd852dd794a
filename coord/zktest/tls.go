package zktest

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/stormdock/stormdock/internal/pki"
)

// testCA is the CA a test's TLS servers' certificates are signed by, made by internal/pki as
// stormdock makes its own.
type testCA struct {
	dir    string
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	pool   *x509.CertPool
	caFile string
}

func newTestCA(dir string) (*testCA, error) {
	certPEM, keyPEM, err := pki.NewCA("zktest CA")
	if err != nil {
		return nil, err
	}
	cert, key, err := pki.ParseCA(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	ca := &testCA{dir: dir, cert: cert, key: key, pool: x509.NewCertPool(), caFile: filepath.Join(dir, "ca.crt")}
	ca.pool.AddCert(cert)
	if err := os.WriteFile(ca.caFile, certPEM, 0o644); err != nil {
		return nil, fmt.Errorf("write the CA: %w", err)
	}
	return ca, nil
}

// setupTLS gives the server a certificate for ip (and localhost) and the test a client
// configuration that trusts the CA (with a client certificate when the server asks).
func (s *Server) setupTLS(ca *testCA, ip string) error {
	certPEM, keyPEM, err := pki.IssueCert(ca.cert, ca.key, []string{ip, "localhost"}, 24*time.Hour)
	if err != nil {
		return err
	}
	pk8, err := pki.PKCS8(keyPEM)
	if err != nil {
		return err
	}
	// ZooKeeper's PEM key store: the key, then the certificate, in one file.
	if err := os.WriteFile(filepath.Join(s.dir, "server.pem"), append(pk8, certPEM...), 0o600); err != nil {
		return fmt.Errorf("write the key store: %w", err)
	}
	s.ca = ca
	s.tls = &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12}
	if s.opts.ClientAuth {
		cert, key, err := s.ClientCert("zktest")
		if err != nil {
			return err
		}
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return err
		}
		s.tls.Certificates = []tls.Certificate{pair}
	}
	return nil
}

// clientConfig is zoo.cfg's client port part: clientPort, or for a TLS server
// secureClientPort alone with Netty and the PEM stores.
func (s *Server) clientConfig(ip string, port int) string {
	if s.ca == nil {
		return fmt.Sprintf("clientPort=%d\nclientPortAddress=%s", port, ip)
	}
	auth := "none"
	if s.opts.ClientAuth {
		auth = "need"
	}
	return fmt.Sprintf(`secureClientPort=%d
secureClientPortAddress=%s
serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory
ssl.keyStore.location=%s
ssl.keyStore.type=PEM
ssl.trustStore.location=%s
ssl.trustStore.type=PEM
ssl.clientAuth=%s`, port, ip, filepath.Join(s.dir, "server.pem"), s.ca.caFile, auth)
}

// CAFile is the PEM file of the CA that signed a TLS server's certificate ("" for a plain
// server): a client's --store-ca.
func (s *Server) CAFile() string {
	if s.ca == nil {
		return ""
	}
	return s.ca.caFile
}

// ClientCert issues a client certificate named name signed by a TLS server's CA, written as
// PEM files in the CA's directory; it returns their paths (--store-cert, --store-key).
func (s *Server) ClientCert(name string) (certFile, keyFile string, err error) {
	if s.ca == nil {
		return "", "", fmt.Errorf("zktest: %s serves no TLS", s)
	}
	certPEM, keyPEM, err := pki.IssueClientCert(s.ca.cert, s.ca.key, name, 24*time.Hour)
	if err != nil {
		return "", "", err
	}
	base := filepath.Join(s.ca.dir, name+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	certFile, keyFile = base+".crt", base+".key"
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// tlsDialer dials through dial (nil: this machine's network) and speaks TLS with cfg.
func tlsDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error), cfg *tls.Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		host, _, _ := net.SplitHostPort(addr)
		c := cfg.Clone()
		c.ServerName = host
		conn := tls.Client(raw, c)
		if err := conn.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, err
		}
		return conn, nil
	}
}

// SessionLiveTLS is SessionLive for a server that serves TLS only, trusting the CA in
// caFile: the shared TLS server of scripts/test (STORMDOCK_ZK_TLS, STORMDOCK_ZK_CA).
func SessionLiveTLS(ctx context.Context, addr, caFile string, sid int64) (bool, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return false, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return false, fmt.Errorf("zktest: %s holds no PEM certificate", caFile)
	}
	return sessionLive(ctx, tlsDialer(nil, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}), addr, sid)
}
