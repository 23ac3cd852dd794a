// Package image is `stormdock image`: build, push, list and prune worker images on the local
// Docker engine.
package image

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/moby/term"
	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/isolation/docker"
	"github.com/stormdock/stormdock/tools/commands"
)

// registryAuthFlag names Docker's config.json to take registry credentials from.
var registryAuthFlag = &cli.StringFlag{Name: "registry-auth", Usage: "registry credentials `FILE` in Docker's config.json format (default: ~/.docker/config.json when it exists)"}

// Command builds, pushes and garbage-collects worker images on the local Docker engine.
var Command = &cli.Command{
	Name:  "image",
	Usage: "build, push, list and prune worker images (FROM scratch around the static stormdock binary)",
	Description: "Talks to the engine at DOCKER_HOST or the default socket. Images pushed to a registry (--tag REGISTRY/NAME:TAG)\n" +
		"are pulled by agents that lack them. The stormdock binary put into images is this one if it is static\n" +
		"(CGO_ENABLED=0), else name one with --binary; stormdock-shim, the small binary every process worker\n" +
		"starts with, goes in beside it. share, unshare and shared talk to the master instead (admin only): images under a\n" +
		"shared prefix are fetched with the master's and agents' own --registry-auth, every other image with its tenant's\n" +
		"(`stormdock tenant registry-auth`). Flags go first.",
	Subcommands: []*cli.Command{
		{
			Name:      "build",
			Usage:     "build a worker image, and push it with --push",
			UsageText: "stormdock image build [--tag REGISTRY/NAME:TAG] [--push] [--binary PATH] [--shim PATH] [--job PATH] [--label KEY=VALUE ...] [--registry-auth FILE]",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "tag", Usage: "image `NAME:TAG` (REGISTRY/NAME:TAG to push it)", Value: images.DefaultTag},
				&cli.StringFlag{Name: "binary", Usage: "static stormdock binary to embed at " + images.StormdockPath + " (default: this one)"},
				&cli.StringFlag{Name: "job", Usage: "a job's own static binary to embed at " + images.JobPath},
				&cli.StringFlag{Name: "shim", Usage: "static stormdock-shim to embed at " + images.ShimPath + " (default: the one beside --binary)"},
				&cli.BoolFlag{Name: "push", Usage: "push the image to the registry its tag names"},
				&cli.StringSliceFlag{Name: "label", Usage: "`KEY=VALUE` label on the image (repeatable; io.stormdock.* keys are the builder's own)"},
				registryAuthFlag,
			},
			Action: imageBuild,
		},
		{
			Name:      "push",
			Usage:     "push an image to the registry its tag names",
			UsageText: "stormdock image push [--registry-auth FILE] REGISTRY/NAME:TAG",
			Flags:     []cli.Flag{registryAuthFlag},
			Action:    imagePush,
		},
		{
			Name:   "list",
			Usage:  "list stormdock images with their registry digests",
			Flags:  []cli.Flag{commands.OutputFlag},
			Action: imageList,
		},
		{
			Name:   "prune",
			Usage:  "remove stormdock images no container uses",
			Action: imagePrune,
		},
		{
			Name: "share",
			Usage: "share a repository prefix (REGISTRY/PATH/, like 127.0.0.1:5055/base/) with every tenant: its images are pinned and pulled " +
				"with the master's and the nodes' own --registry-auth (admin only; other images only with their tenant's credentials)",
			ArgsUsage: "PREFIX",
			Flags:     commands.MasterFlags(),
			Action:    imageShare(true),
		},
		{
			Name:      "unshare",
			Usage:     "stop sharing a repository prefix (admin only)",
			ArgsUsage: "PREFIX",
			Flags:     commands.MasterFlags(),
			Action:    imageShare(false),
		},
		{
			Name:   "shared",
			Usage:  "list the shared repository prefixes (admin only)",
			Flags:  append(commands.MasterFlags(), commands.OutputFlag),
			Action: imageShared,
		},
	},
}

