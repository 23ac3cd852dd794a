// Package eventlog is the cluster's bounded event log: the events every master records,
// kept in the store in slots, appended at most once per flush, and served by every master.
package eventlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/ctxtime"
)

// Where events are kept, so that every master, leader or standby, serves the same ones in
// the same order: in the store, under cluster.EventsKey. Its value is the head, the id the
// next event gets; its children are slots of slotEvents events each, named by slot number
// (event id / slotEvents). A master that records events (the leader what it sees and does,
// any master the API calls it serves) queues them and appends the queue at most once per
// Config.Flush, in one transaction: the head moved with compare-and-set, the last slot
// rewritten with the new events, new slots created and slots beyond the count bound deleted.
// So events cost one store write per flush, however many workers changed, and ZooKeeper's
// own ordering of the head's versions orders them. Every master watches the head and reads
// the slots it has not seen; it holds at most Config.Max events (one slot more), and
// serves none older than MaxAge; the leader deletes slots older than MaxAge from the store.

// slotEvents is how many events one slot holds. Small, because the last slot is rewritten
// whole by every append to it: a trickle of single events costs slotEvents/2 events' bytes
// per write on average, while a burst fills slots in one write each.
const slotEvents = 20

// Bounds of one event and of one append: the transaction stays far below ZooKeeper's 1 MiB
// request limit (jute.maxbuffer).
const (
	maxReasonBytes  = 1024
	maxFlushEvents  = 10 * slotEvents
	eventRetryDelay = 500 * time.Millisecond
)

// Metrics are the log's Prometheus series (stormdock_master_event*), and the master's count
// of its store writes, which the log's appends add to.
type Metrics struct {
	Recorded    *prometheus.CounterVec // recorded by this master, by kind
	Dropped     prometheus.Counter
	Kept        prometheus.Gauge
	Batches     prometheus.Counter
	StoreWrites prometheus.Counter
}

// NewMetrics makes the log's series; storeWrites is the master's counter of store writes.
// Register them with Collectors.
func NewMetrics(storeWrites prometheus.Counter) *Metrics {
	const ns, sub = "stormdock", "master"
	return &Metrics{
		Recorded: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "events_total",
			Help: "Cluster events this master recorded, by kind."}, []string{"kind"}),
		Dropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "events_dropped_total",
			Help: "Events this master dropped because more were queued than the store keeps."}),
		Kept: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "events_kept",
			Help: "Events this master holds and serves (at most --events-max, one slot more)."}),
		Batches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "event_batches_total",
			Help: "Appends of events to the store (one transaction each)."}),
		StoreWrites: storeWrites,
	}
}

// Collectors are the log's own series, to register (StoreWrites is the master's).
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Recorded, m.Dropped, m.Kept, m.Batches}
}

// Config bounds and paces a master's events.
type Config struct {
	// Max is how many events are kept; default DefaultMax. Every master should be
	// given the same: the one that writes deletes what is beyond its own bound.
	Max int
	// MaxAge is how long an event is kept; default DefaultMaxAge.
	MaxAge time.Duration
	// Flush is how often a master appends the events it recorded; default
	// DefaultFlush.
	Flush time.Duration
}

// Defaults of Config.
const (
	DefaultMax    = 10000
	DefaultMaxAge = time.Hour
	DefaultFlush  = 100 * time.Millisecond
)

func (c *Config) defaults() {
	if c.Max <= 0 {
		c.Max = DefaultMax
	}
	if c.MaxAge <= 0 {
		c.MaxAge = DefaultMaxAge
	}
	if c.Flush <= 0 {
		c.Flush = DefaultFlush
	}
}

// slotsKept is how many slots the bound needs: Max events, one partly filled slot more.
func (c Config) slotsKept() int64 { return int64((c.Max+slotEvents-1)/slotEvents) + 1 }

type eventHead struct {
	Next int64 `json:"next"`
}

type eventSlot struct {
	Events []api.Event `json:"events"`
}

func slotOf(id int64) int64 { return id / slotEvents }

func slotKey(n int64) string { return fmt.Sprintf("%s/%019d", cluster.EventsKey, n) }

// Log is one master's copy of the store's events and its queue of events to append.
type Log struct {
	store  coord.Store
	cfg    Config
	master string
	log    *slog.Logger
	m      *Metrics

	mu      sync.Mutex
	slots   map[int64][]api.Event
	next    int64 // the head as last read or written
	headVer int64 // its version; -1 until read
	changed chan struct{}

	qmu   sync.Mutex
	queue []api.Event
	// front counts the events ever taken off the queue's front, appended or dropped: the
	// number of queue[0] since the log began. A flush removes only the events it appended
	// that are still queued.
	front   int64
	dropped int
	kick    chan struct{}
}

