package daemon

import (
	"crypto/tls"
	"fmt"

	"github.com/stormdock/stormdock/internal/pki"
)

// Files of a master's TLS material in its data directory (see package pki).
const (
	CACertFile     = pki.CACertFile
	CAKeyFile      = pki.CAKeyFile
	MasterCertFile = pki.MasterCertFile
	MasterKeyFile  = pki.MasterKeyFile
)

// MasterTLS makes (at the first start) or reads the CA and server certificate in dataDir for
// a master serving at addrs (listen and advertised addresses), and returns the server's
// TLS configuration.
func MasterTLS(dataDir string, addrs ...string) (*tls.Config, error) {
	cert, key, err := pki.EnsureCerts(dataDir, pki.CertHosts(addrs...))
	if err != nil {
		return nil, err
	}
	return ServerTLS(cert, key)
}

// ServerTLS is the TLS configuration of a master serving certFile and keyFile.
func ServerTLS(certFile, keyFile string) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}

// ServerTLSPEM is ServerTLS for a certificate and key given as PEM (a container's
// environment).
func ServerTLSPEM(certPEM, keyPEM []byte) (*tls.Config, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}
