// Package pki makes the certificates stormdock serves TLS with: a CA of the cluster's own
// and server certificates it signs, kept as PEM files with private keys mode 0600.
package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/stormdock/stormdock/internal/atomicfile"
	"golang.org/x/sys/unix"
)

// Files of a master's TLS material in its data directory. The CA signs the server
// certificate; clients trust ca.crt (the CLI finds it in the data directory by itself).
const (
	CACertFile     = "ca.crt"
	CAKeyFile      = "ca.key"
	MasterCertFile = "master.crt"
	MasterKeyFile  = "master.key"
)

// Lifetimes of what EnsureCerts makes. A server certificate is made again at start when it
// has less than certRenew left, or does not cover the addresses the master serves.
const (
	caLifetime   = 10 * 365 * 24 * time.Hour
	certLifetime = 397 * 24 * time.Hour
	certRenew    = 30 * 24 * time.Hour
)

// CertHosts lists the names and addresses a master's certificate must cover: the hosts of
// its listen and advertised addresses and the loopback names; for a listener on every
// interface, the machine's name and every address of its interfaces.
func CertHosts(addrs ...string) []string {
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	add := func(h string) {
		if h != "" && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			host = a
		}
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			if name, err := os.Hostname(); err == nil {
				add(name)
			}
			ifaddrs, _ := net.InterfaceAddrs()
			for _, ia := range ifaddrs {
				if ipn, ok := ia.(*net.IPNet); ok {
					add(ipn.IP.String())
				}
			}
			continue
		}
		add(host)
	}
	return hosts
}

// EnsureCerts makes, in dir, what a master needs to serve TLS: a CA (ca.crt, ca.key) at
// the first start, and a server certificate signed by it (master.crt, master.key) covering
// hosts, made again when it does not cover them or is about to expire. Keys are mode 0600.
// It returns the server certificate's and key's paths.
func EnsureCerts(dir string, hosts []string) (certFile, keyFile string, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("tls: make %s: %w", dir, err)
	}
	// Masters that share a data directory (on one host) and start at once would each make
	// a CA, and one's key could end up beside the other's certificate: one at a time.
	unlock, err := lockDir(dir)
	if err != nil {
		return "", "", err
	}
	defer unlock()
	ca, caKey, err := ensureCA(dir)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, MasterCertFile), filepath.Join(dir, MasterKeyFile)
	if certValid(certFile, keyFile, ca, hosts) {
		return certFile, keyFile, nil
	}
	certPEM, keyPEM, err := IssueCert(ca, caKey, hosts, certLifetime)
	if err != nil {
		return "", "", err
	}
	if err := WriteFiles(map[string][]byte{certFile: certPEM}, 0o644); err != nil {
		return "", "", err
	}
	if err := WriteFiles(map[string][]byte{keyFile: keyPEM}, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// lockDir takes an exclusive lock on dir's TLS material (a lock file beside it), held until
// the returned function is called.
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("tls: lock %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("tls: lock %s: %w", dir, err)
	}
	return func() { f.Close() }, nil // closing the descriptor releases the lock
}

const lockFile = "tls.lock"

// ensureCA reads the CA in dir, making it first when there is none.
func ensureCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certFile, keyFile := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	if _, err := os.Stat(certFile); errors.Is(err, os.ErrNotExist) {
		certPEM, keyPEM, err := NewCA("stormdock CA")
		if err != nil {
			return nil, nil, err
		}
		// The key first: a CA certificate whose key is lost can sign nothing new.
		if err := WriteFiles(map[string][]byte{keyFile: keyPEM}, 0o600); err != nil {
			return nil, nil, err
		}
		if err := WriteFiles(map[string][]byte{certFile: certPEM}, 0o644); err != nil {
			return nil, nil, err
		}
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: read the CA in %s: %w", dir, err)
	}
	ca, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, fmt.Errorf("tls: read the CA in %s: %w", dir, err)
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, fmt.Errorf("tls: the CA key %s is not an ECDSA key", keyFile)
	}
	return ca, key, nil
}

