package api

import (
	"fmt"
	"net/url"
	"strconv"
)

// LogRequest selects a worker's output: GET /v1/jobs/{name}/logs on a master, which relays
// it from the worker's agent (GET /v1/logs there).
type LogRequest struct {
	// Worker is the worker's index; with Router, -1 is the router that leads.
	Worker int
	Link   string // for a mirrored job's link worker
	// Router reads a mirrored job's output router's log instead of a worker's: Worker is the
	// router's index (0, or 1 for the second; LeadingRouter for the one that leads now).
	Router bool
	// Follow keeps the answer open, printing what the worker writes as it writes it, also
	// after it restarts, until the client goes away.
	Follow bool
	// Tail starts that many lines before the end; negative: the whole log kept.
	Tail int
	// Previous is the run before the last restart (never followed).
	Previous bool
}

// DefaultLogTail is how many lines a log request without a tail shows.
const DefaultLogTail = 100

// Query is the request as URL query parameters (of both the master's and the agent's
// endpoint).
func (r LogRequest) Query() url.Values {
	q := url.Values{}
	q.Set("worker", strconv.Itoa(r.Worker))
	if r.Link != "" {
		q.Set("link", r.Link)
	}
	if r.Follow {
		q.Set("follow", "true")
	}
	q.Set("tail", strconv.Itoa(r.Tail))
	if r.Previous {
		q.Set("previous", "true")
	}
	if r.Router {
		q.Set("router", "true")
	}
	return q
}

// LeadingRouter is the Worker of a LogRequest for a job's router that leads.
const LeadingRouter = -1

// ParseLogRequest reads a LogRequest from query parameters; tail defaults to
// DefaultLogTail.
func ParseLogRequest(q url.Values) (LogRequest, error) {
	r := LogRequest{Link: q.Get("link"), Tail: DefaultLogTail}
	var err error
	if s := q.Get("router"); s != "" {
		if r.Router, err = strconv.ParseBool(s); err != nil {
			return r, fmt.Errorf("%w: router must be true or false, not %q", ErrBadInput, s)
		}
	}
	if r.Worker, err = strconv.Atoi(q.Get("worker")); err != nil || r.Worker < 0 && !(r.Router && r.Worker == LeadingRouter) {
		return r, fmt.Errorf("%w: worker must be a worker's index (0 or more), not %q", ErrBadInput, q.Get("worker"))
	}
	if s := q.Get("tail"); s != "" {
		if r.Tail, err = strconv.Atoi(s); err != nil {
			return r, fmt.Errorf("%w: tail must be a number of lines (negative: everything), not %q", ErrBadInput, s)
		}
	}
	for name, p := range map[string]*bool{"follow": &r.Follow, "previous": &r.Previous} {
		if s := q.Get(name); s != "" {
			if *p, err = strconv.ParseBool(s); err != nil {
				return r, fmt.Errorf("%w: %s must be true or false, not %q", ErrBadInput, name, s)
			}
		}
	}
	if r.Follow && r.Previous {
		return r, fmt.Errorf("%w: the previous run has ended: it cannot be followed (drop -f or --previous)", ErrBadInput)
	}
	if r.Router && r.Link != "" {
		return r, fmt.Errorf("%w: a job's routers serve every link: name no link for a router's log", ErrBadInput)
	}
	return r, nil
}
