package multidc

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/stormdock/stormdock/api"
)

// errNotReady is every request's answer but the status's while the router does not lead.
var errNotReady = fmt.Errorf("%w: the router is starting, waiting to lead, or stopping", api.ErrNotReady)

// retryAfter is what a 429 asks senders to wait: about the time the sink takes to free
// room in a buffer.
const retryAfter = 100 * time.Millisecond

// Handler serves the router's API (see the package doc for the protocol):
//
//	POST /v1/records, POST /   records, JSON lines
//	POST /v1/heartbeat         ?link=L&worker=I[&workers=N]
//	GET  /v1/status            Status
//	POST /v1/failover          ?to=L (optional) [&job=J]
//	GET  /healthz, /readyz
//	GET  /v1/lead              200 while this router leads, or claims the sink (see claimFor)
//
// The POST routes need a token (see Config.TokenHash and LinkTokenHashes); without one: 401
// and nothing is taken. Records and heartbeats for a link need that link's token (403
// otherwise), a failover the job's own. Bodies are bounded (Config.MaxBody: 413 above it).
func (r *Router) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/records", r.authLink(r.handleRecords))
	mux.HandleFunc("POST /{$}", r.authLink(r.handleRecords))
	mux.HandleFunc("POST /v1/heartbeat", r.authLink(r.handleHeartbeat))
	mux.HandleFunc("GET /v1/status", r.handleStatus)
	mux.HandleFunc("POST /v1/failover", r.authJob(r.handleFailover))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /v1/lead", func(w http.ResponseWriter, _ *http.Request) {
		if !r.leads(time.Now()) {
			writeError(w, errNotReady)
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"instance": r.instance})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		r.mu.Lock()
		ok := r.state == ready
		r.mu.Unlock()
		if !ok {
			writeError(w, errNotReady)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	if r.cfg.Metrics != nil {
		mux.Handle("GET /metrics", r.cfg.Metrics)
	}
	return mux
}

// IngestResult is the body of a records answer (200 and 429).
type IngestResult struct {
	Accepted     int    `json:"accepted"`
	Duplicates   int    `json:"duplicates"`
	Rejected     int    `json:"rejected,omitempty"`
	RetryAfterMs int64  `json:"retryAfterMs,omitempty"`
	Error        string `json:"error,omitempty"`
	// Code is the api error table's code of a 429 ("rate_limited"), as in an api.ErrorBody.
	Code string `json:"code,omitempty"`
	// Instance names this run of the router; NextOffset is the first undelivered offset.
	// A worker that sees Instance change must rewind its input to NextOffset (see the
	// package doc).
	Instance   string `json:"instance"`
	NextOffset int64  `json:"nextOffset"`
}

// HeartbeatResult is the body of a heartbeat answer.
type HeartbeatResult struct {
	Active     string `json:"active"`
	NextOffset int64  `json:"nextOffset"`
	Instance   string `json:"instance"`
}

type beatKey struct {
	link   string
	worker int
}

// impliedBeat is a heartbeat implied by a records batch; workers is 0 when not given.
type impliedBeat struct {
	beatKey
	workers int
}

