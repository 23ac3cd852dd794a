package agents

import (
	"reflect"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord"
)

// A keeper process reads back exactly what its agent put on its command line: a setting
// lost on the way (the rejoin hold was, once: the keeper ran with its default whatever the
// agent was told) changes when the node's workers stop.
func TestKeeperArgsRoundTrip(t *testing.T) {
	for _, want := range []KeeperArgs{
		{Store: "zk://10.0.0.1:2181/sd", Node: "n1", Host: "h1", StateDir: "/var/lib/sd", SessionTimeout: 2 * time.Second},
		{Store: "zks://a:2281,b:2281/sd", Credentials: "/etc/sd/creds", TLS: coord.TLSFiles{CA: "/ca", Cert: "/c", Key: "/k"},
			Node: "n2", Host: "h2", StateDir: "/s", SessionTimeout: 10 * time.Second, RestartGrace: 30 * time.Second,
			StoreSilence: 4 * time.Second, RejoinGrace: time.Second},
	} {
		got, err := ParseKeeperArgs(want.Args()[1:])
		if err != nil {
			t.Fatalf("ParseKeeperArgs(%q): %v", want.Args(), err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("ParseKeeperArgs(Args(x)) = %+v, want %+v (args %q)", got, want, want.Args())
		}
	}
}
