package commands

import (
	"os"

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
