// Package link is `stormdock link`: a mirrored job's links, read from the store, and their
// output failed over through the job's router.
package link

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/multidc"
	"github.com/stormdock/stormdock/tools/commands"
)

// Command shows the links of a mirrored job and fails its output over between them.
var Command = &cli.Command{
	Name:  "link",
	Usage: "show a mirrored job's links (active, offsets, lag) and fail its output over",
	Subcommands: []*cli.Command{
		{
			Name:      "status",
			Usage:     "show the active link and each link's last produced and delivered offsets, lag and heartbeat age",
			ArgsUsage: "JOB",
			Flags:     append(linkFlags(), commands.OutputFlag),
			Action:    linkStatus,
		},
		{
			Name:   "ca",
			Usage:  "print the router CA's certificate (PEM): routers serve HTTPS with certificates issued from it (for Prometheus, --router-ca)",
			Flags:  linkFlags(),
			Action: linkCA,
		},
		{
			Name:      "failover",
			Usage:     "make another link the active one (default: the most advanced live standby)",
			ArgsUsage: "JOB",
			Flags:     append(linkFlags(), &cli.StringFlag{Name: "to", Usage: "the `LINK` to make active"}),
			Action:    linkFailover,
		},
	},
}

func linkFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "router", Usage: "the job's router `URL` (http://HOST:PORT)", EnvVars: []string{"STORMDOCK_ROUTER"}},
		&cli.StringFlag{Name: "store", Usage: "coordination store `URL`, to find the router (or its last status) by job, and for a failover the job's sender token", EnvVars: []string{"STORMDOCK_STORE"}},
		commands.StoreCredentialsFlag,
		commands.StoreTLSFlags[0], commands.StoreTLSFlags[1], commands.StoreTLSFlags[2],
		&cli.StringFlag{Name: "router-ca", Usage: "`FILE` (PEM) with the router CA's certificate, for an https --router without --store (with --store it is read from the store)"},
		&cli.StringFlag{Name: "token-file", Usage: "`FILE` with the job's sender token, for a failover through --router alone"},
	}
}

