package provision

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/stormdock/stormdock/api"
)

// Drain moves every worker off nodes through the master's API (`stormdock node drain`)
// and waits until the nodes run nothing and every job runs at least as many workers as
// before, so that nothing is lost when the nodes go. Nodes the master does not know are
// skipped. If ctx ends first, the nodes are undrained again and the error says so.
func Drain(ctx context.Context, cl *api.Client, nodes []string, log *slog.Logger) error {
	before, err := runningByJob(ctx, cl)
	if err != nil {
		return err
	}
	live, err := cl.Nodes(ctx)
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	var drained []string
	for _, n := range live {
		if !slices.Contains(nodes, n.ID) {
			continue
		}
		if err := cl.DrainNode(ctx, n.ID, true); err != nil {
			undrain(cl, drained, log)
			return fmt.Errorf("drain node %s: %w", n.ID, err)
		}
		drained = append(drained, n.ID)
	}
	log.Info("draining", "nodes", drained)
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		done, why, err := drainDone(ctx, cl, drained, before)
		if err == nil && done {
			return nil
		}
		select {
		case <-ctx.Done():
			undrain(cl, drained, log)
			if err == nil {
				err = errors.New(why)
			}
			return fmt.Errorf("drain of %v did not finish (%v): %w; the nodes were undrained and nothing was removed: check that the other agents have free slots (stormdock node list)", drained, err, ctx.Err())
		case <-t.C:
		}
	}
}

// Undrain lets nodes take work again. Called after their agents are gone, it clears the
// drain mark, so that a later agent with the same node id is not born drained.
func Undrain(ctx context.Context, cl *api.Client, nodes []string) error {
	for _, id := range nodes {
		if err := cl.DrainNode(ctx, id, false); err != nil && !errors.Is(err, api.ErrNotFound) {
			return fmt.Errorf("undrain node %s: %w", id, err)
		}
	}
	return nil
}

func undrain(cl *api.Client, nodes []string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Undrain(ctx, cl, nodes); err != nil {
		log.Warn("undrain after a failed drain", "nodes", nodes, "err", err)
	}
}

func runningByJob(ctx context.Context, cl *api.Client) (map[string]int, error) {
	jobs, err := cl.Jobs(ctx)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	out := make(map[string]int, len(jobs))
	for _, j := range jobs {
		out[j.Name] = j.Running
	}
	return out, nil
}

// drainDone tells whether the drained nodes run nothing and every job that ran workers
// before runs as many again (or all it now wants, if it was scaled in meanwhile).
func drainDone(ctx context.Context, cl *api.Client, drained []string, before map[string]int) (bool, string, error) {
	nodes, err := cl.Nodes(ctx)
	if err != nil {
		return false, "", err
	}
	for _, n := range nodes {
		if slices.Contains(drained, n.ID) && (n.Workers > 0 || n.SlotsUsed > 0) {
			return false, fmt.Sprintf("node %s still runs %d worker(s)", n.ID, max(n.Workers, n.SlotsUsed)), nil
		}
	}
	jobs, err := cl.Jobs(ctx)
	if err != nil {
		return false, "", err
	}
	for _, j := range jobs {
		if want := min(before[j.Name], j.Workers); j.Running < want {
			return false, fmt.Sprintf("job %s runs %d of %d worker(s)", j.Name, j.Running, want), nil
		}
	}
	return true, "", nil
}
