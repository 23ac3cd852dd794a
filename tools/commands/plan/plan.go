// Package plan is `stormdock plan`: a dry run of the placement engine on files, with no
// master and no store.
package plan

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/placement"
)

// Command is a dry run of the placement engine on files: no master, no store.
var Command = &cli.Command{
	Name:      "plan",
	Usage:     "show where the placement engine would put jobs' workers on a cluster (dry run)",
	UsageText: "stormdock plan --cluster CLUSTER.json --job JOB.yaml [--job ...] [--current ASSIGNMENT.json] [-o json|table]",
	Description: "CLUSTER.json is {\"nodes\": [{\"id\", \"dc\", \"rack\", \"slots\", \"memory\", \"cpu\", ...}]}; job files\n" +
		"are job specs (YAML or JSON); ASSIGNMENT.json is {\"placements\": [{\"job\", \"worker\", \"node\"}]}, the\n" +
		"same shape as this command's JSON output, so a plan can be fed back to see what changes.\n" +
		"Exit codes: 0 planned (even with unplaced workers), 2 invalid input.",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "cluster", Usage: "cluster `FILE` (JSON or YAML), required"},
		&cli.StringSliceFlag{Name: "job", Usage: "job spec `FILE` (repeatable), at least one"},
		&cli.StringFlag{Name: "current", Usage: "current assignment `FILE`: what runs where now"},
		&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "output format: table or json", Value: "table"},
	},
	Action: runPlan,
}

func runPlan(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("stormdock plan: unexpected argument %q (flags go first; use --job FILE)", c.Args().First()), 2)
	}
	format := c.String("output")
	if format != "table" && format != "json" {
		return cli.Exit(fmt.Sprintf("stormdock plan: --output must be table or json, not %q", format), 2)
	}
	if c.String("cluster") == "" || len(c.StringSlice("job")) == 0 {
		return cli.Exit("stormdock plan: needs --cluster FILE and at least one --job FILE (see --help)", 2)
	}
	in, problems := readPlanInput(c.String("cluster"), c.StringSlice("job"), c.String("current"))
	if len(problems) == 0 {
		res, err := placement.Plan(in)
		if err == nil {
			if format == "json" {
				enc := json.NewEncoder(c.App.Writer)
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			writePlanTable(c.App.Writer, res)
			return nil
		}
		problems = append(problems, strings.Split(err.Error(), "\n")...)
	}
	for i, p := range problems {
		problems[i] = "stormdock plan: " + p
	}
	return cli.Exit(strings.Join(problems, "\n"), 2)
}

// readPlanInput reads every file and returns every problem found, one per line.
func readPlanInput(clusterFile string, jobFiles []string, currentFile string) (placement.Input, []string) {
	var in placement.Input
	var problems []string
	report := func(file string, err error) {
		var ve *cluster.ValidationError
		if errors.As(err, &ve) {
			for _, p := range ve.Problems {
				problems = append(problems, file+": "+p.String())
			}
			return
		}
		problems = append(problems, file+": "+err.Error())
	}
	if data, err := os.ReadFile(clusterFile); err != nil {
		problems = append(problems, err.Error())
	} else if inv, err := cluster.ParseInventory(data); err != nil {
		report(clusterFile, err)
	} else {
		in.Nodes = inv.Nodes
	}
	seen := map[string]string{}
	for _, f := range jobFiles {
		data, err := os.ReadFile(f)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		j, err := cluster.ParseJobSpec(data)
		if err != nil {
			report(f, err)
			continue
		}
		if first, dup := seen[j.Name]; dup {
			problems = append(problems, fmt.Sprintf("%s: job %q is already defined in %s", f, j.Name, first))
			continue
		}
		seen[j.Name] = f
		in.Jobs = append(in.Jobs, *j)
	}
	if currentFile != "" {
		var a cluster.Assignment
		if data, err := os.ReadFile(currentFile); err != nil {
			problems = append(problems, err.Error())
		} else if err := cluster.Decode(data, &a, "assignment"); err != nil {
			report(currentFile, err)
		} else if err := a.Check(); err != nil {
			report(currentFile, err)
		} else {
			in.Current = a.Placements
		}
	}
	return in, problems
}

// Width is the width the table output fits in.
const Width = 100