func (r *Router) handleRecords(w http.ResponseWriter, req *http.Request, allowed string) {
	q := req.URL.Query()
	qlink := q.Get("link")
	if qlink != "" && !slices.Contains(r.cfg.Links, qlink) {
		writeError(w, r.unknownLink(qlink))
		return
	}
	if err := r.checkLink(allowed, cmp.Or(qlink, allowed)); err != nil {
		writeError(w, err)
		return
	}
	// A link's token sends for its link only: every record of the batch is taken as the
	// token's link's, and parseRecords refuses one that names another.
	qlink = cmp.Or(qlink, allowed)
	qworker := -1
	if s := q.Get("worker"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			writeError(w, fmt.Errorf("%w: worker=%q: want a non-negative integer", api.ErrBadInput, s))
			return
		}
		qworker = n
	}
	body, ok := r.readBody(w, req, r.cfg.MaxBody)
	if !ok {
		return
	}
	recs, beats, err := r.parseRecords(body, qlink, qworker, allowed)
	if err != nil {
		writeError(w, err)
		return
	}
	now := time.Now()
	var res IngestResult
	kickIt := false
	r.mu.Lock()
	// A standby hears the workers too (those that came to it, the leader not answering
	// them): when it takes over, it knows at once which links are alive.
	for _, b := range beats {
		r.live.beat(b.link, b.worker, b.workers, now)
		r.noteConnLocked(req, beatKey{b.link, b.worker})
	}
	if r.state != ready {
		r.mu.Unlock()
		writeError(w, errNotReady)
		return
	}
	active := r.ord.activeName()
	for i := range recs {
		recs[i].received = now
		switch r.ord.add(recs[i]) {
		case added:
			res.Accepted++
			kickIt = kickIt || recs[i].Link == active
		case dupDelivered, dupHeld:
			res.Duplicates++
		case rejected:
			res.Rejected++
		}
	}
	res.Instance, res.NextOffset = r.instance, r.ord.next
	r.mu.Unlock()
	if kickIt {
		r.wake()
	}
	if res.Rejected > 0 {
		res.RetryAfterMs = retryAfter.Milliseconds()
		res.Error = "buffer full: retry the batch after retryAfterMs (re-sending accepted records is harmless)"
		res.Code = api.Code(api.ErrRateLimited)
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusTooManyRequests, res)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// parseRecords checks a whole batch before any of it is taken, so that a bad line leaves
// no trace. It returns the records and the workers the batch names (implied heartbeats).
// allowed is the link the sender's token sends for ("": any).
func (r *Router) parseRecords(body []byte, qlink string, qworker int, allowed string) ([]Record, []impliedBeat, error) {
	var recs []Record
	var beats []impliedBeat
	seenBeat := map[beatKey]bool{}
	addBeat := func(k beatKey, workers int) {
		if !seenBeat[k] {
			seenBeat[k] = true
			beats = append(beats, impliedBeat{k, workers})
		}
	}
	var v struct {
		Offset  json.RawMessage `json:"offset"`
		Link    *string         `json:"link"`
		Worker  json.RawMessage `json:"worker"`
		Workers json.RawMessage `json:"workers"`
	}
	for n := 1; len(body) > 0; n++ {
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			body = nil
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		if line[0] != '{' {
			return nil, nil, fmt.Errorf("%w: line %d: malformed record: want a JSON object per line", api.ErrBadInput, n)
		}
		v.Offset, v.Link, v.Worker, v.Workers = nil, nil, nil, nil
		if err := json.Unmarshal(line, &v); err != nil {
			return nil, nil, fmt.Errorf("%w: line %d: malformed record: %v", api.ErrBadInput, n, err)
		}
		if len(v.Offset) == 0 || string(v.Offset) == "null" {
			return nil, nil, fmt.Errorf("%w: line %d: missing \"offset\"", api.ErrBadInput, n)
		}
		off, err := strconv.ParseInt(string(v.Offset), 10, 64)
		if err != nil || off < 0 {
			return nil, nil, fmt.Errorf("%w: line %d: \"offset\" is %s: want a non-negative integer", api.ErrBadInput, n, v.Offset)
		}
		link := qlink
		switch {
		case v.Link != nil && allowed != "" && *v.Link != allowed:
			return nil, nil, fmt.Errorf("%w: line %d: link %s's token cannot send for link %q: each link's workers send with their own link's token",
				api.ErrForbidden, n, allowed, *v.Link)
		case v.Link != nil && qlink != "" && *v.Link != qlink:
			return nil, nil, fmt.Errorf("%w: line %d: \"link\" %q but the request is for link %q", api.ErrBadInput, n, *v.Link, qlink)
		case v.Link != nil:
			link = *v.Link
		}
		if link == "" {
			return nil, nil, fmt.Errorf("%w: line %d: missing \"link\" (in the record or as ?link=)", api.ErrBadInput, n)
		}
		if !slices.Contains(r.cfg.Links, link) {
			return nil, nil, fmt.Errorf("%w: line %d: %s", api.ErrBadInput, n, r.unknownLinkMsg(link))
		}
		// "worker" and "workers" are hints, not part of the protocol: a record whose schema
		// uses them otherwise is still taken, it just implies no heartbeat.
		worker := qworker
		if w, err := strconv.Atoi(string(v.Worker)); err == nil && w >= 0 {
			worker = w
		}
		if worker >= 0 {
			workers, err := strconv.Atoi(string(v.Workers))
			if err != nil || workers <= worker {
				workers = 0
			}
			addBeat(beatKey{link, worker}, workers)
		}
		recs = append(recs, Record{Offset: off, Link: link, Data: bytes.Clone(line)})
	}
	return recs, beats, nil
}

