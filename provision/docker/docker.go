// Package docker provisions stormdock clusters on a Docker host: a master container and N
// agent containers from the FROM scratch stormdock image, on the host network.
//
// With Spec.DockerWorkers the agents run docker workers too, as sibling containers on the
// same engine (whose socket they get), pulling their images from registries; their state is
// then a host directory under Config.StateRoot rather than a tmpfs.
//
// Containers carry the cluster's name, role, node identity, API URL, store URL and spec in
// labels (see labels.go), so every command finds a cluster again without local state. Each
// agent container is the node: its memory and cpu limits bound the agent and all its
// workers, which run through the process driver, unconfined where (as usual in a
// container) no nested cgroup hierarchy is writable. State directories are tmpfs mounts on
// a read-only root, so removing the containers leaves nothing behind.
package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/provision"
)

// API is the part of the Docker client the provider uses; *client.Client implements it.
type API interface {
	ContainerCreate(ctx context.Context, config *container.Config, hostConfig *container.HostConfig, networkingConfig *network.NetworkingConfig, platform *ocispec.Platform, containerName string) (container.CreateResponse, error)
	ContainerStart(ctx context.Context, containerID string, options container.StartOptions) error
	ContainerStop(ctx context.Context, containerID string, options container.StopOptions) error
	ContainerRemove(ctx context.Context, containerID string, options container.RemoveOptions) error
	ContainerList(ctx context.Context, options container.ListOptions) ([]container.Summary, error)
	ContainerInspect(ctx context.Context, containerID string) (container.InspectResponse, error)
	ContainerLogs(ctx context.Context, containerID string, options container.LogsOptions) (io.ReadCloser, error)
	ImageInspect(ctx context.Context, imageID string, opts ...client.ImageInspectOption) (image.InspectResponse, error)
}

// Config configures a Provider.
type Config struct {
	// API is the Docker engine (docker.Connect in isolation/docker makes one).
	API API
	// Tokens is where admin tokens are kept. Default provision.DefaultTokenDir().
	Tokens provision.Tokens
	// Token, when set, is used for the master's API instead of the token file.
	Token string
	// StartTimeout bounds the wait for the master to lead and the agents to register.
	// Default 60s.
	StartTimeout time.Duration
	// DrainTimeout bounds the wait for a scale-in's drain. Default 2m.
	DrainTimeout time.Duration
	// StopGrace is how long a removed agent gets between SIGTERM and SIGKILL. Default 10s.
	StopGrace time.Duration
	// StateRoot is the directory on the Docker host under which agents that run docker
	// workers keep their state (CLUSTER/NODE), mounted into the agent at the same path: the
	// workers' lease files are bind-mounted into their containers from the host. Default
	// DefaultStateRoot. The provider must run on the Docker host for it.
	StateRoot string
	// DockerSocket is the engine's socket on the Docker host, mounted into agents that run
	// docker workers. Default /var/run/docker.sock.
	DockerSocket string
	Logger       *slog.Logger
}

// DefaultStateRoot is Config.StateRoot's default.
const DefaultStateRoot = "/var/lib/stormdock/clusters"

// Provider runs stormdock clusters on one Docker engine. It implements provision.Provider.
type Provider struct {
	api API
	cfg Config
	log *slog.Logger
}

var _ provision.Provider = (*Provider)(nil)