func writePlanTable(w io.Writer, r *placement.Result) {
	fmt.Fprintf(w, "%d placed, %d unplaced, %d moves\n", len(r.Placements), len(r.Unplaced), len(r.Moves))
	if len(r.Placements) > 0 {
		rows := make([][]string, len(r.Placements))
		for i, p := range r.Placements {
			rows[i] = []string{p.Job, p.Link, strconv.Itoa(p.Worker), p.Node}
		}
		fmt.Fprintln(w)
		writeTable(w, []string{"JOB", "LINK", "WORKER", "NODE"}, []int{32, 16, 6, 0}, rows)
	}
	if len(r.Unplaced) > 0 {
		// Workers of one job share their reason: one row per run of workers.
		var rows [][]string
		for i := 0; i < len(r.Unplaced); {
			u := r.Unplaced[i]
			var ws []int
			for ; i < len(r.Unplaced); i++ {
				v := r.Unplaced[i]
				if v.Job != u.Job || v.Link != u.Link || v.Reason != u.Reason {
					break
				}
				ws = append(ws, v.Worker)
			}
			rows = append(rows, []string{u.Job, u.Link, workerRanges(ws), u.Reason})
		}
		fmt.Fprintln(w, "\nUNPLACED")
		writeTable(w, []string{"JOB", "LINK", "WORKERS", "REASON"}, []int{24, 10, 12, 0}, rows)
	}
	if len(r.Moves) > 0 {
		rows := make([][]string, len(r.Moves))
		for i, m := range r.Moves {
			to := m.To
			if to == "" {
				to = "-"
			}
			rows[i] = []string{m.Job, m.Link, strconv.Itoa(m.Worker), m.From, to, m.Reason}
		}
		fmt.Fprintln(w, "\nMOVES")
		writeTable(w, []string{"JOB", "LINK", "WORKER", "FROM", "TO", "REASON"}, []int{20, 8, 6, 14, 14, 0}, rows)
	}
}

// workerRanges writes sorted worker indexes as "0-3,7,9-10".
func workerRanges(ws []int) string {
	var b strings.Builder
	for i := 0; i < len(ws); {
		j := i
		for j+1 < len(ws) && ws[j+1] == ws[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(ws[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(ws[j]))
		}
		i = j + 1
	}
	return b.String()
}

// writeTable writes aligned columns within Width. Each column is as wide as its widest
// cell up to its cap (longer cells are cut, ending in "~"); the last column, cap 0, takes
// the rest of the line and wraps at spaces onto indented lines.
func writeTable(w io.Writer, header []string, caps []int, rows [][]string) {
	widths := make([]int, len(header))
	for i, h := range header {
		widths[i] = len(h)
	}
	for _, row := range rows {
		for i, cell := range row {
			widths[i] = max(widths[i], len(cell))
		}
	}
	indent := 0
	for i := range widths {
		if caps[i] > 0 {
			widths[i] = min(widths[i], caps[i])
		}
		if i < len(widths)-1 {
			indent += widths[i] + 2
		}
	}
	last := len(widths) - 1
	if caps[last] == 0 {
		widths[last] = max(Width-indent, 20)
	}
	line := func(row []string) {
		var b strings.Builder
		for i, cell := range row[:last] {
			b.WriteString(fmt.Sprintf("%-*s  ", widths[i], cut(cell, widths[i])))
		}
		rest := row[last]
		if caps[last] > 0 {
			rest = cut(rest, widths[last])
		}
		for first := true; first || rest != ""; first = false {
			if !first {
				b.WriteString("\n" + strings.Repeat(" ", indent))
			}
			var chunk string
			chunk, rest = wrapOnce(rest, widths[last])
			b.WriteString(chunk)
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	line(header)
	for _, row := range rows {
		line(row)
	}
}

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "~"
}

// wrapOnce splits s into a first line of at most n bytes, broken after a comma when it can
// be (reasons are lists), else at a space, and the rest.
func wrapOnce(s string, n int) (string, string) {
	if len(s) <= n {
		return s, ""
	}
	if i := strings.LastIndex(s[:n+1], ", "); i > n/2 {
		return s[:i+1], strings.TrimLeft(s[i+1:], " ")
	}
	if i := strings.LastIndexByte(s[:n+1], ' '); i > 0 {
		return s[:i], strings.TrimLeft(s[i+1:], " ")
	}
	return s[:n], s[n:]
}
