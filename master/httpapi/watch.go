package httpapi

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/api"
)

// GET /v1/watch (see api.EventSnapshot) serves the cluster map to the console. Each stream
// looks for changes every api.WatchInterval; the map of a change is built once, however
// many watch, and encoded once per viewer; each stream then sends only the entries that
// differ from what it sent before.

const (
	// watchPing keeps idle streams (and proxies on the way) from timing out.
	watchPing = 15 * time.Second
	// watchWriteTimeout drops a stream whose reader stopped reading.
	watchWriteTimeout = 10 * time.Second
	// Building maps may take a fifth of a core on average (watchBuildShare), in bursts of
	// up to watchBuildBurst: a change after a quiet spell is built at once, and a cluster
	// whose records change all the time is drawn as often as the budget allows.
	watchBuildShare = 5
	watchBuildBurst = 500 * time.Millisecond
)

// watchHub holds the latest map of the cluster and its encodings per viewer.
type watchHub struct {
	a       *API
	metrics watchMetrics

	mu    sync.Mutex
	cache *mapCache
	base  *mapBase
	// budget is the build time left to spend, as of budgetAt (see watchBuildShare).
	budget   time.Duration
	budgetAt time.Time
	states   map[principal]*mapState // of base, by viewer
	prev     map[principal]*mapState // each viewer's last, whose node entries are reused
}

// mapState is the map of one base as one viewer sees it, each entry encoded.
type mapState struct {
	viewer   api.Viewer
	sections [len(sectionNames)]section
	// drawn is the node entry each encoded node was made from: an entry that did not
	// change between two bases is not encoded again.
	drawn map[string]*mapNode
}

type section struct {
	keys []string // sorted
	enc  map[string][]byte
}

// sectionNames are the JSON fields of each section: in a snapshot and a delta, and of the
// keys a delta removes.
var sectionNames = [...][2]string{{"dcs", "goneDcs"}, {"nodes", "goneNodes"}, {"jobs", "goneJobs"}, {"tenants", "goneTenants"}}

func newWatchHub(a *API) *watchHub {
	h := &watchHub{a: a, metrics: newWatchMetrics(a.cfg.Registry), cache: newMapCache(),
		states: map[principal]*mapState{}, prev: map[principal]*mapState{}}
	h.cache.impacts.mu = &h.mu
	return h
}

// state returns the current map for p, building it when the mirrors changed and the build
// budget allows.
func (h *watchHub) state(p principal) *mapState {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	h.budget = min(h.budget+now.Sub(h.budgetAt)/watchBuildShare, watchBuildBurst)
	h.budgetAt = now
	if h.base == nil || h.budget > 0 {
		if st := h.a.m.Stamp(); h.base == nil || st != h.base.stamp || h.cache.impacts.gen != h.base.impacts {
			h.base = h.cache.build(h.a.m, st)
			took := time.Since(now)
			h.budget -= took
			maps.Copy(h.prev, h.states)
			h.states = map[principal]*mapState{}
			h.metrics.build.Observe(took.Seconds())
		}
	}
	if s, ok := h.states[p]; ok {
		return s
	}
	s := encodeState(h.base, p, h.prev[p])
	h.states[p] = s
	return s
}

// encodeState encodes the base for p, reusing the encoding of every node entry that is
// the same as in prev.
func encodeState(b *mapBase, p principal, prev *mapState) *mapState {
	jobs, dcs, tenants := b.scoped(p)
	s := &mapState{viewer: api.Viewer{Admin: p.admin, Tenant: p.tenant}, drawn: make(map[string]*mapNode, len(b.nodes))}
	s.sections[0] = encodeSection(dcs, func(d api.MapDC) string { return d.Name })
	nodes := section{keys: make([]string, 0, len(b.nodes)), enc: make(map[string][]byte, len(b.nodes))}
	for _, n := range b.nodes {
		var enc []byte
		if prev != nil && prev.drawn[n.ID] == n {
			enc = prev.sections[1].enc[n.ID]
		} else if enc, _ = json.Marshal(scopeNode(n, p)); enc == nil {
			continue
		}
		nodes.keys = append(nodes.keys, n.ID)
		nodes.enc[n.ID] = enc
		s.drawn[n.ID] = n
	}
	s.sections[1] = nodes // b.nodes is sorted
	s.sections[2] = encodeSection(jobs, func(j api.MapJob) string { return j.Name })
	s.sections[3] = encodeSection(tenants, func(t api.TenantView) string { return t.Name })
	return s
}