// New returns a Provider on cfg.API.
func New(cfg Config) (*Provider, error) {
	if cfg.API == nil {
		return nil, errors.New("provision/docker: a Docker API client is required")
	}
	if cfg.Tokens.Dir == "" {
		cfg.Tokens.Dir = provision.DefaultTokenDir()
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 2 * time.Minute
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = 10 * time.Second
	}
	if cfg.StateRoot == "" {
		cfg.StateRoot = DefaultStateRoot
	}
	if cfg.DockerSocket == "" {
		cfg.DockerSocket = "/var/run/docker.sock"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Provider{api: cfg.API, cfg: cfg, log: cfg.Logger.With("provider", Name)}, nil
}

// Name is the provider's name in Cluster.Provider and on the command line.
const Name = "docker"

// Create implements provision.Provider.
func (p *Provider) Create(ctx context.Context, spec provision.Spec) (_ provision.Cluster, err error) {
	spec = spec.WithDefaults()
	if err := spec.Validate(); err != nil {
		return provision.Cluster{}, err
	}
	if existing, err := p.containers(ctx, spec.Name); err != nil {
		return provision.Cluster{}, err
	} else if len(existing) > 0 {
		return provision.Cluster{}, fmt.Errorf("%w: %s has %d container(s) on this engine: destroy it first (stormdock cluster destroy %s)", provision.ErrExists, spec.Name, len(existing), spec.Name)
	}
	img, err := p.api.ImageInspect(ctx, spec.Image)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return provision.Cluster{}, fmt.Errorf("%w: image %s not found: build it with `stormdock image build --tag %s`", provision.ErrUnavailable, spec.Image, spec.Image)
		}
		return provision.Cluster{}, fmt.Errorf("inspect image %s: %w", spec.Image, err)
	}
	if img.Config == nil || img.Config.Labels[images.LabelShim] == "" {
		p.log.Warn("the image has no stormdock-shim: its agents start every worker through the whole stormdock binary; rebuild it with stormdock image build beside a stormdock-shim",
			"image", spec.Image)
	}
	// ZooKeeper ACLs and TLS, with no setup: the credentials and the CA are made now (or
	// found, when the cluster is created again over its old state) in the cluster's
	// directory beside the admin token.
	creds, err := p.cfg.Tokens.StoreCredentials(spec.Name, true)
	if err != nil {
		return provision.Cluster{}, err
	}
	certPEM, keyPEM, err := p.cfg.Tokens.MasterTLS(spec.Name)
	if err != nil {
		return provision.Cluster{}, err
	}
	imageUser := ""
	if img.Config != nil {
		imageUser = img.Config.User
	}
	if err := p.keepStoreTLS(spec, imageUser); err != nil {
		return provision.Cluster{}, err
	}
	store, err := p.cfg.Tokens.OpenStore(ctx, spec.Name, spec.Store, p.log)
	if err != nil {
		return provision.Cluster{}, err
	}
	defer store.Close()

	// Everything below is undone, in reverse, if a later step fails.
	var undo []func(context.Context)
	defer func() {
		if err == nil {
			return
		}
		p.log.Warn("create failed: removing what it made", "cluster", spec.Name, "err", err)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i](rctx)
		}
	}()
	_, undoToken, err := p.cfg.Tokens.Install(ctx, store, spec.Name)
	if err != nil {
		return provision.Cluster{}, err
	}
	undo = append(undo, undoToken)
	undo = append(undo, func(ctx context.Context) { p.removeAll(ctx, spec.Name) })
	if spec.DockerWorkers {
		undo = append(undo, func(context.Context) { _ = os.RemoveAll(filepath.Join(p.cfg.StateRoot, spec.Name)) })
	}

	port, err := freePort()
	if err != nil {
		return provision.Cluster{}, err
	}
	apiURL := "https://127.0.0.1:" + strconv.Itoa(port)
	ring, err := p.cfg.Tokens.SecretsKeyring(spec.Name)
	if err != nil {
		return provision.Cluster{}, err
	}
	masterEnv := []string{envStoreCredentials + "=" + creds, envTLSCertPEM + "=" + string(certPEM), envTLSKeyPEM + "=" + string(keyPEM),
		envSecretsKeyring + "=" + ring}
	if _, err := p.startMaster(ctx, spec, port, masterEnv); err != nil {
		return provision.Cluster{}, err
	}
	wctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	if err := p.waitMaster(wctx, spec.Name, apiURL); err != nil {
		return provision.Cluster{}, err
	}
	slots := make([]provision.Slot, spec.Agents)
	for i := range slots {
		slots[i] = spec.SlotAt(i)
	}
	if err := p.startAgents(ctx, spec, slots, []string{envStoreCredentials + "=" + creds}); err != nil {
		return provision.Cluster{}, err
	}
	if err := p.waitAgents(wctx, store, spec.Name, slots); err != nil {
		return provision.Cluster{}, err
	}
	p.log.Info("cluster created", "cluster", spec.Name, "api", apiURL, "agents", spec.Agents)
	return p.Status(ctx, spec.Name)
}

