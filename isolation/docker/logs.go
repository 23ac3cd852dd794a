package docker

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/stormdock/stormdock/internal/ctxtime"
	"github.com/stormdock/stormdock/isolation"
)

// The engine keeps a container's output (json-file, capped at the spec's log limit) until the
// container is removed. When a worker ends, Stop keeps its container, renamed to
// previousName, in place of the one kept before, so that the output of the run before a
// restart can still be read; Discard removes it when the worker leaves the node.

// previousName is the name the ended container of a worker keeps. Worker ids never end in
// "_previous" (agents make them of dotted names and an index), and Adopt takes only
// containers whose name is their worker's ContainerName.
func (d *Driver) previousName(id string) string { return d.ContainerName(id) + "_previous" }

// keepPrevious renames the ended container cid to the worker's previous one, replacing the
// one kept before; where that fails it removes cid.
func (d *Driver) keepPrevious(ctx context.Context, id, cid string) error {
	prev := d.previousName(id)
	if err := d.api.ContainerRemove(ctx, prev, container.RemoveOptions{Force: true}); err != nil && !errdefs.IsNotFound(err) {
		d.log.Warn("remove the previous run's container", "id", id, "err", err)
	}
	if err := d.api.ContainerRename(ctx, cid, prev); err != nil {
		d.log.Warn("keep the ended container for its logs", "id", id, "err", err)
		if err := d.api.ContainerRemove(ctx, cid, container.RemoveOptions{Force: true}); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// Discard removes what the driver keeps of a worker that left the node: the container of
// its previous run.
func (d *Driver) Discard(ctx context.Context, id string) error {
	if err := d.api.ContainerRemove(ctx, d.previousName(id), container.RemoveOptions{Force: true}); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove the previous run of %s: %w", id, err)
	}
	return nil
}

// Logs implements isolation.LogReader through the engine's log API.
func (d *Driver) Logs(ctx context.Context, id string, opts isolation.LogOptions) (io.ReadCloser, error) {
	if err := isolation.ValidateID(id); err != nil {
		return nil, err
	}
	name := d.ContainerName(id)
	if opts.Previous {
		name, opts.Follow = d.previousName(id), false
	}
	info, err := d.api.ContainerInspect(ctx, name)
	switch {
	case errdefs.IsNotFound(err) && opts.Previous:
		return nil, fmt.Errorf("%w: worker %s has no run before its last restart on this node", isolation.ErrNoLogs, id)
	case errdefs.IsNotFound(err) && !opts.Follow:
		return nil, fmt.Errorf("%w: worker %s has no container on this node", isolation.ErrNoLogs, id)
	case err != nil && !errdefs.IsNotFound(err):
		return nil, fmt.Errorf("inspect %s: %w", name, err)
	}
	tail := "all"
	if opts.Tail >= 0 {
		tail = strconv.Itoa(opts.Tail)
	}
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		defer cancel()
		cid := info.ID
		for {
			if cid != "" {
				rctx, stop, ended := ctx, func() {}, func() bool { return false }
				if opts.Follow {
					rctx, stop, ended = d.untilEnded(ctx, cid)
				}
				rc, err := d.api.ContainerLogs(rctx, cid, container.LogsOptions{ShowStdout: true, ShowStderr: true, Follow: opts.Follow, Tail: tail})
				if err == nil {
					_, err = stdcopy.StdCopy(pw, pw, rc)
					rc.Close()
				}
				stop()
				if err != nil && !errdefs.IsNotFound(err) && ctx.Err() == nil && !ended() {
					pw.CloseWithError(err)
					return
				}
			}
			if !opts.Follow || ctx.Err() != nil {
				pw.Close()
				return
			}
			// The run ended: follow the worker's next container, from its start.
			next, err := d.nextContainer(ctx, name, cid)
			if err != nil {
				pw.CloseWithError(nil)
				return
			}
			cid, tail = next, "all"
		}
	}()
	return &cancelReader{ReadCloser: pr, cancel: cancel}, nil
}

// Following a container's log, the engine ends the stream when the container stops; once in
// a while under load it does not, and a follower would wait on a dead container while its
// worker's next run writes elsewhere. untilEnded returns a context for following cid that
// ends endedGrace after the container is seen stopped (or gone), its output delivered by
// then, a function to call once done with it, and one reporting whether it ended so.
const (
	endedPoll  = 500 * time.Millisecond
	endedGrace = 2 * time.Second
)

func (d *Driver) untilEnded(ctx context.Context, cid string) (context.Context, context.CancelFunc, func() bool) {
	rctx, cancel := context.WithCancel(ctx)
	var ended atomic.Bool
	go func() {
		for ctxtime.Sleep(rctx, endedPoll) == nil {
			info, err := d.api.ContainerInspect(rctx, cid)
			if err == nil && info.State != nil && info.State.Running || err != nil && !errdefs.IsNotFound(err) {
				continue
			}
			if ctxtime.Sleep(rctx, endedGrace) == nil { // the stream did not end by itself
				ended.Store(true)
				cancel()
			}
			return
		}
	}()
	return rctx, cancel, ended.Load
}

// nextContainer waits for a container named name other than cid.
func (d *Driver) nextContainer(ctx context.Context, name, cid string) (string, error) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		info, err := d.api.ContainerInspect(ctx, name)
		if err == nil && info.ID != cid {
			return info.ID, nil
		}
		if err != nil && !errdefs.IsNotFound(err) && ctx.Err() == nil {
			d.log.Debug("inspect while following a log", "name", name, "err", err)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-t.C:
		}
	}
}

type cancelReader struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (r *cancelReader) Close() error {
	r.cancel()
	return r.ReadCloser.Close()
}
