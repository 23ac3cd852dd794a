package tools

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// TestRefusedInput: arguments that name nothing valid, secrets on the command line and
// unknown users are refused with exit 2 and one line that says what to do, before anything
// is contacted.
func TestRefusedInput(t *testing.T) {
	t.Setenv("STORMDOCK_STORE", "")
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"job", "status", "../tenants/demo", "--master", "http://127.0.0.1:1"}, "must be 1-63 lower-case letters"},
		{[]string{"job", "kill", "wc\n", "--master", "http://127.0.0.1:1"}, `"wc\n" must be 1-63`},
		{[]string{"tenant", "token", "Démo", "--master", "http://127.0.0.1:1"}, "must be 1-63"},
		{[]string{"node", "drain", "..", "--master", "http://127.0.0.1:1"}, "must be 1-63"},
		{[]string{"dc", "fail", "dc-a/../x", "--master", "http://127.0.0.1:1"}, "must be 1-63"},
		{[]string{"link", "failover", "wc", "--to", "../x", "--router", "http://127.0.0.1:1"}, "--to: link"},
		{[]string{"cluster", "destroy", "../../etc"}, "cluster name"},
		{[]string{"master", "--store", "zk://user:s3cret@127.0.0.1:1/x"}, "--store-credentials-file"},
		{[]string{"agent", "--store", "zk://u:p@127.0.0.1:1/x", "--node-id", "n1", "--dc", "dc-a", "--rack", "r1",
			"--slots", "1", "--memory", "1Gi", "--cpu", "1"}, "--store-credentials-file"},
		{[]string{"agent", "--store", "mem://", "--node-id", "n1", "--dc", "dc-a", "--rack", "r1",
			"--slots", "1", "--memory", "1Gi", "--cpu", "1", "--run-as", "no-such-user-here"}, "--run-as"},
		{[]string{"agent", "--store", "mem://", "--node-id", "N_1", "--dc", "dc-a", "--rack", "r1",
			"--slots", "1", "--memory", "1Gi", "--cpu", "1"}, "--node-id"},
		{[]string{"agent", "--store", "mem://", "--node-id", "n1", "--dc", "dc-a", "--rack", "r1",
			"--slots", "1", "--memory", "1Gi", "--cpu", "1", "--logs-listen", "nowhere"}, "--logs-listen"},
		{[]string{"events", "--since", "yesterday", "--master", "http://127.0.0.1:1"}, "--since"},
		{[]string{"events", "--job", "../x", "--master", "http://127.0.0.1:1"}, "--job"},
		{[]string{"events", "-o", "yaml", "--master", "http://127.0.0.1:1"}, "-o must be"},
		{[]string{"job", "logs", "wc", "--previous", "-f", "--master", "http://127.0.0.1:1"}, "cannot be followed"},
		{[]string{"master", "--store", "mem://", "--events-max", "0"}, "--events-max"},
		{[]string{"image", "build", "--label", "no-value"}, "want KEY=VALUE"},
		{[]string{"image", "build", "--label", "bad key=x"}, "want KEY=VALUE"},
		{[]string{"image", "build", "--label", "io.stormdock.image=false"}, "set by the builder"},
		{[]string{"image", "build", "--label", "team=a\nFROM evil"}, "without control characters"},
		{[]string{"bench", "cluster", "--store", "mem://", "--nodes", "200", "--workers", "2000", "--dcs", "4", "--racks", "5"}, "must be a ZooKeeper URL"},
		{[]string{"bench", "cluster", "--store", "zk://127.0.0.1:1", "--nodes", "100", "--workers", "20000", "--dcs", "4", "--racks", "5"}, "must fit in --nodes x --slots"},
		{[]string{"bench", "cluster", "--store", "zk://127.0.0.1:1", "--nodes", "200", "--workers", "2000", "--dcs", "4", "--racks", "5", "--master", "remote"}, "--master must be"},
		{[]string{"bench", "cluster", "--store", "zk://127.0.0.1:1", "--nodes", "200", "--workers", "2000", "--dcs", "4", "--racks", "5", "-o", "yaml"}, "-o must be"},
	} {
		app := App()
		var out bytes.Buffer
		app.Writer, app.ErrWriter = &out, &out
		app.ExitErrHandler = func(*cli.Context, error) {}
		err := app.RunContext(context.Background(), reorderArgs(app, append([]string{"stormdock"}, tc.args...)))
		var ec cli.ExitCoder
		if !errors.As(err, &ec) || ec.ExitCode() != 2 || !strings.Contains(err.Error(), tc.says) || strings.Contains(err.Error(), "\n") {
			t.Errorf("stormdock %q: %v; want exit 2, one line saying %q", tc.args, err, tc.says)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("stormdock %q: the error repeats the secret: %v", tc.args, err)
		}
	}
}
