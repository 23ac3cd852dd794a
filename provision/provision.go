package provision

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// Errors a Provider wraps; test with errors.Is.
var (
	// ErrNotFound: no cluster of that name on this provider.
	ErrNotFound = errors.New("unknown cluster")
	// ErrExists: a cluster of that name is already there.
	ErrExists = errors.New("cluster exists")
	// ErrBadSpec: the request itself is wrong (bad name, count, store URL...).
	ErrBadSpec = errors.New("bad cluster spec")
	// ErrUnavailable: the provider's engine cannot be reached or lacks something (dockerd
	// down, image missing, Nomad unreachable).
	ErrUnavailable = errors.New("provider unavailable")
)

// Provider runs stormdock clusters on one kind of resource. Every call finds the cluster
// again from the provider's own records (container labels, job meta): no local state is
// needed besides the admin token file.
type Provider interface {
	// Create starts a master and spec.Agents agents and returns once every agent is
	// registered in the store. A failure removes everything the call created.
	Create(ctx context.Context, spec Spec) (Cluster, error)
	// Scale sets the number of agents. New agents join and take work; removed agents are
	// drained through the master's API first, so that their workers run elsewhere before
	// the agents go.
	Scale(ctx context.Context, name string, agents int) (Cluster, error)
	// Status reports the cluster's master and agents.
	Status(ctx context.Context, name string) (Cluster, error)
	// Destroy removes the cluster's master and agents and its admin token.
	Destroy(ctx context.Context, name string) error
	// List returns the clusters on this provider, by name.
	List(ctx context.Context) ([]Summary, error)
}

// Spec describes a cluster to create. Zero fields take the defaults of Defaults.
type Spec struct {
	Name       string   `json:"name"`
	Agents     int      `json:"agents"`
	DCs        []string `json:"dcs"`
	RacksPerDC int      `json:"racksPerDC"`
	// Slots is the worker slots of each agent.
	Slots int `json:"slots"`
	// AgentMemory and AgentCPU bound each agent with all its workers.
	AgentMemory cluster.Bytes `json:"agentMemory"`
	AgentCPU    cluster.CPU   `json:"agentCPU"`
	// MasterMemory and MasterCPU bound the master.
	MasterMemory cluster.Bytes `json:"masterMemory"`
	MasterCPU    cluster.CPU   `json:"masterCPU"`
	// Image is the stormdock image (FROM scratch with the binary at /stormdock).
	Image string `json:"image"`
	// Store is the ZooKeeper ensemble and chroot the cluster keeps its state in:
	// zk://HOST:PORT[,HOST:PORT]/CHROOT, or zks:// for its TLS port (secureClientPort).
	// Every container must reach it.
	Store string `json:"store"`
	// StoreTLS names the files (on the operator's machine) of a zks:// store's TLS: Create
	// copies them into the cluster's directory (Tokens.KeepStoreTLS) and every container
	// gets them from there. Never in the spec's JSON: the spec is a container label.
	StoreTLS coord.TLSFiles `json:"-"`
	// SessionTimeout is the store session timeout of the master and agents: how fast a
	// lost agent is noticed.
	SessionTimeout time.Duration `json:"sessionTimeout"`
	// AgentArgs are extra flags given to every agent (e.g. --health-dir).
	AgentArgs []string `json:"agentArgs,omitempty"`
	// DockerWorkers lets the agents run docker workers too, pulling their images (Docker
	// provider: the engine's socket goes into every agent, which is root on the host).
	DockerWorkers bool `json:"dockerWorkers,omitempty"`
	// RegistryAuth is the path, on the Docker host, of Docker's config.json with the
	// credentials the master pins and the agents pull images with (Docker provider).
	RegistryAuth string `json:"registryAuth,omitempty"`
}

// Defaults of a Spec.
const (
	DefaultSlots          = 4
	DefaultAgentMemory    = 2 << 30
	DefaultAgentCPU       = 2000
	DefaultMasterMemory   = 512 << 20
	DefaultMasterCPU      = 1000
	DefaultRacksPerDC     = 1
	DefaultSessionTimeout = 4 * time.Second
	DefaultDC             = "dc-a"
)

// WithDefaults returns the spec with its zero fields set.
func (s Spec) WithDefaults() Spec {
	if len(s.DCs) == 0 {
		s.DCs = []string{DefaultDC}
	}
	if s.RacksPerDC == 0 {
		s.RacksPerDC = DefaultRacksPerDC
	}
	if s.Slots == 0 {
		s.Slots = DefaultSlots
	}
	if s.AgentMemory == 0 {
		s.AgentMemory = DefaultAgentMemory
	}
	if s.AgentCPU == 0 {
		s.AgentCPU = DefaultAgentCPU
	}
	if s.MasterMemory == 0 {
		s.MasterMemory = DefaultMasterMemory
	}
	if s.MasterCPU == 0 {
		s.MasterCPU = DefaultMasterCPU
	}
	if s.SessionTimeout == 0 {
		s.SessionTimeout = DefaultSessionTimeout
	}
	return s
}