func (r *Router) unknownLink(link string) error {
	return fmt.Errorf("%w: %s", api.ErrBadInput, r.unknownLinkMsg(link))
}

func (r *Router) unknownLinkMsg(link string) string {
	return fmt.Sprintf("unknown link %q (the router of job %s has %v)", link, r.cfg.Job, r.cfg.Links)
}

// readBody reads a request's body, at most limit bytes: a larger one is answered 413 (and
// the connection closed) after reading no more than limit+1 bytes of it, so that a sender
// cannot make the router hold more.
func (r *Router) readBody(w http.ResponseWriter, req *http.Request, limit int64) ([]byte, bool) {
	if req.ContentLength > limit {
		api.Errorf(w, api.ErrTooLarge, fmt.Sprintf("body of %d bytes is over the router's limit of %d: send smaller batches", req.ContentLength, limit))
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			api.Errorf(w, api.ErrTooLarge, fmt.Sprintf("body over the router's limit of %d bytes: send smaller batches", limit))
			return nil, false
		}
		writeError(w, fmt.Errorf("%w: read body: %v", api.ErrBadInput, err))
		return nil, false
	}
	return body, true
}

// maxSmallBody bounds the bodies of heartbeats and failovers, which carry nothing.
const maxSmallBody = 64 << 10

func (r *Router) handleHeartbeat(w http.ResponseWriter, req *http.Request, allowed string) {
	q := req.URL.Query()
	link := q.Get("link")
	if !slices.Contains(r.cfg.Links, link) {
		if link == "" {
			writeError(w, fmt.Errorf("%w: heartbeat needs ?link=", api.ErrBadInput))
			return
		}
		writeError(w, r.unknownLink(link))
		return
	}
	worker, err := strconv.Atoi(q.Get("worker"))
	if err != nil || worker < 0 {
		writeError(w, fmt.Errorf("%w: heartbeat needs ?worker= a non-negative integer, got %q", api.ErrBadInput, q.Get("worker")))
		return
	}
	workers := 0
	if s := q.Get("workers"); s != "" {
		workers, err = strconv.Atoi(s)
		if err != nil || workers < 1 || worker >= workers {
			writeError(w, fmt.Errorf("%w: workers=%q: want an integer above worker=%d", api.ErrBadInput, s, worker))
			return
		}
	}
	if err := r.checkLink(allowed, link); err != nil {
		writeError(w, err)
		return
	}
	if _, ok := r.readBody(w, req, maxSmallBody); !ok {
		return
	}
	r.mu.Lock()
	r.live.beat(link, worker, workers, time.Now()) // a standby's too, see handleRecords
	r.noteConnLocked(req, beatKey{link, worker})
	if r.state != ready {
		r.mu.Unlock()
		writeError(w, errNotReady)
		return
	}
	res := HeartbeatResult{Active: r.ord.activeName(), NextOffset: r.ord.next, Instance: r.instance}
	r.mu.Unlock()
	writeJSON(w, http.StatusOK, res)
}

func (r *Router) handleStatus(w http.ResponseWriter, _ *http.Request) {
	st, err := r.Status()
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (r *Router) handleFailover(w http.ResponseWriter, req *http.Request) {
	if _, ok := r.readBody(w, req, maxSmallBody); !ok {
		return
	}
	q := req.URL.Query()
	if job := q.Get("job"); job != "" && job != r.cfg.Job {
		api.Errorf(w, api.ErrNotFound, fmt.Sprintf("this router serves job %q, not %q", r.cfg.Job, job))
		return
	}
	st, err := r.Failover(q.Get("to"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// writeError answers err through the api error table; a router that is not ready says when
// to ask again.
func writeError(w http.ResponseWriter, err error) {
	if errors.Is(err, api.ErrNotReady) {
		w.Header().Set("Retry-After", "1")
	}
	api.WriteError(w, err)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