// imageManager connects to the engine, with the registry credentials of --registry-auth
// when the command has that flag.
func imageManager(c *cli.Context) (*images.Manager, io.Closer, error) {
	var opts []images.Option
	if c.Command.Names()[0] == "build" || c.Command.Names()[0] == "push" {
		a, err := registryAuth(c.String("registry-auth"))
		if err != nil {
			return nil, nil, commands.UsageErr("--registry-auth: %v", err)
		}
		opts = append(opts, images.WithAuth(a))
	}
	dc, err := docker.Connect(c.Context, "")
	if err != nil {
		return nil, nil, cli.Exit("stormdock image: "+err.Error(), 1)
	}
	return images.New(dc, opts...), dc, nil
}

// registryAuth loads the named credentials file, or Docker's own when none is named and it
// exists; nil means anonymous.
func registryAuth(path string) (*images.Auth, error) {
	if path == "" {
		dir := os.Getenv("DOCKER_CONFIG")
		if dir == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return nil, nil //nolint:nilerr // no home: anonymous
			}
			dir = filepath.Join(home, ".docker")
		}
		path = filepath.Join(dir, "config.json")
		if _, err := os.Stat(path); err != nil {
			return nil, nil
		}
	}
	return images.LoadAuth(path)
}

// progress shows the engine's progress bars when stderr is a terminal, one line per step
// otherwise.
func progress(c *cli.Context) images.Progress {
	w := c.App.ErrWriter
	if w == nil {
		w = os.Stderr
	}
	pr := images.Progress{Out: w}
	if f, ok := w.(*os.File); ok {
		pr.FD, pr.Terminal = term.GetFdInfo(f)
	}
	return pr
}

func imageBuild(c *cli.Context) error {
	if c.NArg() > 0 {
		return commands.UsageErr("image build takes no arguments (got %q): use --tag, --binary and --job, flags first", c.Args().First())
	}
	labels, err := parseLabels(c.StringSlice("label"))
	if err != nil {
		return err
	}
	tag := c.String("tag")
	if c.Bool("push") {
		if err := pushable(tag); err != nil {
			return err
		}
	}
	m, closer, err := imageManager(c)
	if err != nil {
		return err
	}
	defer closer.Close()
	img, err := m.Build(c.Context, images.BuildOptions{Tag: tag, Binary: c.String("binary"), Job: c.String("job"), Shim: c.String("shim"), Labels: labels})
	if err != nil {
		code := 1
		if errors.Is(err, images.ErrNotStatic) {
			code = 2
		}
		return cli.Exit("stormdock image build: "+strings.ReplaceAll(err.Error(), "\n", "; "), code)
	}
	fmt.Fprintf(c.App.Writer, "%s %s\n", img.ID, strings.Join(img.Tags, ","))
	if img.Labels[images.LabelShim] == "" {
		fmt.Fprintf(c.App.ErrWriter, "stormdock image build: no stormdock-shim beside the stormdock binary, so none in the image: agents run from it (cluster create) start every worker through the whole binary; build both (CGO_ENABLED=0 go build -o DIR/ ./cmd/stormdock ./cmd/stormdock-shim) or give --shim\n")
	}
	if c.Bool("push") {
		return push(c, m, tag)
	}
	return nil
}

// pushable refuses a tag that names no registry before anything is built or sent.
func pushable(tag string) error {
	r, err := images.ParseRef(tag)
	switch {
	case err != nil:
		return commands.UsageErr("%v", err)
	case r.Digest != "":
		return commands.UsageErr("%s is a digest: push a tag (REGISTRY/NAME:TAG)", tag)
	case !r.Explicit:
		return commands.UsageErr("%s names no registry: tag it REGISTRY/NAME:TAG (e.g. 127.0.0.1:5000/%s)", tag, tag)
	}
	return nil
}

func push(c *cli.Context, m *images.Manager, tag string) error {
	dgst, err := m.Push(c.Context, tag, progress(c))
	if err != nil {
		return cli.Exit("stormdock image push: "+err.Error(), 1)
	}
	r, _ := images.ParseRef(tag)
	pinned, _ := r.WithDigest(dgst)
	fmt.Fprintf(c.App.Writer, "pushed %s\n%s\n", tag, pinned)
	return nil
}

func imagePush(c *cli.Context) error {
	if c.NArg() != 1 {
		return commands.UsageErr("image push takes one REGISTRY/NAME:TAG (flags first)")
	}
	tag := c.Args().First()
	if err := pushable(tag); err != nil {
		return err
	}
	m, closer, err := imageManager(c)
	if err != nil {
		return err
	}
	defer closer.Close()
	return push(c, m, tag)
}