// New makes the log of the master named master over store; it does nothing until Run.
func New(store coord.Store, cfg Config, master string, log *slog.Logger, m *Metrics) *Log {
	cfg.defaults()
	return &Log{store: store, cfg: cfg, master: master, log: log, m: m, slots: map[int64][]api.Event{}, headVer: -1,
		changed: make(chan struct{}), kick: make(chan struct{}, 1)}
}

// Emit queues an event for the next append. It never blocks: beyond the count bound the
// oldest queued events are dropped (and counted), since the store would not keep them.
func (l *Log) Emit(e api.Event) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Time = e.Time.UTC()
	e.Master = l.master
	if len(e.Reason) > maxReasonBytes {
		e.Reason = e.Reason[:maxReasonBytes-3] + "..."
	}
	l.m.Recorded.WithLabelValues(e.Kind).Inc()
	l.qmu.Lock()
	l.queue = append(l.queue, e)
	if over := len(l.queue) - l.cfg.Max; over > 0 {
		// Re-sliced, not shifted: a burst of events beyond the bound (a data center's
		// workers moving) costs each a copy of the queue otherwise.
		l.queue = l.queue[over:]
		l.front += int64(over)
		l.dropped += over
		l.m.Dropped.Add(float64(over))
	}
	l.qmu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Run follows the store's events and appends the queued ones until ctx is done; leader
// reports whether this master leads, with its term's fence (the leader deletes events older
// than MaxAge, fenced). Appends are not fenced: every master appends the events it
// records, each append a compare-and-set on the head, and an event of a deposed leader's
// last moments is still true.
func (l *Log) Run(ctx context.Context, leader func() (coord.Fence, bool)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.follow(ctx)
	}()
	l.flushLoop(ctx, leader)
}

// follow watches the head and reads what it has not seen.
func (l *Log) follow(ctx context.Context) {
	for ctx.Err() == nil {
		ch, err := l.store.Watch(ctx, cluster.EventsKey)
		if err != nil {
			l.log.Warn("watch events; retrying", "err", err)
			_ = ctxtime.Sleep(ctx, eventRetryDelay)
			continue
		}
		for ev := range ch {
			if !ev.Exists {
				continue
			}
			if err := l.catchUp(ctx, ev.Entry); err != nil && ctx.Err() == nil {
				l.log.Warn("read events; retrying at the next change", "err", err)
			}
		}
	}
}

// catchUp reads the slots between what this master holds and the head in e.
func (l *Log) catchUp(ctx context.Context, e coord.Entry) error {
	var h eventHead
	if len(e.Value) > 0 {
		if err := json.Unmarshal(e.Value, &h); err != nil {
			return fmt.Errorf("decode events head: %w", err)
		}
	}
	h.Next = max(h.Next, 1) // ids start at 1: After 0 takes every event
	l.mu.Lock()
	have, fresh := l.next, l.headVer < 0
	if !fresh && e.Version <= l.headVer {
		l.mu.Unlock()
		return nil // this master wrote it, or read it already
	}
	l.mu.Unlock()
	var want []int64
	if fresh || slotOf(h.Next-1)-slotOf(have) >= l.cfg.slotsKept() {
		names, err := l.store.Children(ctx, cluster.EventsKey)
		if err != nil {
			return fmt.Errorf("list events: %w", err)
		}
		for _, n := range names {
			if v, err := strconv.ParseInt(n, 10, 64); err == nil && v <= slotOf(h.Next-1) && v > slotOf(h.Next-1)-l.cfg.slotsKept() {
				want = append(want, v)
			}
		}
	} else if h.Next > have {
		for s := slotOf(have); s <= slotOf(h.Next-1); s++ {
			want = append(want, s)
		}
	}
	got := map[int64][]api.Event{}
	for _, s := range want {
		se, err := l.store.Get(ctx, slotKey(s))
		if errors.Is(err, coord.ErrNotFound) {
			got[s] = nil // trimmed meanwhile
			continue
		}
		if err != nil {
			return fmt.Errorf("read events slot %d: %w", s, err)
		}
		var sl eventSlot
		if err := json.Unmarshal(se.Value, &sl); err != nil {
			l.log.Warn("ignoring unreadable events slot", "key", path.Base(se.Key), "err", err)
			continue
		}
		got[s] = sl.Events
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if e.Version <= l.headVer && !fresh {
		return nil
	}
	for s, evs := range got {
		if evs == nil {
			delete(l.slots, s)
		} else {
			l.slots[s] = evs
		}
	}
	l.next, l.headVer = h.Next, e.Version
	l.trimLocked()
	l.broadcastLocked()
	return nil
}

// trimLocked forgets slots beyond the count bound.
func (l *Log) trimLocked() {
	low := slotOf(l.next-1) - l.cfg.slotsKept()
	for s := range l.slots {
		if s <= low {
			delete(l.slots, s)
		}
	}
	n := 0
	for _, evs := range l.slots {
		n += len(evs)
	}
	l.m.Kept.Set(float64(n))
}

func (l *Log) broadcastLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// flushLoop appends the queue at most once per Flush; on the leader it also deletes the
// slots older than MaxAge now and then.
func (l *Log) flushLoop(ctx context.Context, leader func() (coord.Fence, bool)) {
	var last time.Time
	ageTick := time.NewTicker(time.Minute)
	defer ageTick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.kick:
		case <-ageTick.C:
			if fence, ok := leader(); ok {
				if err := l.trimAge(ctx, coord.Fenced(l.store, fence)); err != nil && ctx.Err() == nil {
					l.log.Warn("trim old events", "err", err)
				}
			}
			continue
		}
		if wait := l.cfg.Flush - time.Since(last); wait > 0 && ctxtime.Sleep(ctx, wait) != nil {
			return
		}
		last = time.Now()
		more, err := l.flush(ctx)
		if err != nil && ctx.Err() == nil {
			l.log.Warn("record events; retrying", "err", err)
			_ = ctxtime.Sleep(ctx, eventRetryDelay)
		}
		if more || err != nil {
			select {
			case l.kick <- struct{}{}:
			default:
			}
		}
	}
}