func encodeSection[T any](items []T, key func(T) string) section {
	s := section{keys: make([]string, 0, len(items)), enc: make(map[string][]byte, len(items))}
	for _, it := range items {
		b, err := json.Marshal(it)
		if err != nil {
			continue // every field is a plain value: cannot happen
		}
		k := key(it)
		s.keys = append(s.keys, k)
		s.enc[k] = b
	}
	slices.Sort(s.keys)
	return s
}

// master describes this master for the map. The store's state is said without the
// running time of an outage, so that a stream does not change with every tick of one.
func (h *watchHub) master() api.MapMaster {
	m := h.a.m
	out := api.MapMaster{ID: m.ID(), Leader: m.Leader()}
	if down := m.StoreDownSince(); !down.IsZero() {
		out.Store = fmt.Sprintf("master %s cannot reach the coordination store since %s: the map is as of then; running workers keep running",
			m.ID(), down.UTC().Format(time.RFC3339))
	}
	return out
}

// countingWriter counts the bytes that go on the wire.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		enc, q, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.TrimSpace(enc) == "gzip" && strings.ReplaceAll(q, " ", "") != "q=0" {
			return true
		}
	}
	return false
}

// serve is GET /v1/watch.
func (h *watchHub) serve(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r.Context())
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{}) // a server-wide write timeout would cut every stream
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Accel-Buffering", "no")
	wire := &countingWriter{w: w}
	var out io.Writer = wire
	var gz *gzip.Writer
	if acceptsGzip(r) {
		hdr.Set("Content-Encoding", "gzip")
		hdr.Add("Vary", "Accept-Encoding")
		gz, _ = gzip.NewWriterLevel(wire, gzip.BestSpeed)
		defer gz.Close()
		out = gz
	}
	w.WriteHeader(http.StatusOK)
	h.metrics.streams.Inc()
	defer h.metrics.streams.Dec()

	var version int64
	send := func(event string, data []byte) error {
		_ = rc.SetWriteDeadline(time.Now().Add(watchWriteTimeout))
		before := wire.n
		var err error
		if event == "" {
			_, err = out.Write(data)
		} else {
			_, err = fmt.Fprintf(out, "event: %s\nid: %d\ndata: %s\n\n", event, version, data)
		}
		if err == nil && gz != nil {
			err = gz.Flush()
		}
		if err == nil {
			err = rc.Flush()
		}
		if event != "" {
			h.metrics.events.Inc()
		}
		h.metrics.bytes.Add(float64(wire.n - before))
		return err
	}
	// Reconnect after a second when the stream breaks.
	if send("", []byte("retry: 1000\n\n")) != nil {
		return
	}
	stop := h.a.stops.stopping(r)
	tick := time.NewTicker(api.WatchInterval)
	defer tick.Stop()
	ping := time.NewTicker(watchPing)
	defer ping.Stop()
	reauth := time.NewTicker(h.a.cfg.WatchReauth)
	defer reauth.Stop()
	var sent *mapState
	var sentMaster api.MapMaster
	for {
		st, master := h.state(p), h.master()
		if sent == nil {
			version++
			if send(api.EventSnapshot, snapshotJSON(version, master, st)) != nil {
				return
			}
			sent, sentMaster = st, master
		} else if st != sent || master != sentMaster {
			if d, changed := deltaJSON(version+1, sentMaster, master, sent, st); changed {
				version++
				if send(api.EventDelta, d) != nil {
					return
				}
			}
			sent, sentMaster = st, master
		}
		select {
		case <-r.Context().Done():
			return
		case <-stop:
			return
		case <-tick.C:
		case <-ping.C:
			if send("", []byte(": ping\n\n")) != nil {
				return
			}
		case <-reauth.C:
			now, err := h.a.authenticate(r, true)
			if errors.Is(err, api.ErrUnavailable) {
				continue // the map says so; the token is checked again once the store is back
			}
			if err != nil || now != p {
				msg := "the token of this stream is no longer valid: log in again"
				if err != nil {
					msg = err.Error()
				}
				body, _ := json.Marshal(api.ErrorBody{Error: msg, Code: "unauthorized"})
				version++
				_ = send(api.EventEnd, body)
				return
			}
		}
	}
}