// Scale implements provision.Provider.
func (p *Provider) Scale(ctx context.Context, name string, agents int) (provision.Cluster, error) {
	if agents < 0 {
		return provision.Cluster{}, fmt.Errorf("%w: agents %d must not be negative", provision.ErrBadSpec, agents)
	}
	ctrs, err := p.containers(ctx, name)
	if err != nil {
		return provision.Cluster{}, err
	}
	if len(ctrs) == 0 {
		return provision.Cluster{}, unknown(name)
	}
	spec, apiURL, err := specOf(ctrs)
	if err != nil {
		return provision.Cluster{}, err
	}
	cur := agentsOf(ctrs)
	switch {
	case agents > len(cur):
		err = p.scaleOut(ctx, spec, cur, agents-len(cur))
	case agents < len(cur):
		err = p.scaleIn(ctx, spec, apiURL, cur[agents:])
	}
	if err != nil {
		return provision.Cluster{}, err
	}
	return p.Status(ctx, name)
}

// scaleOut starts n agents at the lowest free indexes and waits until they register; if
// one fails, the new agents are removed again.
func (p *Provider) scaleOut(ctx context.Context, spec provision.Spec, cur []container.Summary, n int) (err error) {
	used := map[int]bool{}
	for _, c := range cur {
		i, _ := strconv.Atoi(c.Labels[LabelIndex])
		used[i] = true
	}
	var slots []provision.Slot
	for i := 0; len(slots) < n; i++ {
		if !used[i] {
			slots = append(slots, spec.SlotAt(i))
		}
	}
	creds, err := p.cfg.Tokens.StoreCredentials(spec.Name, false)
	if err != nil {
		return err
	}
	store, err := p.cfg.Tokens.OpenStore(ctx, spec.Name, spec.Store, p.log)
	if err != nil {
		return err
	}
	defer store.Close()
	defer func() {
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			for _, s := range slots {
				p.remove(rctx, containerName(s.Node), 0)
			}
		}
	}()
	var env []string
	if creds != "" {
		env = []string{envStoreCredentials + "=" + creds}
	}
	if err := p.startAgents(ctx, spec, slots, env); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	if err := p.waitAgents(wctx, store, spec.Name, slots); err != nil {
		return err
	}
	p.log.Info("scaled out", "cluster", spec.Name, "added", len(slots))
	return nil
}

// scaleIn drains the victims' nodes through the master, then removes their containers.
func (p *Provider) scaleIn(ctx context.Context, spec provision.Spec, apiURL string, victims []container.Summary) error {
	api, err := p.client(spec.Name, apiURL)
	if err != nil {
		return err
	}
	nodes := make([]string, len(victims))
	for i, c := range victims {
		nodes[i] = c.Labels[LabelNode]
	}
	dctx, cancel := context.WithTimeout(ctx, p.cfg.DrainTimeout)
	defer cancel()
	if err := provision.Drain(dctx, api, nodes, p.log); err != nil {
		return err
	}
	for _, c := range victims {
		if err := p.remove(ctx, c.ID, p.cfg.StopGrace); err != nil {
			return err
		}
	}
	if err := provision.Undrain(ctx, api, nodes); err != nil {
		p.log.Warn("removed agents stay marked draining", "nodes", nodes, "err", err)
	}
	p.log.Info("scaled in", "cluster", spec.Name, "removed", nodes)
	return nil
}

// client is an admin client for the cluster's master.
func (p *Provider) client(name, apiURL string) (*api.Client, error) {
	token := p.cfg.Token
	if token == "" {
		var err error
		if token, err = p.cfg.Tokens.Read(name); err != nil {
			return nil, err
		}
	}
	opts, err := p.cfg.Tokens.ClientOptions(name)
	if err != nil {
		return nil, err
	}
	return api.NewClient(apiURL, token, opts...)
}

