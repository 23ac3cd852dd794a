package commands

import (
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/daemon"
)

// StoreCredentialsFlag names the file with the store's credentials. The credentials
// themselves are never a flag: ps shows command lines to every user of the machine. They
// may come in the environment instead (STORMDOCK_STORE_CREDENTIALS).
var StoreCredentialsFlag = &cli.StringFlag{Name: "store-credentials-file", Usage: "`FILE` holding USER:PASS for ZooKeeper digest ACLs (or USER:PASS in STORMDOCK_STORE_CREDENTIALS)",
	EnvVars: []string{"STORMDOCK_STORE_CREDENTIALS_FILE"}}

// EnvStoreCredentials holds the store's credentials themselves, for processes that get them
// from their environment (a container's).
const EnvStoreCredentials = "STORMDOCK_STORE_CREDENTIALS"

// StoreCredentials reads the store's credentials from --store-credentials-file or the
// environment, and refuses a --store URL that carries credentials on the command line.
func StoreCredentials(c *cli.Context) (string, error) {
	if t, err := coord.ParseURL(c.String("store")); err == nil && t.Credentials != "" && os.Getenv("STORMDOCK_STORE") != c.String("store") {
		return "", UsageErr("--store: credentials in the URL show in ps to every user of this machine: put USER:PASS in a file (mode 0600) and give --store-credentials-file FILE, or set STORMDOCK_STORE_CREDENTIALS")
	}
	if f := c.String("store-credentials-file"); f != "" {
		creds, err := daemon.ReadStoreCredentials(f)
		if err != nil {
			return "", UsageErr("--store-credentials-file: %v", err)
		}
		return creds, nil
	}
	return os.Getenv(EnvStoreCredentials), nil
}

// StoreTLSFlags are the flags of a zks:// store's TLS, on every command that takes --store.
var StoreTLSFlags = []cli.Flag{
	&cli.StringFlag{Name: "store-ca", Usage: "`FILE` (PEM) with the CA that signed the ZooKeeper servers' certificates, for a zks:// store (default: the system's roots)",
		EnvVars: []string{EnvStoreCA}},
	&cli.StringFlag{Name: "store-cert", Usage: "client certificate `FILE` (PEM) for ZooKeeper servers that ask for one (ssl.clientAuth=need), with --store-key",
		EnvVars: []string{EnvStoreCert}},
	&cli.StringFlag{Name: "store-key", Usage: "`FILE` (PEM) with the key of --store-cert",
		EnvVars: []string{EnvStoreKey}},
}

// Environment that names the store's TLS files, for the processes an agent starts (its
// keeper, output routers), as the flags do.
const (
	EnvStoreCA   = "STORMDOCK_STORE_CA"
	EnvStoreCert = "STORMDOCK_STORE_CERT"
	EnvStoreKey  = "STORMDOCK_STORE_KEY"
)

// StoreTLS reads the store's TLS flags, the paths made absolute: an agent hands them on to
// processes that run in other directories.
func StoreTLS(c *cli.Context) (coord.TLSFiles, error) {
	f := coord.TLSFiles{CA: c.String("store-ca"), Cert: c.String("store-cert"), Key: c.String("store-key")}
	if (f.Cert == "") != (f.Key == "") {
		return coord.TLSFiles{}, UsageErr("--store-cert and --store-key go together")
	}
	for _, p := range []*string{&f.CA, &f.Cert, &f.Key} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return coord.TLSFiles{}, UsageErr("store TLS file %q: %v", *p, err)
		}
		if _, err := os.Stat(abs); err != nil {
			return coord.TLSFiles{}, UsageErr("store TLS file: %v", err)
		}
		*p = abs
	}
	return f, nil
}
