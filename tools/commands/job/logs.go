package job

import (
	"bufio"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/tools/commands"
)

// jobLogsCommand prints a worker's output, through the master, from whichever node runs it.
var jobLogsCommand = &cli.Command{
	Name:      "logs",
	Usage:     "print a worker's output (stdout and stderr), from wherever it runs",
	ArgsUsage: "NAME",
	Description: "The master finds the node that runs the worker and relays its agent's answer: the CLI needs\n" +
		"nothing but the master's URL and a token that may see the job. --previous prints the run\n" +
		"before the worker's last restart on that node. --router prints a mirrored job's output router's\n" +
		"log instead: the one that leads, or --worker 0 or 1.",
	Flags: append(commands.MasterFlags(),
		&cli.IntFlag{Name: "worker", Usage: "the worker's index", Value: 0},
		&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing what the worker writes, also across its restarts, until interrupted"},
		&cli.IntFlag{Name: "tail", Usage: "start this many lines before the end (-1: the whole log kept)", Value: api.DefaultLogTail},
		&cli.BoolFlag{Name: "previous", Usage: "the run before the last restart"},
		&cli.StringFlag{Name: "link", Usage: "the link of a mirrored job's worker"},
		&cli.BoolFlag{Name: "router", Usage: "a mirrored job's output router: the one that leads, or the one --worker names (0 or 1)"},
	),
	Action: jobLogs,
}

func jobLogs(c *cli.Context) error {
	if err := commands.WantName(c, "the job NAME"); err != nil {
		return err
	}
	r := api.LogRequest{Worker: c.Int("worker"), Link: c.String("link"), Follow: c.Bool("follow"), Tail: c.Int("tail"), Previous: c.Bool("previous"),
		Router: c.Bool("router")}
	switch {
	case r.Worker < 0:
		return commands.UsageErr("--worker must be a worker's index, 0 or more")
	case r.Follow && r.Previous:
		return commands.UsageErr("--previous is a run that ended: it cannot be followed (drop -f or --previous)")
	case r.Router && r.Link != "":
		return commands.UsageErr("--router and --link: a router serves every link (drop --link)")
	case r.Router && !c.IsSet("worker"):
		r.Worker = api.LeadingRouter
	}
	if r.Link != "" {
		if err := cluster.CheckName(r.Link); err != nil {
			return commands.UsageErr("--link: %v", err)
		}
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	ctx := c.Context
	if r.Follow {
		// Interrupted, a follow ends as asked: exit 0.
		var stop func()
		ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
	}
	w := bufio.NewWriterSize(c.App.Writer, 32<<10)
	err = cl.Logs(ctx, c.Args().First(), r, w)
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	return commands.APIErr(c, err)
}
