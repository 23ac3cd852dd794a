// Package events is `stormdock events`: the cluster's event log, read or followed through a
// master's API.
package events

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/tools/commands"
)

// Command shows the cluster's events.
var Command = &cli.Command{
	Name:  "events",
	Usage: "show what happened in the cluster: jobs, workers, nodes, data centers, links, API changes",
	Description: "Events are kept by the masters, bounded by count and age (stormdock master --events-max,\n" +
		"--events-max-age), oldest first. -f prints them as they happen until interrupted. A tenant's\n" +
		"token sees its own jobs' events alone. -o json prints one JSON object per line with -f.",
	Flags: append(commands.MasterFlags(), commands.OutputFlag,
		&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "print events as they happen, after the kept ones"},
		&cli.StringFlag{Name: "job", Usage: "only this job's events (its output routers' included)"},
		&cli.StringFlag{Name: "node", Usage: "only events on this node (or moving a worker to it)"},
		&cli.StringFlag{Name: "dc", Usage: "only events in this data center"},
		&cli.StringFlag{Name: "kind", Usage: "only events of these `KINDS`, separated by commas; one ending in a dot takes every kind it starts (node.,worker.exited)"},
		&cli.StringFlag{Name: "since", Usage: "only events of the last `DURATION` (10m, 2h) or since an RFC 3339 time"},
	),
	Action: runEvents,
}

func runEvents(c *cli.Context) error {
	if err := commands.WantArgs(c, 0, "no arguments"); err != nil {
		return err
	}
	f := api.EventFilter{Job: c.String("job"), Node: c.String("node"), DC: c.String("dc")}
	for flag, v := range map[string]string{"job": f.Job, "node": f.Node, "dc": f.DC} {
		if v != "" {
			if err := cluster.CheckName(v); err != nil {
				return commands.UsageErr("--%s: %v", flag, err)
			}
		}
	}
	if s := c.String("kind"); s != "" {
		kinds, err := api.ParseKinds(s)
		if err != nil {
			return commands.UsageErr("--kind: %v", strings.TrimPrefix(err.Error(), api.ErrBadInput.Error()+": "))
		}
		f.Kinds = kinds
	}
	if s := c.String("since"); s != "" {
		if d, err := time.ParseDuration(s); err == nil && d >= 0 {
			f.Since = time.Now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339, s); err == nil {
			f.Since = t
		} else {
			return commands.UsageErr("--since %q: give a duration back from now (10m, 2h) or an RFC 3339 time", s)
		}
	}
	out := c.String("output")
	if out != "table" && out != "json" {
		return commands.UsageErr("-o must be table or json, not %q", out)
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	w := c.App.Writer
	if !c.Bool("follow") {
		evs, err := cl.Events(c.Context, f, 0)
		if err != nil {
			return commands.APIErr(c, err)
		}
		if evs == nil {
			evs = []api.Event{}
		}
		return commands.PrintOut(c, evs, func(w io.Writer) {
			fmt.Fprintln(w, "TIME\tKIND\tOBJECT\tNODE\tREASON")
			for _, e := range evs {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", eventTime(e.Time), e.Kind, commands.Clip(e.Object, 32), commands.Clip(eventNode(e), 24), commands.Clip(e.Reason, 120))
			}
		})
	}
	if out == "table" {
		fmt.Fprintf(w, "%-12s  %-20s  %-28s  %-16s  %s\n", "TIME", "KIND", "OBJECT", "NODE", "REASON")
	}
	enc := json.NewEncoder(w)
	err = cl.FollowEvents(c.Context, f, func(e api.Event) error {
		if out == "json" {
			return enc.Encode(e)
		}
		_, err := fmt.Fprintf(w, "%-12s  %-20s  %-28s  %-16s  %s\n", eventTime(e.Time), e.Kind, commands.Clip(e.Object, 28), commands.Clip(eventNode(e), 16), e.Reason)
		return err
	})
	return commands.APIErr(c, err)
}

// eventTime shows an event's time in the local zone: the time of day for today's, the date
// too for older ones.
func eventTime(t time.Time) string {
	t = t.Local()
	if y, m, d := t.Date(); time.Now().Day() == d && time.Now().Month() == m && time.Now().Year() == y {
		return t.Format("15:04:05.000")
	}
	return t.Format("01-02 15:04:05")
}

// eventNode is where an event happened: a node, a move from one to another, or a data
// center.
func eventNode(e api.Event) string {
	switch {
	case e.To != "":
		return e.Node + ">" + e.To
	case e.Node != "":
		return e.Node
	}
	return e.DC
}
