package agents

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/isolation"
)

// TestWorkerUser: who each worker runs as, by isolation, the agent's uid and capabilities,
// and --run-as; never root, never the agent's own uid, and an agent that cannot switch
// users refuses tenants' process workers with one line saying what to do, while docker
// workers still get their tenant's uid.
func TestWorkerUser(t *testing.T) {
	const all = ^uint64(0)
	setid := uint64(1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID)
	root := self{euid: 0, canSwitch: canSwitch(0, all)}
	capable := self{euid: 1500, canSwitch: canSwitch(1500, setid)}
	plain := self{euid: 1500, canSwitch: canSwitch(1500, 0)}
	halfCap := self{euid: 1500, canSwitch: canSwitch(1500, 1<<unix.CAP_SETUID)}
	rootNoCaps := self{euid: 0, canSwitch: canSwitch(0, 0)} // a container with --cap-drop ALL
	nobody := &isolation.User{UID: 65534, GID: 65534, Name: "nobody"}
	asAgent := &isolation.User{UID: 1500, GID: 1500}
	tenant := cluster.WorkerAssignment{Key: cluster.WorkerKey{Job: "j"}, Tenant: "a", UID: 200000}
	router := tenant
	router.System, router.UID = true, 200001
	noUID := tenant
	noUID.UID = 0
	agentUID := tenant
	agentUID.UID = 1500
	for _, c := range []struct {
		name  string
		wa    cluster.WorkerAssignment
		mode  string
		runAs *isolation.User
		me    self
		want  int    // uid; -1: as the agent (nil user)
		err   string // part of the refusal
	}{
		{"root agent, process worker", tenant, cluster.IsolationProcess, nil, root, 200000, ""},
		{"root agent, router", router, cluster.IsolationProcess, nil, root, 200001, ""},
		{"root agent, docker worker", tenant, cluster.IsolationDocker, nil, root, 200000, ""},
		{"capable agent, process worker", tenant, cluster.IsolationProcess, nil, capable, 200000, ""},
		{"plain agent refuses a process worker", tenant, cluster.IsolationProcess, nil, plain, 0, "CAP_SETUID and CAP_SETGID"},
		{"half-capable agent refuses", tenant, cluster.IsolationProcess, nil, halfCap, 0, "run the agent as root"},
		{"root without capabilities refuses", tenant, cluster.IsolationProcess, nil, rootNoCaps, 0, "--run-as for a single-tenant node"},
		{"plain agent refuses a router", router, cluster.IsolationProcess, nil, plain, 0, "CAP_SETUID"},
		{"plain agent, docker worker: the engine switches", tenant, cluster.IsolationDocker, nil, plain, 200000, ""},
		{"no uid: never anyone else", noUID, cluster.IsolationProcess, nil, root, 0, "no uid"},
		{"no uid, docker", noUID, cluster.IsolationDocker, nil, root, 0, "no uid"},
		{"the agent's own uid", agentUID, cluster.IsolationProcess, nil, capable, 0, "the agent's own"},
		{"the agent's own uid, docker", agentUID, cluster.IsolationDocker, nil, plain, 0, "the agent's own"},
		{"--run-as nobody", tenant, cluster.IsolationProcess, nobody, root, 65534, ""},
		{"--run-as leaves docker workers their uid", tenant, cluster.IsolationDocker, nobody, root, 200000, ""},
		{"--run-as leaves routers theirs", router, cluster.IsolationProcess, nobody, root, 200001, ""},
		{"--run-as as the agent itself", tenant, cluster.IsolationProcess, asAgent, plain, -1, ""},
		{"--run-as itself, router of a plain agent", router, cluster.IsolationProcess, asAgent, plain, -1, ""},
		{"--run-as another user needs a switch", tenant, cluster.IsolationProcess, nobody, plain, 0, "needs a switch"},
	} {
		t.Run(c.name, func(t *testing.T) {
			u, err := workerUser(c.wa, c.mode, c.runAs, c.me)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("user %v, err %v; want a one-line refusal with %q", u, err, c.err)
				}
				if strings.Contains(c.err, "CAP_") && !errors.Is(err, ErrNoSwitch) {
					t.Errorf("err %v does not wrap ErrNoSwitch", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c.want < 0 && u != nil:
				t.Fatalf("runs as %v, want as the agent", u)
			case c.want < 0:
			case u == nil || int(u.UID) != c.want:
				t.Fatalf("runs as %v, want uid %d", u, c.want)
			case c.runAs == nil && (int(u.GID) != c.want || len(u.Groups) != 0):
				t.Fatalf("runs as %v, want gid %d and no supplementary groups", u, c.want)
			}
			if u != nil && (u.UID == 0 || int(u.UID) == c.me.euid) {
				t.Fatalf("runs as %v: root or the agent's own uid", u)
			}
		})
	}
}
