// Package cluster is `stormdock cluster`: create, scale, inspect and destroy whole stormdock
// clusters on Docker hosts or on Nomad (package provision).
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/isolation/docker"
	"github.com/stormdock/stormdock/provision"
	pdocker "github.com/stormdock/stormdock/provision/docker"
	"github.com/stormdock/stormdock/provision/nomad"
	"github.com/stormdock/stormdock/tools/commands"
)

// Command provisions whole stormdock clusters on Docker hosts or on Nomad.
var Command = &cli.Command{
	Name:  "cluster",
	Usage: "create, scale and destroy whole stormdock clusters (master + agents) on Docker or Nomad",
	Description: "A cluster is found again from its containers' labels (docker) or its job's meta (nomad):\n" +
		"nothing is kept locally but the admin token and the scrape token (it reads /metrics alone), written to\n" +
		provision.DefaultTokenDir() + "/NAME/admin.token and metrics.token (mode 0600) by create and removed\n" +
		"by destroy. The store is an existing ZooKeeper ensemble:\n" +
		"--store zk://HOST:PORT/CHROOT, a chroot per cluster, or zks://HOST:PORT/CHROOT for its TLS port\n" +
		"with --store-ca (docker: copied beside the admin token and mounted read-only into every container).",
	Subcommands: []*cli.Command{
		{
			Name:      "create",
			Usage:     "start a master and N agents, and wait until every agent is registered",
			UsageText: "stormdock cluster create NAME --agents N --store zk://HOST:PORT/CHROOT [--on docker|nomad] [flags]",
			Flags: append(providerFlags(),
				&cli.IntFlag{Name: "agents", Usage: "number of agents (nodes)", Required: true},
				&cli.StringFlag{Name: "store", Usage: "ZooKeeper `URL` with the cluster's chroot: zk://HOST:PORT[,HOST:PORT]/CHROOT, or zks:// for its TLS port (with --store-ca)", Required: true},
				commands.StoreTLSFlags[0], commands.StoreTLSFlags[1], commands.StoreTLSFlags[2],
				&cli.StringFlag{Name: "dcs", Usage: "data centers, comma-separated; agents are spread over them round-robin", Value: provision.DefaultDC},
				&cli.IntFlag{Name: "racks-per-dc", Usage: "racks in each data center", Value: provision.DefaultRacksPerDC},
				&cli.IntFlag{Name: "slots", Usage: "worker slots per agent", Value: provision.DefaultSlots},
				&cli.StringFlag{Name: "agent-memory", Usage: "memory limit of each agent with all its workers", Value: "2Gi"},
				&cli.StringFlag{Name: "agent-cpu", Usage: "cpu limit of each agent with all its workers (cores)", Value: "2"},
				&cli.StringFlag{Name: "master-memory", Usage: "memory limit of the master", Value: "512Mi"},
				&cli.StringFlag{Name: "master-cpu", Usage: "cpu limit of the master (cores)", Value: "1"},
				&cli.StringFlag{Name: "image", Usage: "stormdock `IMAGE` (build it with stormdock image build)", Value: images.DefaultTag},
				&cli.DurationFlag{Name: "session-timeout", Usage: "store session timeout of the master and agents", Value: provision.DefaultSessionTimeout},
				&cli.StringSliceFlag{Name: "agent-arg", Usage: "extra flag for every agent (repeatable), e.g. --agent-arg=--health-interval=1s"},
				&cli.BoolFlag{Name: "docker-workers", Usage: "agents run docker workers too, pulling their images (docker: they get the engine's socket, root on the host)"},
				&cli.StringFlag{Name: "registry-auth", Usage: "registry credentials `FILE` on the Docker host (Docker's config.json format) for the master's pinning and the agents' pulls of images under shared prefixes (`stormdock image share`)"},
				commands.OutputFlag,
			),
			Action: clusterCreate,
		},
		{
			Name:      "scale",
			Usage:     "set the number of agents; removed agents are drained first and their workers re-placed",
			UsageText: "stormdock cluster scale NAME --agents N [--on docker|nomad]",
			Flags: append(providerFlags(),
				&cli.IntFlag{Name: "agents", Usage: "number of agents wanted", Required: true},
				commands.OutputFlag,
			),
			Action: clusterScale,
		},
		{
			Name:      "status",
			Usage:     "show the master's API URL and every agent: container, state, dc, rack, registered",
			UsageText: "stormdock cluster status NAME [--on docker|nomad] [-o table|json]",
			Flags:     append(providerFlags(), commands.OutputFlag),
			Action:    clusterStatus,
		},
		{
			Name:      "list",
			Usage:     "list the clusters on the provider",
			UsageText: "stormdock cluster list [--on docker|nomad] [-o table|json]",
			Flags:     append(providerFlags(), commands.OutputFlag),
			Action:    clusterList,
		},
		{
			Name:      "destroy",
			Usage:     "remove the cluster's master and agents and its admin token (the store's data stays)",
			UsageText: "stormdock cluster destroy NAME [--on docker|nomad]",
			Flags:     providerFlags(),
			Action:    clusterDestroy,
		},
		autoscaleCommand,
	},
}

