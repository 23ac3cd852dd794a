package daemons

import (
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/tools/commands"
)

// sinkDirFlag is --sink-dir of master and agent: where mirrored jobs' file sinks may lie.
// The masters refuse file sinks outside it at submit, the agents give it to their routers,
// which open files below it only; without it, file sinks are off.
func sinkDirFlag() cli.Flag {
	return &cli.StringFlag{Name: "sink-dir", Usage: "`DIR` below which mirrored jobs' file sinks live, as DIR/TENANT/... (give masters and agents the same; default: none, file sinks refused)"}
}

// sinkDirOf reads --sink-dir, made absolute: specs name sink files by absolute path.
func sinkDirOf(c *cli.Context) (string, error) {
	d := c.String("sink-dir")
	if d == "" {
		return "", nil
	}
	abs, err := filepath.Abs(d)
	if err != nil {
		return "", commands.UsageErr("--sink-dir: %v", err)
	}
	return abs, nil
}