// flush appends up to maxFlushEvents queued events; more reports that some are left.
func (l *Log) flush(ctx context.Context) (more bool, err error) {
	l.qmu.Lock()
	n := min(len(l.queue), maxFlushEvents)
	batch := slices.Clone(l.queue[:n])
	first := l.front
	dropped := l.dropped
	l.qmu.Unlock()
	if n == 0 && dropped == 0 {
		return false, nil
	}
	if dropped > 0 {
		batch = append([]api.Event{{Kind: api.EventEventsDropped, Object: "master/" + l.master, Master: l.master, Time: time.Now().UTC(),
			Reason: fmt.Sprintf("%d events were dropped: more were recorded than the store keeps (%d) before they could be written", dropped, l.cfg.Max)}}, batch...)
	}
	for attempt := 0; ; attempt++ {
		err = l.append(ctx, batch)
		if err == nil || !errors.Is(err, coord.ErrConflict) && !errors.Is(err, coord.ErrNotFound) && !errors.Is(err, coord.ErrExists) || attempt == 5 {
			break
		}
		// Another master appended meanwhile (or trimmed): read the head, then try again.
		if rerr := l.refresh(ctx); rerr != nil {
			return false, rerr
		}
	}
	if err != nil {
		return false, err
	}
	l.qmu.Lock()
	// Events dropped meanwhile left the front already: take off what is left of the batch.
	if done := first + int64(n) - l.front; done > 0 {
		l.queue = l.queue[done:]
		l.front += done
	}
	l.dropped -= dropped
	more = len(l.queue) > 0
	l.qmu.Unlock()
	return more, nil
}

// refresh reads the head and the slots after it.
func (l *Log) refresh(ctx context.Context) error {
	e, err := l.store.Get(ctx, cluster.EventsKey)
	if err != nil {
		return fmt.Errorf("read events head: %w", err)
	}
	return l.catchUp(ctx, e)
}