// providerFlags choose and reach the provider.
func providerFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "on", Usage: "where the cluster runs: docker or nomad", Value: pdocker.Name, EnvVars: []string{"STORMDOCK_PROVIDER"}},
		&cli.StringFlag{Name: "docker-host", Usage: "docker engine (default: DOCKER_HOST or the local socket)"},
		&cli.StringFlag{Name: "nomad-addr", Usage: "Nomad API `URL`", EnvVars: []string{"NOMAD_ADDR"}, Value: "http://127.0.0.1:4646"},
		&cli.StringFlag{Name: "token", Usage: "the cluster's admin `TOKEN` for drains (default: the token file create wrote)", EnvVars: []string{"STORMDOCK_TOKEN"}},
		&cli.DurationFlag{Name: "timeout", Usage: "give up after this long", Value: 10 * time.Minute},
	}
}

// provider builds the provider the flags name; the closer releases its connection.
func provider(c *cli.Context) (provision.Provider, func(), error) {
	switch c.String("on") {
	case pdocker.Name:
		dc, err := docker.Connect(c.Context, c.String("docker-host"))
		if err != nil {
			return nil, nil, cli.Exit("stormdock cluster: "+err.Error(), 1)
		}
		p, err := pdocker.New(pdocker.Config{API: dc, Token: c.String("token")})
		if err != nil {
			dc.Close()
			return nil, nil, cli.Exit("stormdock cluster: "+err.Error(), 1)
		}
		return p, func() { dc.Close() }, nil
	case nomad.Name:
		p, err := nomad.New(nomad.Config{Address: c.String("nomad-addr"), Token: c.String("token")})
		if err != nil {
			return nil, nil, commands.UsageErr("%v", err)
		}
		return p, func() {}, nil
	default:
		return nil, nil, commands.UsageErr("--on must be docker or nomad, not %q", c.String("on"))
	}
}

// withProvider runs f with the provider and a context bounded by --timeout, turning its
// error into an exit: 2 for bad input (bad spec, unknown cluster, cluster exists), else 1.
func withProvider(c *cli.Context, f func(ctx context.Context, p provision.Provider) error) error {
	if c.Duration("timeout") <= 0 {
		return commands.UsageErr("--timeout must be positive")
	}
	p, closer, err := provider(c)
	if err != nil {
		return err
	}
	defer closer()
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	return provisionErr(c, f(ctx, p))
}

func provisionErr(c *cli.Context, err error) error {
	if err == nil {
		return nil
	}
	var exit cli.ExitCoder
	if errors.As(err, &exit) {
		return err
	}
	msg := "stormdock cluster " + c.Command.Name + ": " + strings.ReplaceAll(err.Error(), "\n", "; ")
	for _, s := range []error{provision.ErrBadSpec, provision.ErrNotFound, provision.ErrExists} {
		if errors.Is(err, s) {
			return cli.Exit(msg, 2)
		}
	}
	return cli.Exit(msg, 1)
}

