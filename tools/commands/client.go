// Package commands holds what stormdock's commands share: how they reach a master or the
// store, exit codes, argument checks and output formats. The client commands are its
// sub-packages, one per noun, as in containerd's cmd/ctr/commands.
package commands

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

// MasterFlags are the flags of every command that talks to a master.
func MasterFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "master", Usage: "master API `URL` (default: the local cluster's, from its data directory's api.url, or " + DefaultMaster + ")", EnvVars: []string{"STORMDOCK_MASTER"}},
		&cli.StringFlag{Name: "token", Usage: "API `TOKEN` (default: the local cluster's admin token)", EnvVars: []string{"STORMDOCK_TOKEN"}},
		&cli.StringFlag{Name: "ca", Usage: "trust the CA certificate in `FILE` for an https:// master, instead of the system's (default: the local cluster's ca.crt, when there is one)", EnvVars: []string{"STORMDOCK_CA"}},
	}
}

// OutputFlag selects table or JSON output.
var OutputFlag = &cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "output format: table or json", Value: "table"}

// tokenSourceKey keeps, in the command's metadata, where the token came from, so that a
// refused token's error can say which file held it.
const tokenSourceKey = "stormdock.tokenSource"

// NewClient builds the API client from the command's flags.
func NewClient(c *cli.Context) (*api.Client, error) {
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
			if p := filepath.Join(DefaultDataDir(), daemon.CACertFile); fileExists(p) {
				ca = p
			}
		}
		if ca != "" {
			pool, err := api.CAPool(ca)
			if err != nil {
				return nil, UsageErr("--ca: %v", err)
			}
			opts = append(opts, api.WithRootCAs(pool))
		}
	}
	cl, err := api.NewClient(master, token, opts...)
	if err != nil {
		return nil, UsageErr("%v", err)
	}
	return cl, nil
}

// localMaster is the URL the local cluster's master wrote to its data directory, or
// DefaultMaster.
func localMaster() string {
	b, err := os.ReadFile(filepath.Join(DefaultDataDir(), api.URLFile))
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
	path = filepath.Join(DefaultDataDir(), api.AdminTokenFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return "", ""
	}
	return strings.TrimSpace(string(b)), path
}

// UsageErr is a bad-usage or bad-input failure: exit code 2.
func UsageErr(format string, args ...any) error {
	return cli.Exit("stormdock: "+fmt.Sprintf(format, args...), 2)
}

// APIErr turns a client error into an exit with the code api's table gives it. A token
// refused when the CLI took it from a data directory names that file: it may be another
// cluster's.
func APIErr(c *cli.Context, err error) error {
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

// WantArgs checks the number of positional arguments.
func WantArgs(c *cli.Context, n int, names string) error {
	if c.NArg() != n {
		return UsageErr("%s takes %s (flags may go before or after it); got %d argument(s)", c.Command.FullName(), names, c.NArg())
	}
	return nil
}

// WantName checks that the command got exactly one positional argument and that it is a
// valid name (cluster.CheckName): a name that is not valid is refused here, before any
// request is made.
func WantName(c *cli.Context, names string) error {
	if err := WantArgs(c, 1, names); err != nil {
		return err
	}
	if err := cluster.CheckName(c.Args().First()); err != nil {
		return UsageErr("%s: %v", names, err)
	}
	return nil
}

// PrintOut writes v as JSON or, for -o table, through the table function.
func PrintOut(c *cli.Context, v any, table func(w io.Writer)) error {
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
		return UsageErr("-o must be table or json, not %q", c.String("output"))
	}
}

// Clip shortens s to n characters so that tables fit 100 columns.
func Clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// DefaultDataDir is where a master or local cluster keeps its files: $STORMDOCK_DATA, or
// ~/.stormdock.
func DefaultDataDir() string {
	if dir := os.Getenv("STORMDOCK_DATA"); dir != "" {
		return dir
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ".stormdock"
	}
	return filepath.Join(home, ".stormdock")
}

// OrDash is s, or "-" for an empty table cell.
func OrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// IsTerminal reports that w is a terminal, where progress lines may be redrawn in place.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
