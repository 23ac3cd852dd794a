package wordcount

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/stormdock/stormdock/cluster"
)

// follower follows a worker's live configuration (STORMDOCK_CONFIG): its agent rewrites the
// file and sends SIGHUP (Config.Reload); the file is also looked at every checkEvery, for a
// signal that came while the worker was starting.
type follower struct {
	path   string
	reload <-chan struct{}
	cur    cluster.WorkerConfig
	mod    time.Time
	next   time.Time // next look without a signal
}

const checkEvery = 500 * time.Millisecond

func newFollower(path string, reload <-chan struct{}) (*follower, error) {
	f := &follower{path: path, reload: reload}
	c, mod, err := readConfig(path)
	if err != nil {
		return nil, err
	}
	f.cur, f.mod, f.next = c, mod, time.Now().Add(checkEvery)
	return f, nil
}

func readConfig(path string) (cluster.WorkerConfig, time.Time, error) {
	var c cluster.WorkerConfig
	fi, err := os.Stat(path)
	if err != nil {
		return c, time.Time{}, fmt.Errorf("wordcount: live configuration: %w", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return c, time.Time{}, fmt.Errorf("wordcount: live configuration: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, time.Time{}, fmt.Errorf("wordcount: live configuration %s: %w", path, err)
	}
	if c.Workers < 1 || c.Worker < 0 || c.Worker >= c.Workers {
		return c, time.Time{}, fmt.Errorf("wordcount: live configuration %s: worker %d of %d", path, c.Worker, c.Workers)
	}
	return c, fi.ModTime(), nil
}

// changed reports a new partitioning (another epoch or worker count), looking at the file
// when a signal came or checkEvery passed.
func (f *follower) changed() (cluster.WorkerConfig, bool) {
	select {
	case <-f.reload:
	default:
		if time.Now().Before(f.next) {
			return f.cur, false
		}
	}
	f.next = time.Now().Add(checkEvery)
	fi, err := os.Stat(f.path)
	if err != nil || fi.ModTime().Equal(f.mod) {
		return f.cur, false
	}
	c, mod, err := readConfig(f.path)
	if err != nil {
		return f.cur, false // half written or gone: the next look tells
	}
	f.mod = mod
	if c.Epoch == f.cur.Epoch && c.Workers == f.cur.Workers {
		f.cur = c
		return c, false
	}
	f.cur = c
	return c, true
}

// wait pauses for d, or until ctx is done (false) or the configuration may have changed.
func (f *follower) wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(min(d, time.Until(f.next)+time.Millisecond))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-f.reload:
		f.next = time.Time{} // look now
	case <-t.C:
	}
	return true
}

// runLedger is the worker of a job whose output is a file and which has a live
// configuration: it re-partitions whenever the worker count changes, agreeing through the
// ledger (ledger.go) on who owns each offset, so the output holds each offset once.
func runLedger(ctx context.Context, cfg Config, prog *progress) error {
	f, err := newFollower(cfg.ConfigFile, cfg.Reload)
	if err != nil {
		return err
	}
	instance := newInstance()
	l, err := openLedger(cfg.Output, instance)
	if err != nil {
		return err
	}
	defer l.Close()
	// Not O_APPEND: records go at the end of the complete lines (appendLines), under the
	// ledger's lock, after a torn last line is cut off.
	out, err := os.OpenFile(cfg.Output, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("wordcount: output: %w", err)
	}
	defer out.Close()
	conf := f.cur
	log := cfg.Logger.With("instance", instance)
	for ctx.Err() == nil {
		resume, stale, err := l.join(conf.Epoch, conf.Workers, conf.Worker)
		if err != nil {
			return err
		}
		if stale {
			log.Warn("wordcount: epoch already over: waiting for a newer configuration", "epoch", conf.Epoch)
			for ctx.Err() == nil {
				if c, ok := f.changed(); ok {
					conf = c
					break
				}
				f.wait(ctx, time.Second)
			}
			continue
		}
		log.Info("wordcount: joined", "epoch", conf.Epoch, "workers", conf.Workers, "resume", resume)
		p, changed, err := waitPartition(ctx, cfg, l, f, conf)
		if err != nil {
			return err
		}
		next := resume
		if p != nil && changed == nil {
			next, changed, err = scan(ctx, cfg, l, out, f, p, conf, resume, prog)
			if errors.Is(err, errSuperseded) {
				// Another instance of this index took the epoch over (this one's node was cut
				// off, its lease lapsed, and it is draining while its replacement runs): what
				// this one had not written is the other's to emit.
				log.Warn("wordcount: another instance took this worker's epoch over: emitting nothing more there", "epoch", conf.Epoch, "worker", conf.Worker)
				if conf, err = waitFree(ctx, l, f, conf); err != nil {
					return err
				}
				continue
			}
			if err != nil {
				return err
			}
		}
		// Handing over: everything emitted is in the output; nothing more of this epoch.
		if err := l.stop(conf.Epoch, conf.Worker, next); err != nil {
			return err
		}
		if changed == nil {
			return nil // ctx done: drained
		}
		log.Info("wordcount: worker count changed", "epoch", changed.Epoch, "workers", changed.Workers, "handed over at", next)
		conf = *changed
	}
	return nil
}

