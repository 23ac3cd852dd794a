package tools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/isolation/docker"
)

// ImageCommand builds and garbage-collects worker images on the local Docker engine.
var ImageCommand = &cli.Command{
	Name:  "image",
	Usage: "build, list and prune worker images (FROM scratch around the static stormdock binary)",
	Description: "Talks to the engine at DOCKER_HOST or the default socket; images are built locally, never pulled.\n" +
		"The stormdock binary put into images is this one if it is static (CGO_ENABLED=0), else name one with --binary.",
	Subcommands: []*cli.Command{
		{
			Name:      "build",
			Usage:     "build a worker image",
			UsageText: "stormdock image build [--tag T] [--binary PATH] [--job PATH]",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "tag", Usage: "image `NAME:TAG`", Value: images.DefaultTag},
				&cli.StringFlag{Name: "binary", Usage: "static stormdock binary to embed at " + images.StormdockPath + " (default: this one)"},
				&cli.StringFlag{Name: "job", Usage: "a job's own static binary to embed at " + images.JobPath},
			},
			Action: imageBuild,
		},
		{
			Name:   "list",
			Usage:  "list stormdock images",
			Flags:  []cli.Flag{outputFlag},
			Action: imageList,
		},
		{
			Name:   "prune",
			Usage:  "remove stormdock images no container uses",
			Action: imagePrune,
		},
	},
}

// imageManager connects to the engine.
func imageManager(ctx context.Context) (*images.Manager, io.Closer, error) {
	dc, err := docker.Connect(ctx, "")
	if err != nil {
		return nil, nil, cli.Exit("stormdock image: "+err.Error(), 1)
	}
	return images.New(dc), dc, nil
}

func imageBuild(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageErr("image build takes no arguments (got %q): use --binary and --job", c.Args().First())
	}
	m, closer, err := imageManager(c.Context)
	if err != nil {
		return err
	}
	defer closer.Close()
	img, err := m.Build(c.Context, images.BuildOptions{Tag: c.String("tag"), Binary: c.String("binary"), Job: c.String("job")})
	if err != nil {
		code := 1
		if errors.Is(err, images.ErrNotStatic) {
			code = 2
		}
		return cli.Exit("stormdock image build: "+strings.ReplaceAll(err.Error(), "\n", "; "), code)
	}
	fmt.Fprintf(c.App.Writer, "%s %s\n", img.ID, strings.Join(img.Tags, ","))
	return nil
}

func imageList(c *cli.Context) error {
	m, closer, err := imageManager(c.Context)
	if err != nil {
		return err
	}
	defer closer.Close()
	imgs, err := m.List(c.Context, nil)
	if err != nil {
		return cli.Exit("stormdock image list: "+err.Error(), 1)
	}
	return printOut(c, imgs, func(w io.Writer) {
		fmt.Fprintln(w, "ID\tTAGS\tSIZE\tCREATED")
		for _, img := range imgs {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", shortID(img.ID), strings.Join(img.Tags, ","),
				fmt.Sprintf("%.1fMiB", float64(img.Size)/float64(isolation.MiB)), img.Created.Format("2006-01-02 15:04:05"))
		}
	})
}

func imagePrune(c *cli.Context) error {
	m, closer, err := imageManager(c.Context)
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
