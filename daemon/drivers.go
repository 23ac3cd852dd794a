package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/docker/docker/client"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/isolation/docker"
	"github.com/stormdock/stormdock/isolation/process"
)

// Cgroup modes of the process driver.
const (
	CgroupsRequired = "required" // fail when no cgroup hierarchy is writable
	CgroupsAuto     = "auto"     // run unconfined, in process groups, when none is
	CgroupsOff      = "off"      // never use cgroups
)

// LabelCgroups is set to "false" on nodes whose process workers run unconfined: it tells
// operators and job placement (nodeLabels) that nothing limits workers one by one there.
const LabelCgroups = "isolation/cgroups"

// DriverConfig is what a node's isolation drivers are built from.
type DriverConfig struct {
	// Isolation lists the modes to offer: cluster.IsolationProcess, cluster.IsolationDocker.
	Isolation []string
	// Cgroups is CgroupsRequired (default), CgroupsAuto or CgroupsOff.
	Cgroups      string
	CgroupParent string
	// ProcessState is the process driver's state directory.
	ProcessState string
	// Shim is the process driver's shim binary (process.Config.Shim): see Launchers.
	Shim string
	// Docker, when set, is shared by the docker driver (a local cluster's nodes share one
	// client); otherwise DockerHost (or the environment) is dialled.
	Docker       *client.Client
	DockerHost   string
	DockerLabels map[string]string
	// Node is the node id docker containers are labelled with.
	Node string
	// DockerLate builds the drivers without docker when its engine does not answer, rather
	// than fail: Drivers.DockerLate says so, and Drivers.ConnectDocker brings it later.
	DockerLate bool
	Logger     *slog.Logger
}

// Drivers is a node's built drivers.
type Drivers struct {
	List []isolation.Driver
	// Modes pairs each driver with its mode, as the agent takes them.
	Modes []string
	// Unconfined reports that process workers run without cgroups.
	Unconfined bool
	// Docker is the engine client of the docker driver (nil without docker isolation): the
	// agent pulls and collects images through it.
	Docker *client.Client
	// DockerLate is set when docker isolation was asked for and its engine did not answer
	// (DriverConfig.DockerLate): the node offers it once ConnectDocker succeeds.
	DockerLate bool
	cfg        DriverConfig
	closers    []func()
}

// ConnectDocker connects to the docker engine and builds the docker driver, for a node
// built without it (DockerLate). It fails with isolation.ErrUnavailable while the engine
// does not answer.
func (d *Drivers) ConnectDocker(ctx context.Context) (isolation.Driver, *client.Client, error) {
	cl, err := docker.Connect(ctx, d.cfg.DockerHost)
	if err != nil {
		return nil, nil, err
	}
	dd, err := docker.New(ctx, docker.Config{Client: cl, Node: d.cfg.Node, Labels: d.cfg.DockerLabels, Logger: d.cfg.Logger})
	if err != nil {
		cl.Close()
		return nil, nil, err
	}
	d.List = append(d.List, dd)
	d.Modes = append(d.Modes, cluster.IsolationDocker)
	d.Docker, d.DockerLate = cl, false
	d.closers = append(d.closers, func() { cl.Close() }, func() { dd.Close() })
	return dd, cl, nil
}

// Close releases every driver and the docker client dialled for them. Workers keep running.
func (d *Drivers) Close() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
	d.closers = nil
}

// NewDrivers builds the drivers of cfg.Isolation. With CgroupsAuto, a process driver that
// finds no writable cgroup hierarchy (usually a container without nested cgroups) runs
// its workers unconfined: they then share the agent's own limits, which still bound the
// node as a whole.
func NewDrivers(ctx context.Context, cfg DriverConfig) (d *Drivers, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	switch cfg.Cgroups {
	case "":
		cfg.Cgroups = CgroupsRequired
	case CgroupsRequired, CgroupsAuto, CgroupsOff:
	default:
		return nil, fmt.Errorf("cgroups must be %s, %s or %s, not %q", CgroupsRequired, CgroupsAuto, CgroupsOff, cfg.Cgroups)
	}
	if len(cfg.Isolation) == 0 {
		return nil, errors.New("give at least one isolation: process, docker")
	}
	d = &Drivers{cfg: cfg}
	built := d // a failing return sets the named result to nil before this runs
	defer func() {
		if err != nil {
			built.Close()
		}
	}()
	for _, mode := range cfg.Isolation {
		if slices.Contains(d.Modes, mode) {
			continue
		}
		var drv isolation.Driver
		switch mode {
		case cluster.IsolationProcess:
			pcfg := process.Config{CgroupParent: cfg.CgroupParent, StateDir: cfg.ProcessState, Logger: cfg.Logger,
				Unconfined: cfg.Cgroups == CgroupsOff, Shim: cfg.Shim}
			pd, perr := process.New(pcfg)
			if perr != nil && cfg.Cgroups == CgroupsAuto {
				cfg.Logger.Warn("no writable cgroup hierarchy: workers run unconfined in process groups and share the agent's own limits (node label isolation/cgroups=false)", "err", perr)
				pcfg.Unconfined = true
				pd, perr = process.New(pcfg)
			}
			if perr != nil {
				return nil, perr
			}
			d.Unconfined = pcfg.Unconfined
			drv = pd
		case cluster.IsolationDocker:
			cl := cfg.Docker
			if cl == nil {
				if cl, err = docker.Connect(ctx, cfg.DockerHost); err != nil {
					if cfg.DockerLate && errors.Is(err, isolation.ErrUnavailable) {
						cfg.Logger.Warn("the docker engine does not answer: this node offers no docker isolation until it does (docker workers go to other nodes meanwhile); retrying", "err", err)
						d.DockerLate = true
						err = nil
						continue
					}
					return nil, err
				}
				d.closers = append(d.closers, func() { cl.Close() })
			}
			dd, derr := docker.New(ctx, docker.Config{Client: cl, Node: cfg.Node, Labels: cfg.DockerLabels, Logger: cfg.Logger})
			if derr != nil {
				return nil, derr
			}
			d.Docker = cl
			drv = dd
		default:
			return nil, fmt.Errorf("unknown isolation %q (process or docker)", mode)
		}
		d.List = append(d.List, drv)
		d.Modes = append(d.Modes, mode)
		d.closers = append(d.closers, func() { drv.Close() })
	}
	return d, nil
}

// RemoveParents removes the process driver's parent cgroup once it is empty (a local
// cluster's nodes are gone for good when it stops).
func (d *Drivers) RemoveParents() {
	for _, drv := range d.List {
		if p, ok := drv.(interface{ RemoveParent() error }); ok {
			_ = p.RemoveParent()
		}
	}
}