// linkStore opens --store for the link commands.
func linkStore(c *cli.Context) (coord.Store, error) {
	if _, err := coord.ParseURL(c.String("store")); err != nil {
		return nil, commands.UsageErr("--store: %v", err)
	}
	creds, err := commands.StoreCredentials(c)
	if err != nil {
		return nil, err
	}
	files, err := commands.StoreTLS(c)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
	defer cancel()
	s, err := coord.Open(ctx, c.String("store"), coord.Options{Credentials: creds, TLS: files, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, cli.Exit(fmt.Sprintf("stormdock: open store: %v", err), 1)
	}
	return s, nil
}

// routerOf returns the router URL of job from --router, or from its record in --store; rec
// is the record when it was read.
func routerOf(c *cli.Context, job string) (url string, rec *multidc.RouterRecord, err error) {
	if u := c.String("router"); u != "" {
		return u, nil, nil
	}
	if c.String("store") == "" {
		return "", nil, commands.UsageErr("give the job's router with --router URL or the store with --store URL")
	}
	ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
	defer cancel()
	s, err := linkStore(c)
	if err != nil {
		return "", nil, err
	}
	defer s.Close()
	r, ok, err := multidc.ReadRecord(ctx, s, job)
	if err != nil {
		return "", nil, cli.Exit("stormdock: "+err.Error(), 1)
	}
	if !ok {
		return "", nil, cli.Exit(fmt.Sprintf("stormdock: no router record for job %q in the store (%s/%s): is it mirrored, is its router running?", job, cluster.RoutersKey, job), 2)
	}
	return r.Router, &r, nil
}

func routerErr(err error) error {
	var ae *multidc.APIError
	if errors.As(err, &ae) && ae.Code >= 400 && ae.Code < 500 && ae.Code != 429 {
		return cli.Exit("stormdock: "+err.Error(), 2)
	}
	return cli.Exit("stormdock: "+err.Error(), 1)
}

func linkStatus(c *cli.Context) error {
	if err := commands.WantName(c, "the JOB"); err != nil {
		return err
	}
	job := c.Args().First()
	url, rec, err := routerOf(c, job)
	if err != nil {
		return err
	}
	var st multidc.Status
	source := "router " + url
	cl, cerr := routerClient(c, url)
	if cerr == nil {
		ctx, cancel := context.WithTimeout(c.Context, 3*time.Second)
		st, cerr = cl.Status(ctx)
		cancel()
	}
	switch {
	case cerr != nil && rec == nil:
		return routerErr(cerr)
	case cerr != nil:
		// The router is down or unreachable: what it last wrote to the store still tells
		// where output stands.
		st = rec.Status
		source = fmt.Sprintf("store, as of %s (router %s unreachable: %v)", rec.Updated.Format(time.RFC3339), url, cerr)
	case st.Job != job:
		return commands.UsageErr("the router at %s serves job %q, not %q", url, st.Job, job)
	}
	perr := commands.PrintOut(c, st, func(w io.Writer) {
		fmt.Fprintf(w, "JOB %s\tACTIVE %s\tDELIVERED %d\tCHECKPOINT %d\tFAILOVERS %d\n", st.Job, commands.OrDash(st.Active), st.Delivered, st.Checkpoint, st.Failovers)
		if f := st.LastFailover; f != nil {
			fmt.Fprintf(w, "LAST FAILOVER %s -> %s (%s) at offset %d, %s\n", f.From, f.To, f.Reason, f.NextOffset, f.At.Format(time.RFC3339))
		}
		fmt.Fprintf(w, "FROM %s\n\n", source)
		fmt.Fprintln(w, "LINK\tACTIVE\tALIVE\tWORKERS\tLAST PRODUCED\tLAST DELIVERED\tLAG\tBUFFERED\tHEARTBEAT AGE")
		for _, l := range st.Links {
			active, alive, age := "", "no", "never"
			if l.Active {
				active = "*"
			}
			if l.Alive {
				alive = "yes"
			}
			if l.HeartbeatAgeMs >= 0 {
				age = (time.Duration(l.HeartbeatAgeMs) * time.Millisecond).String()
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d/%d\t%d\t%d\t%d\t%d\t%s\n", commands.Clip(l.Link, 20), active, alive, l.WorkersAlive, l.Workers,
				l.LastProduced, l.LastDelivered, l.Lag, l.Buffered, age)
		}
	})
	if perr != nil {
		return perr
	}
	if cerr != nil {
		// What the store says is printed above; the router itself did not answer.
		return cli.Exit(fmt.Sprintf("stormdock: router %s of job %s unreachable: %v", url, job, cerr), 1)
	}
	return nil
}

func linkFailover(c *cli.Context) error {
	if err := commands.WantName(c, "the JOB"); err != nil {
		return err
	}
	job := c.Args().First()
	if to := c.String("to"); to != "" {
		if err := cluster.CheckName(to); err != nil {
			return commands.UsageErr("--to: link: %v", err)
		}
	}
	url, _, err := routerOf(c, job)
	if err != nil {
		return err
	}
	cl, err := routerClient(c, url)
	if err != nil {
		return commands.UsageErr("%v", err)
	}
	// A failover changes the job's output: the router asks for the job's sender token.
	switch {
	case c.String("token-file") != "":
		b, err := os.ReadFile(c.String("token-file"))
		if err != nil {
			return commands.UsageErr("--token-file: %v", err)
		}
		cl.Token = strings.TrimSpace(string(b))
	case c.String("store") != "":
		s, err := linkStore(c)
		if err != nil {
			return err
		}
		defer s.Close()
		if cl.Token, err = multidc.JobSenderToken(c.Context, s, job); err != nil {
			return cli.Exit("stormdock: "+err.Error(), 1)
		}
	default:
		return commands.UsageErr("a failover needs the job's sender token: give --store (with its credentials) or --token-file")
	}
	st, err := cl.Failover(c.Context, job, c.String("to"))
	if err != nil {
		return routerErr(err)
	}
	fmt.Fprintf(c.App.Writer, "job %s: active link %s from offset %d\n", job, st.Active, st.NextOffset)
	return nil
}

// routerClient is a client of the router at url that trusts the router CA: from
// --router-ca, or from the store.
func routerClient(c *cli.Context, url string) (*multidc.Client, error) {
	cl, err := multidc.NewClient(url)
	if err != nil {
		return nil, err
	}
	switch {
	case c.String("router-ca") != "":
		pool, err := multidc.RouterPool(c.String("router-ca"))
		if err != nil {
			return nil, commands.UsageErr("--router-ca: %v", err)
		}
		cl.TrustRouterCA(pool)
	case c.String("store") != "":
		s, err := linkStore(c)
		if err != nil {
			return nil, err
		}
		defer s.Close()
		ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
		defer cancel()
		ca, err := multidc.EnsureRouterCA(ctx, s)
		if err != nil {
			return nil, cli.Exit("stormdock: "+err.Error(), 1)
		}
		pool, err := ca.Pool()
		if err != nil {
			return nil, cli.Exit("stormdock: "+err.Error(), 1)
		}
		cl.TrustRouterCA(pool)
	}
	return cl, nil
}

// linkCA prints the router CA's certificate from the store.
func linkCA(c *cli.Context) error {
	if c.String("store") == "" {
		return commands.UsageErr("give the store with --store URL")
	}
	s, err := linkStore(c)
	if err != nil {
		return err
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
	defer cancel()
	ca, err := multidc.EnsureRouterCA(ctx, s)
	if err != nil {
		return cli.Exit("stormdock: "+err.Error(), 1)
	}
	_, err = io.WriteString(c.App.Writer, ca.Cert)
	return err
}