// certValid reports whether the certificate in certFile, with its key, is signed by ca,
// covers every host and has more than certRenew left.
func certValid(certFile, keyFile string, ca *x509.Certificate, hosts []string) bool {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return false
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil || cert.CheckSignatureFrom(ca) != nil || time.Until(cert.NotAfter) < certRenew {
		return false
	}
	for _, h := range hosts {
		if cert.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

// NewCA makes a self-signed CA certificate and its key, PEM-encoded.
func NewCA(name string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"stormdock"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(caLifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: CA certificate: %w", err)
	}
	return encode(der, key)
}

// IssueCert makes a server certificate for hosts (names and IP addresses) signed by the CA.
func IssueCert(ca *x509.Certificate, caKey *ecdsa.PrivateKey, hosts []string, lifetime time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: server key: %w", err)
	}
	tmpl := serverTemplate("stormdock master", lifetime, hosts)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: server certificate: %w", err)
	}
	return encode(der, key)
}

// ParseCA reads a CA certificate and key given as PEM.
func ParseCA(certPEM, keyPEM []byte) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: CA: %w", err)
	}
	ca, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, fmt.Errorf("tls: CA: %w", err)
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, errors.New("tls: the CA key is not an ECDSA key")
	}
	return ca, key, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func encode(der []byte, key *ecdsa.PrivateKey) (certPEM, keyPEM []byte, err error) {
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), nil
}

// WriteFiles writes each file atomically (a temporary file renamed over it) with mode. The
// temporary file's name is unique: masters sharing a data directory (a local cluster's, a
// test's) write its api.url at the same moment, and a shared name let one rename the other's
// file away between its write and its chmod.
func WriteFiles(files map[string][]byte, mode os.FileMode) error {
	for path, b := range files {
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, b) {
			continue
		}
		if err := atomicfile.WriteFile(path, b, mode); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return nil
}

// EnsureSelfSigned makes, in dir, a self-signed server certificate and key (certFile,
// keyFile) for hosts, unless a valid one covering them with more than certRenew left is
// there already. Agents serve their logs with it; masters trust it by its SHA-256, which the
// agent publishes in its node record, so no CA has to be handed to every node. It returns
// the TLS certificate and that SHA-256 (hex, of the DER bytes).
func EnsureSelfSigned(dir, certFile, keyFile string, hosts []string) (tls.Certificate, string, error) {
	certFile, keyFile = filepath.Join(dir, certFile), filepath.Join(dir, keyFile)
	if pair, err := tls.LoadX509KeyPair(certFile, keyFile); err == nil {
		if cert, err := x509.ParseCertificate(pair.Certificate[0]); err == nil && time.Until(cert.NotAfter) > certRenew && covers(cert, hosts) {
			sum := sha256.Sum256(cert.Raw)
			return pair, hex.EncodeToString(sum[:]), nil
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, "", fmt.Errorf("tls: make %s: %w", dir, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("tls: key: %w", err)
	}
	tmpl := serverTemplate("stormdock agent", certLifetime, hosts)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("tls: certificate: %w", err)
	}
	certPEM, keyPEM, err := encode(der, key)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	if err := WriteFiles(map[string][]byte{keyFile: keyPEM}, 0o600); err != nil {
		return tls.Certificate{}, "", err
	}
	if err := WriteFiles(map[string][]byte{certFile: certPEM}, 0o644); err != nil {
		return tls.Certificate{}, "", err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("tls: %w", err)
	}
	sum := sha256.Sum256(der)
	return pair, hex.EncodeToString(sum[:]), nil
}

func covers(cert *x509.Certificate, hosts []string) bool {
	for _, h := range hosts {
		if cert.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

// serverTemplate is the template of a server certificate named name, valid for lifetime
// (from an hour ago: clocks differ), for the hosts given as IP addresses or DNS names.
func serverTemplate(name string, lifetime time.Duration, hosts []string) *x509.Certificate {
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name, Organization: []string{"stormdock"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return tmpl
}

// IssueClientCert makes a client certificate named name (its common name) signed by the CA,
// for servers that ask their clients for one (a ZooKeeper server with ssl.clientAuth=need).
func IssueClientCert(ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string, lifetime time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: client key: %w", err)
	}
	tmpl := serverTemplate(name, lifetime, nil)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: client certificate: %w", err)
	}
	return encode(der, key)
}

// PKCS8 re-encodes a PEM private key (as encode writes it, SEC 1) as PKCS #8 ("PRIVATE
// KEY"), the form Java's PEM key stores read (a ZooKeeper server's ssl.keyStore).
func PKCS8(keyPEM []byte) ([]byte, error) {
	b, _ := pem.Decode(keyPEM)
	if b == nil {
		return nil, errors.New("tls: no PEM key")
	}
	key, err := x509.ParseECPrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("tls: key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("tls: key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}
