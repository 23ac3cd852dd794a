package multidc

import "time"

// Status is what a router says about its job: GET /v1/status, and (as of its last write) the
// RouterRecord in the store.
type Status struct {
	Job    string `json:"job"`
	Router string `json:"router,omitempty"` // the router's API URL
	Active string `json:"active"`           // "" until a link is chosen
	// NextOffset is the first offset not yet delivered; Delivered is NextOffset-1.
	NextOffset int64 `json:"nextOffset"`
	Delivered  int64 `json:"delivered"`
	// Checkpoint is the delivered offset last saved in the store (after the sink's Sync).
	Checkpoint   int64     `json:"checkpoint"`
	Failovers    int64     `json:"failovers"`
	LastFailover *Failover `json:"lastFailover,omitempty"`
	// SpuriousFailovers counts the heartbeat failovers whose link was alive again at once
	// (its workers late, not gone): harmless, a sign that the heartbeat timeout is short
	// for the machines' load.
	SpuriousFailovers int64 `json:"spuriousFailovers,omitempty"`
	// Leading says how the router came to lead: "elected", or "evidence" (it took a fencing
	// sink over from a leader that was gone).
	Leading string `json:"leading,omitempty"`
	// Epoch is the fencing epoch the router holds in a fencing sink (PostgreSQL, JetStream).
	Epoch int64 `json:"epoch,omitempty"`
	// SinkError is why the sink cannot be opened or written now, since SinkErrorSince.
	SinkError      string       `json:"sinkError,omitempty"`
	SinkErrorSince *time.Time   `json:"sinkErrorSince,omitempty"`
	Links          []LinkStatus `json:"links"`
	Updated        time.Time    `json:"updated"`
}

// LinkStatus is one link as the router sees it.
type LinkStatus struct {
	Link   string `json:"link"`
	Active bool   `json:"active"`
	Alive  bool   `json:"alive"` // every worker of the link heartbeats in time
	// LastProduced is the highest offset up to which the link has sent every record (see
	// the package doc on buffers); -1 before its first.
	LastProduced int64 `json:"lastProduced"`
	// LastDelivered is the highest offset delivered from this link, -1 if none.
	LastDelivered int64 `json:"lastDelivered"`
	// Lag is how many delivered offsets the link has not produced yet: 0 for a link in
	// step with the sink or ahead of it.
	Lag           int64 `json:"lag"`
	Buffered      int   `json:"buffered"` // records held, not yet delivered
	BufferedBytes int64 `json:"bufferedBytes"`
	// HeartbeatAgeMs is the age of the oldest last heartbeat among the link's workers, the
	// one that decides whether the link is alive; -1 if a worker never sent one.
	HeartbeatAgeMs int64  `json:"heartbeatAgeMs"`
	Workers        int    `json:"workers"`
	WorkersAlive   int    `json:"workersAlive"`
	Received       uint64 `json:"received"`
	Duplicates     uint64 `json:"duplicates"`
	Rejected       uint64 `json:"rejected"`
}

// Failover describes a switch of the active link.
type Failover struct {
	From   string    `json:"from"`
	To     string    `json:"to"`
	Reason string    `json:"reason"` // "heartbeat", "manual" or "apart"
	At     time.Time `json:"at"`
	// NextOffset is where the new link took over.
	NextOffset int64 `json:"nextOffset"`
}

// Failover reasons.
const (
	ReasonHeartbeat = "heartbeat"
	ReasonManual    = "manual"
	// ReasonApart moves the active link out of the router's own data center (Config.DC).
	ReasonApart = "apart"
)

// statusLocked builds the status; r.mu must be held and the router recovered.
func (r *Router) statusLocked(now time.Time) Status {
	st := Status{
		Job:        r.cfg.Job,
		Router:     r.URL(),
		Active:     r.ord.activeName(),
		NextOffset: r.ord.next,
		Delivered:  r.ord.next - 1,
		Checkpoint: r.checkpoint,
		Failovers:  r.failovers,
		Updated:    now.UTC(),

		SpuriousFailovers: r.spurious,
		Leading:           r.how,
		Epoch:             r.epoch,
		SinkError:         r.sinkErr,
	}
	if r.sinkErr != "" {
		t := r.sinkErrSince.UTC()
		st.SinkErrorSince = &t
	}
	if r.lastFailover != nil {
		f := *r.lastFailover
		st.LastFailover = &f
	}
	for _, l := range r.ord.links {
		ls := LinkStatus{
			Link:          l.name,
			Active:        l == r.ord.active,
			Alive:         r.live.alive(l.name, now),
			LastProduced:  l.mark,
			LastDelivered: l.lastDelivered,
			Lag:           max(0, (r.ord.next-1)-l.mark),
			Buffered:      len(l.pending),
			BufferedBytes: l.bytes,
			Received:      l.received,
			Duplicates:    l.dropped,
			Rejected:      l.rejected,
		}
		ls.HeartbeatAgeMs = -1
		if t, ok := r.live.oldest(l.name, now); ok {
			ls.HeartbeatAgeMs = now.Sub(t).Milliseconds()
		}
		ls.WorkersAlive, ls.Workers = r.live.counts(l.name, now)
		st.Links = append(st.Links, ls)
	}
	return st
}