// Status implements provision.Provider.
func (p *Provider) Status(ctx context.Context, name string) (provision.Cluster, error) {
	ctrs, err := p.containers(ctx, name)
	if err != nil {
		return provision.Cluster{}, err
	}
	if len(ctrs) == 0 {
		return provision.Cluster{}, unknown(name)
	}
	spec, apiURL, err := specOf(ctrs)
	if err != nil {
		return provision.Cluster{}, err
	}
	ags := agentsOf(ctrs)
	spec.Agents = len(ags)
	c := provision.Cluster{Name: name, Provider: Name, API: apiURL, Store: spec.Store, Image: spec.Image, Spec: spec}
	var reg map[string]bool
	if store, err := p.cfg.Tokens.OpenStore(ctx, name, spec.Store, p.log); err != nil {
		c.Warnings = append(c.Warnings, err.Error())
	} else {
		reg, err = provision.Registered(ctx, store)
		if err != nil {
			c.Warnings = append(c.Warnings, err.Error())
		}
		if api, err := provision.MasterAPI(ctx, store); err == nil {
			c.Master.Registered = api == apiURL
		}
		store.Close()
	}
	for _, ct := range ctrs {
		if ct.Labels[LabelRole] == roleMaster {
			c.Master.Name, c.Master.ID, c.Master.State = containerName0(ct), ct.ID, ct.State
		}
	}
	for _, ct := range ags {
		c.Agents = append(c.Agents, provision.Member{
			Name: containerName0(ct), ID: ct.ID, Node: ct.Labels[LabelNode], DC: ct.Labels[LabelDC],
			Rack: ct.Labels[LabelRack], State: ct.State, Registered: reg[ct.Labels[LabelNode]],
		})
	}
	return c, nil
}

// Destroy implements provision.Provider.
func (p *Provider) Destroy(ctx context.Context, name string) error {
	ctrs, err := p.containers(ctx, name)
	if err != nil {
		return err
	}
	if len(ctrs) == 0 {
		return unknown(name)
	}
	spec, _, specErr := specOf(ctrs)
	if err := p.removeAll(ctx, name); err != nil {
		return err
	}
	if err := p.removeWorkers(ctx, ctrs); err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(p.cfg.StateRoot, name)); err != nil {
		return fmt.Errorf("remove agents' state: %w", err)
	}
	// The token goes with the cluster; the rest of the store (jobs, tenants) stays in the
	// chroot for the operator to keep or delete.
	storeURL := ""
	if specErr == nil {
		storeURL = spec.Store
	}
	p.cfg.Tokens.Forget(ctx, storeURL, name, p.log)
	p.log.Info("cluster destroyed", "cluster", name, "containers", len(ctrs))
	return nil
}

// List implements provision.Provider.
func (p *Provider) List(ctx context.Context) ([]provision.Summary, error) {
	ctrs, err := p.api.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", LabelCluster))})
	if err != nil {
		return nil, engineErr("list containers", err)
	}
	byName := map[string]*provision.Summary{}
	for _, c := range ctrs {
		name := c.Labels[LabelCluster]
		s := byName[name]
		if s == nil {
			s = &provision.Summary{Name: name, Provider: Name, Store: c.Labels[LabelStore], State: "no master"}
			byName[name] = s
		}
		switch c.Labels[LabelRole] {
		case roleMaster:
			s.API, s.State = c.Labels[LabelAPI], c.State
		case roleAgent:
			s.Agents++
		}
	}
	out := make([]provision.Summary, 0, len(byName))
	for _, s := range byName {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b provision.Summary) int { return compareStrings(a.Name, b.Name) })
	return out, nil
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// containers lists every container of cluster name, stopped ones too.
func (p *Provider) containers(ctx context.Context, name string) ([]container.Summary, error) {
	ctrs, err := p.api.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", LabelCluster+"="+name))})
	if err != nil {
		return nil, engineErr("list containers", err)
	}
	return ctrs, nil
}