func imageList(c *cli.Context) error {
	m, closer, err := imageManager(c)
	if err != nil {
		return err
	}
	defer closer.Close()
	imgs, err := m.List(c.Context, nil)
	if err != nil {
		return cli.Exit("stormdock image list: "+err.Error(), 1)
	}
	return commands.PrintOut(c, imgs, func(w io.Writer) {
		fmt.Fprintln(w, "ID\tTAGS\tDIGEST\tSIZE\tCREATED")
		for _, img := range imgs {
			dg := "-"
			if len(img.Digests) > 0 {
				_, d, _ := strings.Cut(img.Digests[0], "@")
				dg = d
				if len(img.Digests) > 1 {
					dg += fmt.Sprintf(" (+%d)", len(img.Digests)-1)
				}
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", shortID(img.ID), strings.Join(img.Tags, ","), dg,
				fmt.Sprintf("%.1fMiB", float64(img.Size)/float64(isolation.MiB)), img.Created.Format("2006-01-02 15:04:05"))
		}
	})
}

func imagePrune(c *cli.Context) error {
	m, closer, err := imageManager(c)
	if err != nil {
		return err
	}
	defer closer.Close()
	removed, err := m.Prune(c.Context, nil)
	if err != nil {
		return cli.Exit("stormdock image prune: "+err.Error(), 1)
	}
	for _, img := range removed {
		fmt.Fprintf(c.App.Writer, "removed %s %s\n", shortID(img.ID), strings.Join(img.Tags, ","))
	}
	fmt.Fprintf(c.App.Writer, "%d image(s) removed\n", len(removed))
	return nil
}

func shortID(id string) string {
	id = strings.TrimPrefix(id, "sha256:")
	return id[:min(12, len(id))]
}

// labelKey is what a label's key may be: Docker's reverse-DNS convention (io.example.key),
// without anything a Dockerfile's LABEL line would read otherwise.
var labelKey = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$`)

// parseLabels reads --label KEY=VALUE flags. Keys under io.stormdock. are the builder's (which
// binary, which shim, managed by stormdock): an image that lied about them would be pruned or
// trusted wrongly.
func parseLabels(flags []string) (map[string]string, error) {
	if len(flags) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(flags))
	for _, f := range flags {
		k, v, ok := strings.Cut(f, "=")
		switch {
		case !ok || !labelKey.MatchString(k):
			return nil, commands.UsageErr("--label %q: want KEY=VALUE, the key 1-128 letters, digits, '.', '_', '/' or '-' (like io.example.team=streams)", f)
		case strings.HasPrefix(k, "io.stormdock."):
			return nil, commands.UsageErr("--label %q: io.stormdock.* labels are set by the builder; use a key of your own", f)
		case len(v) > 1024 || strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }):
			return nil, commands.UsageErr("--label %q: the value must be at most 1024 bytes without control characters", f)
		}
		out[k] = v
	}
	return out, nil
}

// imageShare shares or unshares a prefix through the master; the prefix is checked here first.
func imageShare(share bool) cli.ActionFunc {
	return func(c *cli.Context) error {
		if err := commands.WantArgs(c, 1, "a repository PREFIX (REGISTRY/PATH/)"); err != nil {
			return err
		}
		prefix := c.Args().First()
		if _, err := images.CheckPrefix(prefix); err != nil {
			return commands.UsageErr("%v", err)
		}
		cl, err := commands.NewClient(c)
		if err != nil {
			return err
		}
		ps, err := cl.ShareImages(c.Context, prefix, share)
		if err != nil {
			return commands.APIErr(c, err)
		}
		verb := "shared"
		if !share {
			verb = "unshared"
		}
		fmt.Fprintf(c.App.Writer, "%s %s; shared now: %s\n", verb, prefix, commands.OrDash(strings.Join(ps, ", ")))
		return nil
	}
}

func imageShared(c *cli.Context) error {
	if err := commands.WantArgs(c, 0, "no arguments"); err != nil {
		return err
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	ps, err := cl.SharedImages(c.Context)
	if err != nil {
		return commands.APIErr(c, err)
	}
	return commands.PrintOut(c, api.SharedImages{Prefixes: ps}, func(w io.Writer) {
		fmt.Fprintln(w, "PREFIX")
		for _, p := range ps {
			fmt.Fprintln(w, p)
		}
	})
}