// wantClusterName checks that the command got one argument, a valid cluster name.
func wantClusterName(c *cli.Context) error {
	if err := commands.WantArgs(c, 1, "a cluster NAME"); err != nil {
		return err
	}
	if err := provision.CheckName(c.Args().First()); err != nil {
		return commands.UsageErr("%v", err)
	}
	return nil
}

func clusterCreate(c *cli.Context) error {
	if err := wantClusterName(c); err != nil {
		return err
	}
	spec, err := specFromFlags(c)
	if err != nil {
		return err
	}
	return withProvider(c, func(ctx context.Context, p provision.Provider) error {
		start := time.Now()
		cl, err := p.Create(ctx, spec)
		if err != nil {
			return err
		}
		if err := printCluster(c, cl); err != nil {
			return err
		}
		if c.String("output") != "json" {
			tokens := provision.Tokens{Dir: provision.DefaultTokenDir()}
			path, _ := tokens.Path(cl.Name)
			fmt.Fprintf(c.App.Writer, "\nready in %s. Use it with:\n  export STORMDOCK_MASTER=%s\n  export STORMDOCK_TOKEN=$(cat %s)\n",
				time.Since(start).Round(100*time.Millisecond), cl.API, path)
			if ca := tokens.CAFile(cl.Name); ca != "" {
				fmt.Fprintf(c.App.Writer, "  export STORMDOCK_CA=%s\n", ca)
			}
		}
		return nil
	})
}

// specFromFlags reads a cluster spec; bad values exit 2.
func specFromFlags(c *cli.Context) (provision.Spec, error) {
	spec := provision.Spec{
		Name: c.Args().First(), Agents: c.Int("agents"), RacksPerDC: c.Int("racks-per-dc"), Slots: c.Int("slots"),
		Image: c.String("image"), Store: c.String("store"), SessionTimeout: c.Duration("session-timeout"),
		AgentArgs: c.StringSlice("agent-arg"), DockerWorkers: c.Bool("docker-workers"),
	}
	files, err := commands.StoreTLS(c)
	if err != nil {
		return spec, err
	}
	spec.StoreTLS = files
	if p := c.String("registry-auth"); p != "" {
		abs, err := filepath.Abs(p)
		if err == nil {
			_, err = images.LoadAuth(abs)
		}
		if err != nil {
			return spec, commands.UsageErr("--registry-auth: %v", err)
		}
		spec.RegistryAuth = abs
	}
	for _, dc := range strings.Split(c.String("dcs"), ",") {
		if dc = strings.TrimSpace(dc); dc != "" {
			spec.DCs = append(spec.DCs, dc)
		}
	}
	for flag, dst := range map[string]*cluster.Bytes{"agent-memory": &spec.AgentMemory, "master-memory": &spec.MasterMemory} {
		if *dst, err = cluster.ParseBytes(c.String(flag)); err != nil {
			return spec, commands.UsageErr("--%s: %v", flag, err)
		}
	}
	for flag, dst := range map[string]*cluster.CPU{"agent-cpu": &spec.AgentCPU, "master-cpu": &spec.MasterCPU} {
		if *dst, err = cluster.ParseCPU(c.String(flag)); err != nil {
			return spec, commands.UsageErr("--%s: %v", flag, err)
		}
	}
	if spec.Agents < 0 || spec.RacksPerDC < 1 || spec.Slots < 1 {
		return spec, commands.UsageErr("--agents must not be negative; --racks-per-dc and --slots must be at least 1")
	}
	spec = spec.WithDefaults()
	if err := spec.Validate(); err != nil {
		return spec, commands.UsageErr("%v", err)
	}
	return spec, nil
}

