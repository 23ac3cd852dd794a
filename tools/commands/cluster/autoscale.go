package cluster

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/provision"
	"github.com/stormdock/stormdock/provision/autoscale"
	"github.com/stormdock/stormdock/tools/commands"
)

// `stormdock cluster autoscale`: a controller that keeps a provisioned cluster's node count
// within a policy until interrupted (package provision/autoscale).
var autoscaleCommand = &cli.Command{
	Name:      "autoscale",
	Usage:     "keep a cluster's nodes between --min and --max: nodes for workers waiting for room, idle nodes drained and removed",
	UsageText: "stormdock cluster autoscale NAME --min N --max M [--policy FILE] [--on docker|nomad] [flags]",
	Description: "Runs until interrupted (--once: one look). Workers unplaced for want of room (a slot, memory, cpu or\n" +
		"a job's maxPerNode) for longer than --grace get nodes (cluster scale's path); the highest-numbered nodes\n" +
		"idle (at most --idle-below of their slots used) for --idle-for are drained through the master and removed,\n" +
		"never one whose workers would not fit elsewhere or whose removal takes the last node of a dc or rack a job\n" +
		"spreads over. Every change and refusal is a cluster event (cluster.autoscaled, cluster.autoscale-refused).\n" +
		"A policy FILE (YAML or JSON: min, max, grace, idleBelow, idleFor, cooldown, interval, maxStep) replaces\n" +
		"the flags.",
	Flags: append(providerFlags(),
		&cli.IntFlag{Name: "min", Usage: "fewest nodes"},
		&cli.IntFlag{Name: "max", Usage: "most nodes"},
		&cli.StringFlag{Name: "policy", Usage: "policy `FILE` (YAML or JSON) instead of the flags"},
		&cli.DurationFlag{Name: "grace", Usage: "how long workers may wait for room before nodes are added", Value: autoscale.DefaultGrace},
		&cli.Float64Flag{Name: "idle-below", Usage: "share of its slots in use at or under which a node is idle", Value: autoscale.DefaultIdleBelow},
		&cli.DurationFlag{Name: "idle-for", Usage: "how long a node must be idle before it goes", Value: autoscale.DefaultIdleFor},
		&cli.DurationFlag{Name: "cooldown", Usage: "how long after a change the next may come", Value: autoscale.DefaultCooldown},
		&cli.DurationFlag{Name: "interval", Usage: "how often the cluster is looked at", Value: autoscale.DefaultInterval},
		&cli.IntFlag{Name: "max-step", Usage: "nodes added or removed at most per change (0: no bound)"},
		&cli.BoolFlag{Name: "once", Usage: "look once, act, and exit"},
	),
	Action: clusterAutoscale,
}

func clusterAutoscale(c *cli.Context) error {
	if err := wantClusterName(c); err != nil {
		return err
	}
	name := c.Args().First()
	var pol autoscale.Policy
	if f := c.String("policy"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return commands.UsageErr("--policy: %v", err)
		}
		if pol, err = autoscale.ParsePolicy(b); err != nil {
			return commands.UsageErr("--policy %s: %v", f, err)
		}
	} else {
		if !c.IsSet("min") || !c.IsSet("max") {
			return commands.UsageErr("give --min and --max (or --policy FILE)")
		}
		pol = autoscale.Policy{Min: c.Int("min"), Max: c.Int("max"), Grace: dur(c, "grace"), IdleBelow: c.Float64("idle-below"),
			IdleFor: dur(c, "idle-for"), Cooldown: dur(c, "cooldown"), Interval: dur(c, "interval"), MaxStep: c.Int("max-step")}
		if err := pol.Validate(); err != nil {
			return commands.UsageErr("%v", err)
		}
	}
	p, closer, err := provider(c)
	if err != nil {
		return err
	}
	defer closer()
	ctx := c.Context
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	cl, err := p.Status(sctx, name)
	cancel()
	if err != nil {
		return provisionErr(c, err)
	}
	if cl.API == "" {
		return cli.Exit(fmt.Sprintf("stormdock cluster autoscale: cluster %s has no master leading (see stormdock cluster status %s)", name, name), 1)
	}
	tokens := provision.Tokens{Dir: provision.DefaultTokenDir()}
	token := c.String("token")
	if token == "" {
		if token, err = tokens.Read(name); err != nil {
			return provisionErr(c, err)
		}
	}
	opts, err := tokens.ClientOptions(name)
	if err != nil {
		return provisionErr(c, err)
	}
	client, err := api.NewClient(cl.API, token, opts...)
	if err != nil {
		return provisionErr(c, err)
	}
	ctl := &autoscale.Controller{Name: name, Policy: pol, Provider: p, Client: client,
		Decided: func(d autoscale.Decision) { fmt.Fprintln(c.App.Writer, decisionLine(time.Now(), d)) }}
	fmt.Fprintln(c.App.Writer, policyLine(name, len(cl.Agents), pol))
	if c.Bool("once") {
		sctx, cancel := context.WithTimeout(ctx, c.Duration("timeout"))
		defer cancel()
		d, err := ctl.Step(sctx)
		if err != nil {
			return provisionErr(c, err)
		}
		if d.Kind == autoscale.Steady {
			fmt.Fprintln(c.App.Writer, "nothing to change")
		}
		return nil
	}
	return provisionErr(c, ctl.Run(ctx))
}

// policyLine is what `cluster autoscale` says it keeps, when it starts.
func policyLine(name string, nodes int, pol autoscale.Policy) string {
	d := pol.WithDefaults()
	return fmt.Sprintf("cluster %s: %d nodes; keeping %d..%d (grace %s, idle below %.0f%% for %s, cooldown %s)",
		name, nodes, pol.Min, pol.Max, d.Grace, pol.IdleBelow*100, d.IdleFor, d.Cooldown)
}

// decisionLine is one change or refusal, as it is made.
func decisionLine(at time.Time, d autoscale.Decision) string {
	return fmt.Sprintf("%s %s: %s", at.Format("15:04:05"), d.Kind, d.Reason)
}

func dur(c *cli.Context, name string) cluster.Duration { return cluster.Duration(c.Duration(name)) }
