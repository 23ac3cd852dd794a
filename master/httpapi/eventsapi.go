package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
)

// eventKeepalive is how often a followed event stream carries a comment when nothing
// happens, so that the client and any proxy between see it alive.
const eventKeepalive = 15 * time.Second

// ParseEventFilter reads GET /v1/events's query: job, node, dc (names), kind (kinds or kind
// prefixes like node., separated by commas), since (a duration back from now, like 10m, or
// an RFC 3339 time) and after (an event id).
func ParseEventFilter(q map[string][]string, now time.Time) (api.EventFilter, error) {
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	f := api.EventFilter{Job: get("job"), Node: get("node"), DC: get("dc")}
	for name, v := range map[string]string{"job": f.Job, "node": f.Node, "dc": f.DC} {
		if v != "" {
			if err := cluster.CheckName(v); err != nil {
				return f, fmt.Errorf("%w: %s: %v", api.ErrBadInput, name, err)
			}
		}
	}
	if s := get("kind"); s != "" {
		kinds, err := api.ParseKinds(s)
		if err != nil {
			return f, err
		}
		f.Kinds = kinds
	}
	if s := get("since"); s != "" {
		if d, err := time.ParseDuration(s); err == nil && d >= 0 {
			f.Since = now.Add(-d)
		} else if t, err := time.Parse(time.RFC3339, s); err == nil {
			f.Since = t
		} else {
			return f, fmt.Errorf("%w: since must be a duration back from now (10m, 2h) or an RFC 3339 time, not %q", api.ErrBadInput, s)
		}
	}
	if s := get("after"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return f, fmt.Errorf("%w: after must be an event id, not %q", api.ErrBadInput, s)
		}
		f.After = n
	}
	return f, nil
}

// listEvents answers the events kept, oldest first, as a JSON array; with follow=true it
// streams them as server-sent events (id: the event's id, data: the event as JSON), the
// kept ones first, until the client goes away. A client that reconnects with
// Last-Event-ID continues after that event.
func (a *API) listEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f, err := ParseEventFilter(q, time.Now())
	if err != nil {
		failErr(w, err)
		return
	}
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		if n, err := strconv.ParseInt(id, 10, 64); err == nil && n > f.After {
			f.After = n
		}
	}
	if p := principalOf(r.Context()); !p.admin {
		f.Tenant = p.tenant
	}
	limit := 0
	if s := q.Get("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil || limit < 0 {
			fail(w, api.ErrBadInput, "limit must be a number of events, not %q", s)
			return
		}
	}
	follow := false
	if s := q.Get("follow"); s != "" {
		if follow, err = strconv.ParseBool(s); err != nil {
			fail(w, api.ErrBadInput, "follow must be true or false, not %q", s)
			return
		}
	}
	evs, wait := a.m.Events().Query(f, limit)
	if !follow {
		if evs == nil {
			evs = []api.Event{}
		}
		reply(w, http.StatusOK, evs)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	sw := api.NewStreamWriter(w)
	defer sw.Stop()
	if sw.Write([]byte(": stormdock events\n\n")) != nil {
		return
	}
	keep := time.NewTicker(eventKeepalive)
	defer keep.Stop()
	for {
		for _, e := range evs {
			b, _ := json.Marshal(e)
			if sw.Write(fmt.Appendf(nil, "id: %d\ndata: %s\n\n", e.ID, b)) != nil {
				return
			}
			f.After = e.ID
		}
		select {
		case <-r.Context().Done():
			return
		case <-a.m.Stopped():
			return
		case <-keep.C:
			if sw.Write([]byte(": keepalive\n\n")) != nil {
				return
			}
			evs = nil
			continue
		case <-wait:
		}
		evs, wait = a.m.Events().Query(f, 0)
	}
}
