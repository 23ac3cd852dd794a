// Command zktls writes what a TLS-only ZooKeeper test server needs, made by stormdock's own
// pki: DIR/ca.crt (the CA clients trust) and DIR/server.pem (ZooKeeper's PEM key store: the
// PKCS #8 key, then the certificate for HOST...). scripts/test runs it for its shared server.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/stormdock/stormdock/internal/pki"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: zktls DIR HOST...")
		os.Exit(2)
	}
	if err := write(os.Args[1], os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "zktls:", err)
		os.Exit(1)
	}
}

func write(dir string, hosts []string) error {
	caPEM, caKeyPEM, err := pki.NewCA("stormdock test ZooKeeper CA")
	if err != nil {
		return err
	}
	ca, caKey, err := pki.ParseCA(caPEM, caKeyPEM)
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := pki.IssueCert(ca, caKey, hosts, 7*24*time.Hour)
	if err != nil {
		return err
	}
	pk8, err := pki.PKCS8(keyPEM)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), caPEM, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "server.pem"), append(pk8, certPEM...), 0o600)
}
