// Package nomad provisions stormdock clusters as Nomad service jobs (Nomad plays the part
// YARN plays for JStorm): a master group of one and an agents group of N, docker driver.
//
// The job carries the cluster's name, store URL and spec in its meta, so every command
// finds the cluster again without local state; the agents' node identity comes from Nomad
// interpolation (${node.unique.name}, ${node.datacenter}, ${meta.rack}). This package has
// been tested against recorded Nomad API exchanges only, never against a live Nomad.
package nomad

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/provision"
)

// Name is the provider's name in Cluster.Provider and on the command line.
const Name = "nomad"

// Task group names of a cluster's job.
const (
	GroupMaster = "master"
	GroupAgents = "agents"
)

// Job meta keys.
const (
	MetaCluster = "stormdock.cluster"
	MetaStore   = "stormdock.store"
	MetaSpec    = "stormdock.spec"
)

// JobPrefix starts the id of every cluster's job: stormdock-NAME.
const JobPrefix = "stormdock-"

// Config configures a Provider.
type Config struct {
	// Address of the Nomad HTTP API (http://127.0.0.1:4646). NOMAD_TOKEN, NOMAD_REGION
	// and NOMAD_NAMESPACE are read from the environment as the nomad CLI does.
	Address string
	// Tokens is where admin tokens are kept. Default provision.DefaultTokenDir().
	Tokens provision.Tokens
	// Token, when set, is used for the master's API instead of the token file.
	Token string
	// StartTimeout bounds the wait for allocations to run and agents to register.
	// Default 5m: Nomad may have to pull the image.
	StartTimeout time.Duration
	// DrainTimeout bounds the wait for a scale-in's drain. Default 2m.
	DrainTimeout time.Duration
	// Poll is the interval of status polls. Default 1s.
	Poll   time.Duration
	Logger *slog.Logger
}

// Provider runs stormdock clusters as Nomad jobs. It implements provision.Provider.
type Provider struct {
	jobs *nomadapi.Jobs
	cfg  Config
	log  *slog.Logger
}

var _ provision.Provider = (*Provider)(nil)