// Validate checks a spec (after WithDefaults) and says every problem at once.
func (s Spec) Validate() error {
	var ps []string
	if err := CheckName(s.Name); err != nil {
		ps = append(ps, err.Error())
	}
	if s.Agents < 0 {
		ps = append(ps, fmt.Sprintf("agents %d must not be negative", s.Agents))
	}
	for _, dc := range s.DCs {
		if err := cluster.CheckName(dc); err != nil {
			ps = append(ps, "dc "+err.Error())
		}
	}
	if s.RacksPerDC < 1 {
		ps = append(ps, fmt.Sprintf("racks per dc %d must be at least 1", s.RacksPerDC))
	}
	if s.Slots < 1 {
		ps = append(ps, fmt.Sprintf("slots %d must be at least 1", s.Slots))
	}
	if s.AgentMemory < 64<<20 || s.MasterMemory < 64<<20 {
		ps = append(ps, "agent and master memory must be at least 64Mi")
	}
	if s.AgentCPU < 100 || s.MasterCPU < 100 {
		ps = append(ps, "agent and master cpu must be at least 0.1")
	}
	if s.Image == "" {
		ps = append(ps, "an image is required")
	}
	if err := CheckStore(s.Store); err != nil {
		ps = append(ps, err.Error())
	}
	if t, err := coord.ParseURL(s.Store); err == nil && !t.TLS && s.StoreTLS != (coord.TLSFiles{}) {
		ps = append(ps, "--store-ca, --store-cert and --store-key are for a zks:// store: give the store's TLS port as zks://HOST:PORT/CHROOT")
	}
	if (s.StoreTLS.Cert == "") != (s.StoreTLS.Key == "") {
		ps = append(ps, "--store-cert and --store-key go together")
	}
	if s.SessionTimeout < 500*time.Millisecond {
		ps = append(ps, fmt.Sprintf("session timeout %s must be at least 500ms", s.SessionTimeout))
	}
	if len(ps) > 0 {
		return fmt.Errorf("%w: %s", ErrBadSpec, strings.Join(ps, "; "))
	}
	return nil
}

// CheckName checks a cluster name: a DNS label of at most 40 characters, so that
// container, job and node names built from it stay valid.
func CheckName(name string) error {
	if err := cluster.CheckName(name); err != nil || len(name) > 40 {
		return fmt.Errorf("cluster name %q must be 1-40 lower-case letters, digits or '-', starting and ending with a letter or digit", name)
	}
	return nil
}

// CheckStore checks that a store URL names a ZooKeeper ensemble with a chroot: the only
// store that processes in separate containers or machines can share.
func CheckStore(url string) error {
	t, err := coord.ParseURL(url)
	if err != nil {
		return fmt.Errorf("store: %v", err)
	}
	if t.Scheme != "zk" || t.Chroot == "" || t.Chroot == "/" {
		return fmt.Errorf("store %q must be zk://HOST:PORT/CHROOT or zks://HOST:PORT/CHROOT: an existing ZooKeeper ensemble and a chroot of the cluster's own", url)
	}
	return nil
}

// Cluster is a cluster as a provider finds it.
type Cluster struct {
	Name     string `json:"name"`
	Provider string `json:"provider"`
	// API is the master's API URL ("" while unknown).
	API    string   `json:"api"`
	Store  string   `json:"store"`
	Image  string   `json:"image"`
	Master Member   `json:"master"`
	Agents []Member `json:"agents"`
	// Spec is the spec the cluster was created with, with its current agent count.
	Spec Spec `json:"spec"`
	// Warnings say what could not be checked (e.g. the store did not answer).
	Warnings []string `json:"warnings,omitempty"`
}

// Member is the master or one agent: a container or an allocation.
type Member struct {
	// Name is the container name or the allocation's name; ID the container or allocation id.
	Name string `json:"name"`
	ID   string `json:"id"`
	// Node is the agent's node id ("" for the master).
	Node string `json:"node,omitempty"`
	DC   string `json:"dc,omitempty"`
	Rack string `json:"rack,omitempty"`
	// State is the container's or allocation's state (running, exited, pending...).
	State string `json:"state"`
	// Registered: the agent's node record is in the store (the master: it leads).
	Registered bool `json:"registered"`
}

// Ready counts the agents that are registered.
func (c Cluster) Ready() int {
	n := 0
	for _, a := range c.Agents {
		if a.Registered {
			n++
		}
	}
	return n
}

// Summary is one row of List.
type Summary struct {
	Name     string `json:"name"`
	Provider string `json:"provider"`
	API      string `json:"api"`
	Store    string `json:"store"`
	Agents   int    `json:"agents"`
	State    string `json:"state"` // the master's state
}

// Slot is where agent number Index (0-based) sits: agents are spread over the data
// centers first and then over each one's racks, round-robin, so any prefix of the agents
// is as balanced as it can be and a scale-in that removes the highest indexes keeps it so.
type Slot struct {
	Index int
	Node  string
	DC    string
	Rack  string
}

// SlotAt returns the identity of agent i of a cluster.
func (s Spec) SlotAt(i int) Slot {
	dc := s.DCs[i%len(s.DCs)]
	rack := fmt.Sprintf("r%d", (i/len(s.DCs))%s.RacksPerDC+1)
	return Slot{Index: i, Node: fmt.Sprintf("%s-a%d", s.Name, i+1), DC: dc, Rack: rack}
}