func clusterScale(c *cli.Context) error {
	if err := wantClusterName(c); err != nil {
		return err
	}
	if c.Int("agents") < 0 {
		return commands.UsageErr("--agents must not be negative")
	}
	return withProvider(c, func(ctx context.Context, p provision.Provider) error {
		start := time.Now()
		cl, err := p.Scale(ctx, c.Args().First(), c.Int("agents"))
		if err != nil {
			return err
		}
		if err := printCluster(c, cl); err != nil {
			return err
		}
		if c.String("output") != "json" {
			fmt.Fprintf(c.App.Writer, "\nsettled in %s\n", time.Since(start).Round(100*time.Millisecond))
		}
		return nil
	})
}

func clusterStatus(c *cli.Context) error {
	if err := wantClusterName(c); err != nil {
		return err
	}
	return withProvider(c, func(ctx context.Context, p provision.Provider) error {
		cl, err := p.Status(ctx, c.Args().First())
		if err != nil {
			return err
		}
		return printCluster(c, cl)
	})
}

func clusterList(c *cli.Context) error {
	if err := commands.WantArgs(c, 0, "no arguments"); err != nil {
		return err
	}
	return withProvider(c, func(ctx context.Context, p provision.Provider) error {
		all, err := p.List(ctx)
		if err != nil {
			return err
		}
		if all == nil {
			all = []provision.Summary{}
		}
		return commands.PrintOut(c, all, func(w io.Writer) {
			fmt.Fprintln(w, "NAME\tON\tAGENTS\tMASTER\tAPI\tSTORE")
			for _, s := range all {
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\n", commands.Clip(s.Name, 20), s.Provider, s.Agents, commands.Clip(s.State, 10), commands.Clip(s.API, 24), commands.Clip(s.Store, 30))
			}
		})
	})
}

func clusterDestroy(c *cli.Context) error {
	if err := wantClusterName(c); err != nil {
		return err
	}
	return withProvider(c, func(ctx context.Context, p provision.Provider) error {
		if err := p.Destroy(ctx, c.Args().First()); err != nil {
			return err
		}
		tokens := provision.Tokens{Dir: provision.DefaultTokenDir()}
		dir, _ := tokens.ClusterDir(c.Args().First())
		fmt.Fprintf(c.App.Writer, "cluster %s destroyed; its jobs stay in the store's chroot, open to the credentials kept in %s "+
			"(zkCli.sh: addauth digest USER:PASS, then deleteall CHROOT, drops them)\n", c.Args().First(), filepath.Join(dir, provision.StoreCredentialsFile))
		return nil
	})
}

// printCluster writes a cluster as JSON or as a header and a table of agents, within 100
// columns.
func printCluster(c *cli.Context, cl provision.Cluster) error {
	return commands.PrintOut(c, cl, func(w io.Writer) {
		lead := "not leading"
		if cl.Master.Registered {
			lead = "leading"
		}
		fmt.Fprintf(w, "cluster %s on %s\n", cl.Name, cl.Provider)
		fmt.Fprintf(w, "  api     %s\n  store   %s\n  image   %s\n", commands.OrDash(cl.API), commands.Clip(cl.Store, 88), commands.Clip(cl.Image, 88))
		fmt.Fprintf(w, "  master  %s  %s  %s\n", commands.Clip(commands.OrDash(cl.Master.Name), 40), commands.OrDash(cl.Master.State), lead)
		for _, warn := range cl.Warnings {
			fmt.Fprintf(w, "  warning %s\n", commands.Clip(warn, 88))
		}
		fmt.Fprintf(w, "%d agent(s), %d registered\n", len(cl.Agents), cl.Ready())
		fmt.Fprintln(w, "AGENT\tNODE\tDC\tRACK\tSTATE\tREGISTERED")
		for _, a := range cl.Agents {
			reg := "no"
			if a.Registered {
				reg = "yes"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", commands.Clip(a.Name, 30), commands.Clip(commands.OrDash(a.Node), 24), commands.Clip(commands.OrDash(a.DC), 10), commands.Clip(commands.OrDash(a.Rack), 8), commands.Clip(a.State, 10), reg)
		}
	})
}
