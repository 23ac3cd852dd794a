package coord

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// TLSFiles names the PEM files a zks:// client speaks TLS with.
type TLSFiles struct {
	// CA holds the certificates of the CAs that signed the ZooKeeper servers' certificates;
	// empty: the system's roots.
	CA string
	// Cert and Key are the client's certificate and key, for servers that ask for one
	// (ssl.clientAuth=need); both or neither.
	Cert, Key string
}

// clientConfig reads the files into a client TLS configuration. The server name is set per
// connection (tlsDial): each server's certificate is verified against its own host.
func (f TLSFiles) clientConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("%w: TLS: read the CA: %v", ErrInvalid, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: TLS: %s holds no PEM certificate: give --store-ca the CA certificate (PEM) that signed the ZooKeeper servers' certificates", ErrInvalid, f.CA)
		}
		cfg.RootCAs = pool
	}
	switch {
	case f.Cert != "" && f.Key != "":
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("%w: TLS: client certificate: %v", ErrInvalid, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	case f.Cert != "" || f.Key != "":
		return nil, fmt.Errorf("%w: TLS: a client certificate needs both --store-cert and --store-key", ErrInvalid)
	}
	return cfg, nil
}

// tlsError is a TLS handshake with a ZooKeeper server that failed in a way no retry mends:
// the server's certificate does not verify, or the server refused the client's. Open fails
// at once with it instead of waiting out its connect timeout.
type tlsError struct {
	addr string
	msg  string
	err  error
}

func (e *tlsError) Error() string { return "TLS: " + e.msg }
func (e *tlsError) Unwrap() error { return e.err }

// classifyTLS turns a handshake error with addr into a *tlsError that says what to do, or
// returns nil for errors a retry may mend (a timeout, a server still starting).
func classifyTLS(addr string, err error) *tlsError {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		alert    tls.AlertError
	)
	switch {
	case errors.As(err, &unknown):
		return &tlsError{addr, "certificate signed by unknown authority: give --store-ca the CA that signed the ZooKeeper servers' certificates", err}
	case errors.As(err, &hostname):
		return &tlsError{addr, fmt.Sprintf("%s: give the servers certificates naming the hosts of the store URL, or name the servers in it as their certificates do", hostname.Error()), err}
	case errors.As(err, &invalid):
		return &tlsError{addr, fmt.Sprintf("server %s: %v", addr, invalid.Error()), err}
	case errors.As(err, &alert):
		switch alert {
		case 42, 46, 48, 116: // bad_certificate, certificate_unknown, unknown_ca, certificate_required
			return &tlsError{addr, fmt.Sprintf("server %s refused the client certificate (%v): give --store-cert and --store-key a certificate signed by a CA the servers trust", addr, err), err}
		}
	}
	var verify *tls.CertificateVerificationError
	if errors.As(err, &verify) {
		return &tlsError{addr, fmt.Sprintf("server %s: %v", addr, verify.Err), err}
	}
	return nil
}

// tlsDial wraps dial with a TLS handshake, bounded by timeout, verifying the server's
// certificate against the host it was dialled at. Handshakes that fail for good are sent to
// fatal (without blocking) so that Open can stop waiting.
func tlsDial(dial func(network, address string, timeout time.Duration) (net.Conn, error), cfg *tls.Config, fatal chan<- error) func(network, address string, timeout time.Duration) (net.Conn, error) {
	return func(network, address string, timeout time.Duration) (net.Conn, error) {
		raw, err := dial(network, address, timeout)
		if err != nil {
			return nil, err
		}
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			raw.Close()
			return nil, err
		}
		c := cfg.Clone()
		c.ServerName = host
		conn := tls.Client(raw, c)
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := conn.HandshakeContext(ctx); err != nil {
			raw.Close()
			if te := classifyTLS(address, err); te != nil {
				select {
				case fatal <- te:
				default:
				}
				return nil, te
			}
			return nil, fmt.Errorf("TLS handshake with %s: %w", address, err)
		}
		return conn, nil
	}
}

// ProbeDialer is dial (nil: net.Dialer) for the probes of a zks:// store's servers
// (ProbeServers): their four-letter words go over TLS too. The handshake happens at the
// first write, so a server that accepts connections but answers nothing still counts as
// hung, not as silent.
func (f TLSFiles) ProbeDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) (func(ctx context.Context, network, addr string) (net.Conn, error), error) {
	cfg, err := f.clientConfig()
	if err != nil {
		return nil, err
	}
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
		return tls.Client(raw, c), nil
	}, nil
}