// append writes batch after the head as this master knows it, in one transaction.
func (l *Log) append(ctx context.Context, batch []api.Event) error {
	l.mu.Lock()
	if l.headVer < 0 {
		l.mu.Unlock()
		if err := l.refresh(ctx); err != nil {
			return err
		}
		l.mu.Lock()
	}
	next, ver := l.next, l.headVer
	if next%slotEvents != 0 && l.slots[slotOf(next)] == nil {
		next = (slotOf(next) + 1) * slotEvents // the last slot is gone (trimmed): start a new one
	}
	out := map[int64][]api.Event{}
	var creates []int64
	for i := range batch {
		batch[i].ID = next + int64(i)
		s := slotOf(batch[i].ID)
		if _, ok := out[s]; !ok {
			if batch[i].ID%slotEvents == 0 {
				creates = append(creates, s)
			} else {
				out[s] = slices.Clone(l.slots[s])
			}
		}
		out[s] = append(out[s], batch[i])
	}
	newNext := next + int64(len(batch))
	low := slotOf(newNext-1) - l.cfg.slotsKept()
	var deletes []int64
	for s := range l.slots {
		if s <= low {
			deletes = append(deletes, s)
		}
	}
	l.mu.Unlock()

	head, _ := json.Marshal(eventHead{Next: newNext})
	ops := []coord.Op{coord.PutOp(cluster.EventsKey, head, ver)}
	for _, s := range slices.Sorted(maps.Keys(out)) {
		val, err := json.Marshal(eventSlot{Events: out[s]})
		if err != nil {
			return fmt.Errorf("encode events: %w", err)
		}
		if slices.Contains(creates, s) {
			ops = append(ops, coord.CreateOp(slotKey(s), val, coord.Persistent))
		} else {
			ops = append(ops, coord.PutOp(slotKey(s), val, coord.AnyVersion))
		}
	}
	for _, s := range deletes {
		ops = append(ops, coord.DeleteOp(slotKey(s), coord.AnyVersion))
	}
	res, err := l.store.Txn(ctx, ops...)
	l.m.StoreWrites.Inc()
	if err != nil {
		var te *coord.TxnError
		if errors.As(err, &te) && te.Op.Kind == coord.OpDelete && errors.Is(err, coord.ErrNotFound) {
			// Another master trimmed it: forget it here too.
			l.mu.Lock()
			delete(l.slots, mustSlot(te.Op.Key))
			l.mu.Unlock()
		}
		return fmt.Errorf("append %d events: %w", len(batch), err)
	}
	l.m.Batches.Inc()
	l.mu.Lock()
	defer l.mu.Unlock()
	for s, evs := range out {
		l.slots[s] = evs
	}
	for _, s := range deletes {
		delete(l.slots, s)
	}
	l.next, l.headVer = newNext, res[0].Version
	l.trimLocked()
	l.broadcastLocked()
	return nil
}

// mustSlot is the slot number of a slot's key (0 for another key).
func mustSlot(key string) int64 {
	v, _ := strconv.ParseInt(path.Base(key), 10, 64)
	return v
}

// trimAge deletes the slots whose newest event is older than MaxAge; when the last slot
// goes, the head moves to the next slot, where the next append starts.
func (l *Log) trimAge(ctx context.Context, kv coord.KV) error {
	cut := time.Now().Add(-l.cfg.MaxAge)
	l.mu.Lock()
	if l.headVer < 0 {
		l.mu.Unlock()
		return nil
	}
	next, ver := l.next, l.headVer
	var old []int64
	for s, evs := range l.slots {
		if len(evs) > 0 && evs[len(evs)-1].Time.Before(cut) {
			old = append(old, s)
		}
	}
	l.mu.Unlock()
	if len(old) == 0 {
		return nil
	}
	if slices.Contains(old, slotOf(next-1)) || next%slotEvents != 0 && slices.Contains(old, slotOf(next)) {
		next = (slotOf(next-1) + 1) * slotEvents
	}
	head, _ := json.Marshal(eventHead{Next: next})
	ops := []coord.Op{coord.PutOp(cluster.EventsKey, head, ver)}
	for _, s := range old {
		ops = append(ops, coord.DeleteOp(slotKey(s), coord.AnyVersion))
	}
	res, err := kv.Txn(ctx, ops...)
	l.m.StoreWrites.Inc()
	if err != nil {
		if errors.Is(err, coord.ErrConflict) || errors.Is(err, coord.ErrNotFound) {
			return l.refresh(ctx) // someone appended or trimmed: next time
		}
		return fmt.Errorf("delete %d old event slots: %w", len(old), err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range old {
		delete(l.slots, s)
	}
	l.next, l.headVer = next, res[0].Version
	l.trimLocked()
	l.broadcastLocked()
	return nil
}

// Query returns the events f takes, oldest first, within the bounds: at most the newest
// limit when limit > 0. wait is closed when events arrive after these.
func (l *Log) Query(f api.EventFilter, limit int) (out []api.Event, wait <-chan struct{}) {
	cut := time.Now().Add(-l.cfg.MaxAge)
	l.mu.Lock()
	defer l.mu.Unlock()
	total := 0
	for _, evs := range l.slots {
		total += len(evs)
	}
	skip := max(total-l.cfg.Max, 0) // the oldest beyond the count bound
	for _, s := range slices.Sorted(maps.Keys(l.slots)) {
		for i := range l.slots[s] {
			e := &l.slots[s][i]
			if skip > 0 {
				skip--
				continue
			}
			if e.Time.Before(cut) || !f.Match(e) {
				continue
			}
			out = append(out, *e)
		}
	}
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, l.changed
}