// New returns a Provider for the Nomad API at cfg.Address.
func New(cfg Config) (*Provider, error) {
	nc := nomadapi.DefaultConfig()
	if cfg.Address != "" {
		nc.Address = cfg.Address
	}
	c, err := nomadapi.NewClient(nc)
	if err != nil {
		return nil, fmt.Errorf("%w: nomad client for %s: %v: check --nomad-addr", provision.ErrBadSpec, nc.Address, err)
	}
	if cfg.Tokens.Dir == "" {
		cfg.Tokens.Dir = provision.DefaultTokenDir()
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 5 * time.Minute
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 2 * time.Minute
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Provider{jobs: c.Jobs(), cfg: cfg, log: cfg.Logger.With("provider", Name, "nomad", nc.Address)}, nil
}

// JobID is the Nomad job of cluster name.
func JobID(name string) string { return JobPrefix + name }

// Create implements provision.Provider.
func (p *Provider) Create(ctx context.Context, spec provision.Spec) (_ provision.Cluster, err error) {
	spec = spec.WithDefaults()
	if err := spec.Validate(); err != nil {
		return provision.Cluster{}, err
	}
	if t, err := coord.ParseURL(spec.Store); err == nil && t.TLS {
		// Its allocations would need the CA and client key as files on every Nomad client
		// (a template or artifact stanza and a place to keep the key): not built.
		return provision.Cluster{}, fmt.Errorf("%w: store %s: the nomad provider does not speak TLS to ZooKeeper yet (its allocations get no --store-ca): give a zk:// store, or create the cluster --on docker", provision.ErrBadSpec, spec.Store)
	}
	if _, err := p.job(ctx, spec.Name); err == nil {
		return provision.Cluster{}, fmt.Errorf("%w: nomad job %s is registered: destroy it first (stormdock cluster destroy %s --on nomad)", provision.ErrExists, JobID(spec.Name), spec.Name)
	} else if !errors.Is(err, provision.ErrNotFound) {
		return provision.Cluster{}, err
	}
	job, err := Job(spec)
	if err != nil {
		return provision.Cluster{}, err
	}
	store, err := provision.OpenStore(ctx, spec.Store, p.log)
	if err != nil {
		return provision.Cluster{}, err
	}
	defer store.Close()
	_, undoToken, err := p.cfg.Tokens.Install(ctx, store, spec.Name)
	if err != nil {
		return provision.Cluster{}, err
	}
	registered := false
	defer func() {
		if err == nil {
			return
		}
		p.log.Warn("create failed: removing what it made", "cluster", spec.Name, "err", err)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if registered {
			if _, _, derr := p.jobs.Deregister(JobID(spec.Name), true, (&nomadapi.WriteOptions{}).WithContext(rctx)); derr != nil {
				p.log.Warn("deregister after a failed create", "job", JobID(spec.Name), "err", derr)
			}
		}
		undoToken(rctx)
	}()
	resp, _, err := p.jobs.Register(job, (&nomadapi.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return provision.Cluster{}, nomadErr("register job "+JobID(spec.Name), err)
	}
	registered = true
	if resp.Warnings != "" {
		p.log.Warn("nomad warns about the job", "warnings", resp.Warnings)
	}
	wctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	if err := p.waitSettled(wctx, store, spec.Name, spec.Agents); err != nil {
		return provision.Cluster{}, err
	}
	p.log.Info("cluster created", "cluster", spec.Name, "job", JobID(spec.Name), "agents", spec.Agents)
	return p.Status(ctx, spec.Name)
}

// Scale implements provision.Provider. Nomad stops the allocations with the highest
// indexes on a count decrease, so those are the ones drained first.
func (p *Provider) Scale(ctx context.Context, name string, agents int) (provision.Cluster, error) {
	if agents < 0 {
		return provision.Cluster{}, fmt.Errorf("%w: agents %d must not be negative", provision.ErrBadSpec, agents)
	}
	job, err := p.job(ctx, name)
	if err != nil {
		return provision.Cluster{}, err
	}
	spec, err := specOf(job)
	if err != nil {
		return provision.Cluster{}, err
	}
	g := job.LookupTaskGroup(GroupAgents)
	if g == nil || g.Count == nil {
		return provision.Cluster{}, fmt.Errorf("nomad job %s has no %s group: it was not made by stormdock; destroy it", JobID(name), GroupAgents)
	}
	cur := *g.Count
	if agents == cur {
		return p.Status(ctx, name)
	}
	store, err := provision.OpenStore(ctx, spec.Store, p.log)
	if err != nil {
		return provision.Cluster{}, err
	}
	defer store.Close()
	var drained []string
	var api *api.Client
	if agents < cur {
		allocs, err := p.agentAllocs(ctx, name)
		if err != nil {
			return provision.Cluster{}, err
		}
		for _, a := range allocs {
			if a.index >= agents && a.NodeName != "" {
				drained = append(drained, a.NodeName)
			}
		}
		if api, err = p.client(ctx, store, name); err != nil {
			return provision.Cluster{}, err
		}
		dctx, cancel := context.WithTimeout(ctx, p.cfg.DrainTimeout)
		err = provision.Drain(dctx, api, drained, p.log)
		cancel()
		if err != nil {
			return provision.Cluster{}, err
		}
	}
	_, _, err = p.jobs.Scale(JobID(name), GroupAgents, &agents, fmt.Sprintf("stormdock cluster scale %s: %d -> %d agents", name, cur, agents),
		false, nil, (&nomadapi.WriteOptions{}).WithContext(ctx))
	if err != nil {
		if api != nil {
			_ = provision.Undrain(context.WithoutCancel(ctx), api, drained)
		}
		return provision.Cluster{}, nomadErr("scale job "+JobID(name), err)
	}
	wctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	if err := p.waitSettled(wctx, store, name, agents); err != nil {
		return provision.Cluster{}, err
	}
	if api != nil {
		if err := provision.Undrain(ctx, api, drained); err != nil {
			p.log.Warn("removed agents stay marked draining", "nodes", drained, "err", err)
		}
	}
	p.log.Info("cluster scaled", "cluster", name, "from", cur, "to", agents)
	return p.Status(ctx, name)
}

// client is an admin client for the master that leads the cluster.
func (p *Provider) client(ctx context.Context, kv coord.KV, name string) (*api.Client, error) {
	apiURL, err := provision.MasterAPI(ctx, kv)
	if err != nil {
		return nil, err
	}
	if apiURL == "" {
		return nil, fmt.Errorf("no master of %s leads (see stormdock cluster status %s --on nomad): cannot drain agents", name, name)
	}
	token := p.cfg.Token
	if token == "" {
		if token, err = p.cfg.Tokens.Read(name); err != nil {
			return nil, err
		}
	}
	return api.NewClient(apiURL, token)
}

// waitSettled waits until the job runs its master and exactly n agents, every one
// registered in the store; a failed allocation ends the wait at once.
func (p *Provider) waitSettled(ctx context.Context, kv coord.KV, name string, n int) error {
	t := time.NewTicker(p.cfg.Poll)
	defer t.Stop()
	for {
		c, err := p.Status(ctx, name)
		if err != nil && ctx.Err() == nil {
			return err
		}
		why := ""
		switch {
		case err != nil:
			why = err.Error()
		case c.Master.State != "running" || !c.Master.Registered:
			why = fmt.Sprintf("master is %s", c.Master.State)
		case len(c.Agents) != n:
			why = fmt.Sprintf("%d of %d agents", len(c.Agents), n)
		case c.Ready() != n:
			why = fmt.Sprintf("%d of %d agents registered", c.Ready(), n)
		default:
			return nil
		}
		for _, m := range append([]provision.Member{c.Master}, c.Agents...) {
			if m.State == nomadapi.AllocClientStatusFailed {
				return fmt.Errorf("allocation %s failed: see `nomad alloc status %s`", m.Name, m.ID)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster %s did not settle (%s): %w", name, why, ctx.Err())
		case <-t.C:
		}
	}
}

// Status implements provision.Provider.
func (p *Provider) Status(ctx context.Context, name string) (provision.Cluster, error) {
	job, err := p.job(ctx, name)
	if err != nil {
		return provision.Cluster{}, err
	}
	spec, err := specOf(job)
	if err != nil {
		return provision.Cluster{}, err
	}
	c := provision.Cluster{Name: name, Provider: Name, Store: spec.Store, Image: spec.Image, Spec: spec}
	allocs, err := p.allocs(ctx, name)
	if err != nil {
		return provision.Cluster{}, err
	}
	var nodes map[string]provision.NodeInfo
	if store, err := provision.OpenStore(ctx, spec.Store, p.log); err != nil {
		c.Warnings = append(c.Warnings, err.Error())
	} else {
		if nodes, err = provision.Nodes(ctx, store); err != nil {
			c.Warnings = append(c.Warnings, err.Error())
		}
		if c.API, err = provision.MasterAPI(ctx, store); err != nil {
			c.Warnings = append(c.Warnings, err.Error())
		}
		store.Close()
	}
	for _, a := range allocs {
		m := provision.Member{Name: a.Name, ID: a.ID, State: a.ClientStatus}
		switch a.TaskGroup {
		case GroupMaster:
			m.Registered = c.API != ""
			c.Master = m
		case GroupAgents:
			m.Node = a.NodeName
			if n, ok := nodes[a.NodeName]; ok {
				m.Registered, m.DC, m.Rack = true, n.DC, n.Rack
			}
			c.Agents = append(c.Agents, m)
		}
	}
	c.Spec.Agents = len(c.Agents)
	return c, nil
}

// Destroy implements provision.Provider: the job is deregistered and purged.
func (p *Provider) Destroy(ctx context.Context, name string) error {
	job, err := p.job(ctx, name)
	if err != nil {
		return err
	}
	if _, _, err := p.jobs.Deregister(JobID(name), true, (&nomadapi.WriteOptions{}).WithContext(ctx)); err != nil {
		return nomadErr("deregister job "+JobID(name), err)
	}
	storeURL := ""
	if spec, err := specOf(job); err == nil {
		storeURL = spec.Store
	}
	p.cfg.Tokens.Forget(ctx, storeURL, name, p.log)
	p.log.Info("cluster destroyed", "cluster", name, "job", JobID(name))
	return nil
}

// List implements provision.Provider.
func (p *Provider) List(ctx context.Context) ([]provision.Summary, error) {
	stubs, _, err := p.jobs.ListOptions(&nomadapi.JobListOptions{Fields: &nomadapi.JobListFields{Meta: true}},
		(&nomadapi.QueryOptions{Prefix: JobPrefix}).WithContext(ctx))
	if err != nil {
		return nil, nomadErr("list jobs", err)
	}
	var out []provision.Summary
	for _, s := range stubs {
		name := s.Meta[MetaCluster]
		if name == "" || s.Status == "dead" {
			continue
		}
		sum := provision.Summary{Name: name, Provider: Name, Store: s.Meta[MetaStore], State: s.Status}
		if s.JobSummary != nil {
			if tg, ok := s.JobSummary.Summary[GroupAgents]; ok {
				sum.Agents = tg.Running
			}
		}
		out = append(out, sum)
	}
	slices.SortFunc(out, func(a, b provision.Summary) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// job reads the cluster's job; ErrNotFound when Nomad has none (or only a stopped one).
func (p *Provider) job(ctx context.Context, name string) (*nomadapi.Job, error) {
	if err := provision.CheckName(name); err != nil {
		return nil, fmt.Errorf("%w: %v", provision.ErrBadSpec, err)
	}
	job, _, err := p.jobs.Info(JobID(name), (&nomadapi.QueryOptions{}).WithContext(ctx))
	if err != nil {
		if status(err) == http.StatusNotFound {
			return nil, fmt.Errorf("%w %s: nomad has no job %s (see stormdock cluster list --on nomad)", provision.ErrNotFound, name, JobID(name))
		}
		return nil, nomadErr("read job "+JobID(name), err)
	}
	if job.Stop != nil && *job.Stop {
		return nil, fmt.Errorf("%w %s: nomad job %s is stopped", provision.ErrNotFound, name, JobID(name))
	}
	return job, nil
}

// alloc is an allocation of the job with its index in the group (name JOB.GROUP[i]).
type alloc struct {
	*nomadapi.AllocationListStub
	index int
}

var allocIndexRE = regexp.MustCompile(`\[(\d+)\]$`)

// allocs returns the job's live allocations (desired to run), by group and index.
func (p *Provider) allocs(ctx context.Context, name string) ([]alloc, error) {
	stubs, _, err := p.jobs.Allocations(JobID(name), false, (&nomadapi.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, nomadErr("list allocations of "+JobID(name), err)
	}
	var out []alloc
	for _, s := range stubs {
		if s.DesiredStatus != nomadapi.AllocDesiredStatusRun {
			continue
		}
		i := -1
		if m := allocIndexRE.FindStringSubmatch(s.Name); m != nil {
			i, _ = strconv.Atoi(m[1])
		}
		out = append(out, alloc{AllocationListStub: s, index: i})
	}
	slices.SortFunc(out, func(a, b alloc) int {
		if c := strings.Compare(a.TaskGroup, b.TaskGroup); c != 0 {
			return c
		}
		return a.index - b.index
	})
	return out, nil
}

func (p *Provider) agentAllocs(ctx context.Context, name string) ([]alloc, error) {
	all, err := p.allocs(ctx, name)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(a alloc) bool { return a.TaskGroup != GroupAgents }), nil
}

func specOf(job *nomadapi.Job) (provision.Spec, error) {
	var spec provision.Spec
	if err := json.Unmarshal([]byte(job.Meta[MetaSpec]), &spec); err != nil {
		return spec, fmt.Errorf("nomad job %s has no readable %s meta: it was not made by stormdock", *job.ID, MetaSpec)
	}
	return spec, nil
}

func status(err error) int {
	var ue nomadapi.UnexpectedResponseError
	if errors.As(err, &ue) {
		return ue.StatusCode()
	}
	var up *nomadapi.UnexpectedResponseError
	if errors.As(err, &up) {
		return up.StatusCode()
	}
	// Older clients return plain errors like "Unexpected response code: 404 (job not found)".
	if strings.Contains(err.Error(), "response code: 404") {
		return http.StatusNotFound
	}
	return 0
}

func nomadErr(what string, err error) error {
	if status(err) == 0 {
		return fmt.Errorf("%w: %s: %v: check --nomad-addr (or NOMAD_ADDR) and that Nomad runs", provision.ErrUnavailable, what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