// newInstance names this worker process in the ledger: random, so that two copies of an
// index (a lapsed one and its replacement) never share one.
func newInstance() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// waitFree waits, as a superseded instance, until ctx is done, the configuration changes
// (returned) or no other instance holds conf's epoch of its index any more (conf returned:
// join again).
func waitFree(ctx context.Context, l *ledger, f *follower, conf cluster.WorkerConfig) (cluster.WorkerConfig, error) {
	for f.wait(ctx, time.Second) {
		if c, ok := f.changed(); ok {
			return c, nil
		}
		held, err := l.heldByOther(conf.Epoch, conf.Worker)
		if err != nil {
			return conf, err
		}
		if !held {
			return conf, nil
		}
	}
	return conf, nil
}

// waitPartition waits until every earlier epoch is closed and returns the partition, or
// the new configuration when it changes meanwhile (nil, nil when ctx is done).
func waitPartition(ctx context.Context, cfg Config, l *ledger, f *follower, conf cluster.WorkerConfig) (*partition, *cluster.WorkerConfig, error) {
	logged := time.Now()
	for {
		p, waiting, err := l.partition(conf.Epoch, conf.Workers)
		if err != nil || p != nil {
			return p, nil, err
		}
		if c, ok := f.changed(); ok {
			return nil, &c, nil
		}
		if time.Since(logged) > 10*time.Second {
			cfg.Logger.Warn("wordcount: waiting for the last partitioning to hand over", "epoch", conf.Epoch, "waiting for", waiting)
			logged = time.Now()
		}
		if !f.wait(ctx, 100*time.Millisecond) {
			return nil, nil, nil
		}
	}
}

// scan reads the input from its start and emits the records of the offsets p gives this
// worker from resume on, until ctx is done or the configuration changes (returned). next is
// 1 + the last offset emitted (resume when none): every offset it owns below is out.
func scan(ctx context.Context, cfg Config, l *ledger, out *os.File, f *follower, p *partition, conf cluster.WorkerConfig, resume int64, prog *progress) (next int64, changed *cluster.WorkerConfig, err error) {
	src, closeSrc, err := openInput(cfg)
	if err != nil {
		return resume, nil, err
	}
	defer closeSrc()
	r := bufio.NewReader(src)
	next = resume
	var batch bytes.Buffer
	n := 0
	begin, emitted := time.Now(), 0
	flush := func() error {
		if n == 0 {
			return nil
		}
		if cfg.beforeFlush != nil {
			cfg.beforeFlush(n)
		}
		// One write of whole lines, under the lock, while this instance holds the epoch.
		if err := l.emit(out, conf.Epoch, conf.Worker, batch.Bytes()); err != nil {
			return err
		}
		batch.Reset()
		n = 0
		return nil
	}
	// stopping flushes and reports why the scan ends.
	stopping := func() (int64, *cluster.WorkerConfig, error) {
		if err := flush(); err != nil {
			return resume, nil, err
		}
		return next, nil, nil
	}
	follow := cfg.Input != ""
	var offset int64
	var partial []byte
	for {
		if ctx.Err() != nil {
			return stopping()
		}
		if c, ok := f.changed(); ok {
			if err := flush(); err != nil {
				return resume, nil, err
			}
			return next, &c, nil
		}
		chunk, rerr := r.ReadBytes('\n')
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return resume, nil, fmt.Errorf("wordcount: read: %w", rerr)
		}
		line := append(partial, chunk...)
		if rerr != nil && (follow || len(line) == 0) {
			partial = line
			if err := flush(); err != nil {
				return resume, nil, err
			}
			prog.at(offset, resume, conf.Worker, conf.Workers, true)
			if !f.wait(ctx, cfg.Poll) {
				return stopping()
			}
			continue
		}
		partial = nil
		if e, w := p.owner(offset); offset >= resume && e == conf.Epoch && w == conf.Worker {
			if cfg.Rate > 0 {
				begin = paced(begin, emitted, cfg.Rate)
				due := begin.Add(time.Duration(float64(emitted) / cfg.Rate * float64(time.Second)))
				for d := time.Until(due); d > 0; d = time.Until(due) {
					if err := flush(); err != nil {
						return resume, nil, err
					}
					if !f.wait(ctx, d) {
						return stopping()
					}
					if c, ok := f.changed(); ok {
						return next, &c, nil // this line is not emitted: the next owner takes it
					}
				}
			}
			rec := Record{Offset: offset, Epoch: conf.Epoch, Worker: conf.Worker, Workers: conf.Workers, Job: cfg.Job,
				Counts: Count(strings.TrimRight(string(line), "\r\n"))}
			if err := json.NewEncoder(&batch).Encode(rec); err != nil {
				return resume, nil, err
			}
			n++
			emitted++
			prog.done()
			next = offset + 1
			if n >= batchRecords {
				if err := flush(); err != nil {
					return resume, nil, err
				}
			}
		}
		offset++
		prog.at(offset, resume, conf.Worker, conf.Workers, false)
	}
}