// agentsOf returns the agent containers by index.
func agentsOf(ctrs []container.Summary) []container.Summary {
	var out []container.Summary
	for _, c := range ctrs {
		if c.Labels[LabelRole] == roleAgent {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b container.Summary) int {
		i, _ := strconv.Atoi(a.Labels[LabelIndex])
		j, _ := strconv.Atoi(b.Labels[LabelIndex])
		return i - j
	})
	return out
}

// removeAll force-removes every container of the cluster, with their anonymous volumes.
func (p *Provider) removeAll(ctx context.Context, name string) error {
	ctrs, err := p.containers(ctx, name)
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range ctrs {
		if err := p.remove(ctx, c.ID, 0); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// remove stops a container with grace (0: kill at once) and removes it.
func (p *Provider) remove(ctx context.Context, id string, grace time.Duration) error {
	if grace > 0 {
		secs := int(grace.Seconds())
		if err := p.api.ContainerStop(ctx, id, container.StopOptions{Timeout: &secs}); err != nil && !errdefs.IsNotFound(err) {
			p.log.Warn("stop container", "id", id, "err", err)
		}
	}
	err := p.api.ContainerRemove(ctx, id, container.RemoveOptions{Force: true, RemoveVolumes: true})
	if err != nil && !errdefs.IsNotFound(err) {
		return engineErr("remove container "+id, err)
	}
	return nil
}

// startAgents creates and starts the agents of slots, a few at a time.
func (p *Provider) startAgents(ctx context.Context, spec provision.Spec, slots []provision.Slot, env []string) error {
	sem := make(chan struct{}, 4)
	errs := make([]error, len(slots))
	var wg sync.WaitGroup
	for i, s := range slots {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = p.startAgent(ctx, spec, s, env)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// waitMaster waits until the master at apiURL answers and leads.
func (p *Provider) waitMaster(ctx context.Context, name, apiURL string) error {
	opts, err := p.cfg.Tokens.ClientOptions(name)
	if err != nil {
		return err
	}
	api, err := api.NewClient(apiURL, "", opts...)
	if err != nil {
		return err
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		h, herr := api.Health(ctx)
		if herr == nil && h.Leader {
			return nil
		}
		if err := p.checkRunning(ctx, containerName(name+"-master")); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("master of %s at %s does not lead (last: %v): %w", name, apiURL, herr, ctx.Err())
		case <-t.C:
		}
	}
}

// waitAgents waits until the agents of slots are registered, failing as soon as one of
// their containers stops or restarts.
func (p *Provider) waitAgents(ctx context.Context, kv coord.KV, name string, slots []provision.Slot) error {
	ids := make([]string, len(slots))
	for i, s := range slots {
		ids[i] = s.Node
	}
	return provision.WaitRegistered(ctx, kv, ids, func(ctx context.Context) error {
		for _, s := range slots {
			if err := p.checkRunning(ctx, containerName(s.Node)); err != nil {
				return err
			}
		}
		return nil
	})
}

// checkRunning fails when a container is not running or has restarted, with the tail of
// its log.
func (p *Provider) checkRunning(ctx context.Context, name string) error {
	in, err := p.api.ContainerInspect(ctx, name)
	if err != nil {
		return engineErr("inspect container "+name, err)
	}
	if in.State != nil && in.State.Running && !in.State.Restarting && in.RestartCount == 0 {
		return nil
	}
	state, code := "unknown", 0
	if in.State != nil {
		state, code = in.State.Status, in.State.ExitCode
	}
	return fmt.Errorf("container %s is %s (exit code %d, restarts %d): %s", name, state, code, in.RestartCount, p.logTail(ctx, name))
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port for the master API: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func unknown(name string) error {
	return fmt.Errorf("%w %s: no container carries label %s=%s (see stormdock cluster list)", provision.ErrNotFound, name, LabelCluster, name)
}

func engineErr(what string, err error) error {
	if client.IsErrConnectionFailed(err) {
		return fmt.Errorf("%w: %s: %v: start dockerd or point DOCKER_HOST at a running engine", provision.ErrUnavailable, what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// The image's entry point, for the commands the containers run.
var binary = images.StormdockPath

// TokenDir is where the provider keeps admin tokens.
func (p *Provider) TokenDir() string { return p.cfg.Tokens.Dir }
