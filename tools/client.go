package tools

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/daemon"
)

// DefaultMaster is where a local cluster serves its API.
const DefaultMaster = "http://127.0.0.1:7070"

// masterFlags are the flags of every command that talks to a master.
func masterFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "master", Usage: "master API `URL` (default: the local cluster's, from its data directory's api.url, or " + DefaultMaster + ")", EnvVars: []string{"STORMDOCK_MASTER"}},
		&cli.StringFlag{Name: "token", Usage: "API `TOKEN` (default: the local cluster's admin token)", EnvVars: []string{"STORMDOCK_TOKEN"}},
		&cli.StringFlag{Name: "ca", Usage: "trust the CA certificate in `FILE` for an https:// master, instead of the system's (default: the local cluster's ca.crt, when there is one)", EnvVars: []string{"STORMDOCK_CA"}},
	}
}

// outputFlag selects table or JSON output.
var outputFlag = &cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "output format: table or json", Value: "table"}

// tokenSourceKey keeps, in the command's metadata, where the token came from, so that a
// refused token's error can say which file held it.
const tokenSourceKey = "stormdock.tokenSource"

// newClient builds the API client from the command's flags.
func newClient(c *cli.Context) (*api.Client, error) {
	token := c.String("token")
	if token == "" {
		var path string
		token, path = localAdminToken()
		if token != "" {
			if c.App.Metadata == nil {
				c.App.Metadata = map[string]any{}
			}
			c.App.Metadata[tokenSourceKey] = path
		}
	}
	master := c.String("master")
	if master == "" {
		master = localMaster()
	}
	var opts []api.ClientOption
	if strings.HasPrefix(master, "https://") {
		ca := c.String("ca")
		if ca == "" {
			if p := filepath.Join(defaultDataDir(), daemon.CACertFile); fileExists(p) {
				ca = p
			}
		}
		if ca != "" {
			pool, err := api.CAPool(ca)
			if err != nil {
				return nil, usageErr("--ca: %v", err)
			}
			opts = append(opts, api.WithRootCAs(pool))
		}
	}
	cl, err := api.NewClient(master, token, opts...)
	if err != nil {
		return nil, usageErr("%v", err)
	}
	return cl, nil
}

// localMaster is the URL the local cluster's master wrote to its data directory, or
// DefaultMaster.
func localMaster() string {
	b, err := os.ReadFile(filepath.Join(defaultDataDir(), api.URLFile))
	if u := strings.TrimSpace(string(b)); err == nil && u != "" {
		return u
	}
	return DefaultMaster
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// localAdminToken finds the admin token a local cluster wrote, so that the CLI works
// against it without setup, and says which file it read.
func localAdminToken() (token, path string) {
	path = filepath.Join(defaultDataDir(), api.AdminTokenFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return "", ""
	}
	return strings.TrimSpace(string(b)), path
}

// usageErr is a bad-usage or bad-input failure: exit code 2.
func usageErr(format string, args ...any) error {
	return cli.Exit("stormdock: "+fmt.Sprintf(format, args...), 2)
}

// apiErr turns a client error into an exit with the code api's table gives it. A token
// refused when the CLI took it from a data directory names that file: it may be another
// cluster's.
func apiErr(c *cli.Context, err error) error {
	if err == nil {
		return nil
	}
	msg := strings.ReplaceAll(err.Error(), "\n", "; ")
	if errors.Is(err, api.ErrUnauthorized) && c != nil {
		if path, ok := c.App.Metadata[tokenSourceKey].(string); ok {
			msg += fmt.Sprintf(" (the token was read from %s: pass --token or STORMDOCK_TOKEN for another cluster)", path)
		}
	}
	return cli.Exit("stormdock: "+msg, api.ExitCode(err))
}

// wantArgs checks the number of positional arguments.
func wantArgs(c *cli.Context, n int, names string) error {
	if c.NArg() != n {
		return usageErr("%s takes %s (flags may go before or after it); got %d argument(s)", c.Command.FullName(), names, c.NArg())
	}
	return nil
}

// wantName checks that the command got exactly one positional argument and that it is a
// valid name (cluster.CheckName): a name that is not valid is refused here, before any
// request is made.
func wantName(c *cli.Context, names string) error {
	if err := wantArgs(c, 1, names); err != nil {
		return err
	}
	if err := cluster.CheckName(c.Args().First()); err != nil {
		return usageErr("%s: %v", names, err)
	}
	return nil
}

// printOut writes v as JSON or, for -o table, through the table function.
func printOut(c *cli.Context, v any, table func(w io.Writer)) error {
	switch c.String("output") {
	case "json":
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "table", "":
		tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
		table(tw)
		return tw.Flush()
	default:
		return usageErr("-o must be table or json, not %q", c.String("output"))
	}
}

// clip shortens s to n characters so that tables fit 100 columns.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// defaultDataDir is where a master or local cluster keeps its files: $STORMDOCK_DATA, or
// ~/.stormdock.
func defaultDataDir() string {
	if dir := os.Getenv("STORMDOCK_DATA"); dir != "" {
		return dir
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ".stormdock"
	}
	return filepath.Join(home, ".stormdock")
}