// snapshotJSON writes the whole map.
func snapshotJSON(version int64, master api.MapMaster, st *mapState) []byte {
	var b bytes.Buffer
	mb, _ := json.Marshal(master)
	vb, _ := json.Marshal(st.viewer)
	b.WriteString(`{"version":`)
	b.WriteString(strconv.FormatInt(version, 10))
	b.WriteString(`,"master":`)
	b.Write(mb)
	b.WriteString(`,"viewer":`)
	b.Write(vb)
	for i, names := range sectionNames {
		sec := st.sections[i]
		b.WriteString(`,"` + names[0] + `":[`)
		for j, k := range sec.keys {
			if j > 0 {
				b.WriteByte(',')
			}
			b.Write(sec.enc[k])
		}
		b.WriteByte(']')
	}
	b.WriteByte('}')
	return b.Bytes()
}

// deltaJSON writes what changed from old to cur; changed is false when nothing did.
func deltaJSON(version int64, oldMaster, master api.MapMaster, old, cur *mapState) (_ []byte, changed bool) {
	var b bytes.Buffer
	b.WriteString(`{"version":`)
	b.WriteString(strconv.FormatInt(version, 10))
	if master != oldMaster {
		mb, _ := json.Marshal(master)
		b.WriteString(`,"master":`)
		b.Write(mb)
		changed = true
	}
	for i, names := range sectionNames {
		was, now := old.sections[i], cur.sections[i]
		n := 0
		for _, k := range now.keys {
			if prev, ok := was.enc[k]; ok && bytes.Equal(prev, now.enc[k]) {
				continue
			}
			if n == 0 {
				b.WriteString(`,"` + names[0] + `":[`)
			} else {
				b.WriteByte(',')
			}
			b.Write(now.enc[k])
			n++
		}
		if n > 0 {
			b.WriteByte(']')
		}
		var gone []string
		for _, k := range was.keys {
			if _, ok := now.enc[k]; !ok {
				gone = append(gone, k)
			}
		}
		if len(gone) > 0 {
			gb, _ := json.Marshal(gone)
			b.WriteString(`,"` + names[1] + `":`)
			b.Write(gb)
		}
		changed = changed || n > 0 || len(gone) > 0
	}
	b.WriteByte('}')
	return b.Bytes(), changed
}

// watchMetrics are the streams' series.
type watchMetrics struct {
	streams prometheus.Gauge
	events  prometheus.Counter
	bytes   prometheus.Counter
	build   prometheus.Histogram
}

func newWatchMetrics(reg prometheus.Registerer) watchMetrics {
	const ns, sub = "stormdock", "master"
	m := watchMetrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "watch_streams",
			Help: "Open GET /v1/watch streams (console viewers)."}),
		events: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "watch_events_total",
			Help: "Snapshots and deltas sent on watch streams."}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "watch_sent_bytes_total",
			Help: "Bytes sent on watch streams, as on the wire (after compression)."}),
		build: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "watch_build_duration_seconds",
			Help: "Time to build the cluster map from the mirrors, once per change however many watch.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
	}
	if reg != nil {
		m.streams = register(reg, m.streams)
		m.events = register(reg, m.events)
		m.bytes = register(reg, m.bytes)
		m.build = register(reg, m.build)
	}
	return m
}
