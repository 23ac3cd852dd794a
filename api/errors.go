package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/stormdock/stormdock/cluster"
)

// Errors callers branch on. The master and the routers wrap them (fmt.Errorf("%w: ...")); the
// clients give them back from the error body's code, so both sides of the wire agree.
var (
	ErrBadInput     = errors.New("bad input")
	ErrUnauthorized = errors.New("unauthorized")
	ErrForbidden    = errors.New("forbidden")
	ErrQuota        = errors.New("over quota")
	ErrNotFound     = errors.New("not found")
	// ErrMethodNotAllowed: the path exists, but not with this method.
	ErrMethodNotAllowed = errors.New("method not allowed")
	ErrExists           = errors.New("already exists")
	// ErrConflict: the request is right, but what it asks for cannot be done in the state
	// things are in (a failover to a link that is not alive).
	ErrConflict    = errors.New("conflict")
	ErrTooLarge    = errors.New("request too large")
	ErrRateLimited = errors.New("too many requests")
	// ErrBusy: concurrent changes kept conflicting; the same request may succeed later.
	ErrBusy = errors.New("busy")
	// ErrUnavailable: the master cannot reach the coordination store.
	ErrUnavailable = errors.New("store unavailable")
	// ErrNotReady: the server is starting, waiting to lead, or stopping (a router standing
	// by); another one, or the same one later, may take the request.
	ErrNotReady = errors.New("not ready")
	ErrInternal = errors.New("internal error")
)

// kind is one row of the one table that ties an error to its wire code, its HTTP status
// and the CLI's exit code (2: the request was wrong and will stay wrong; 1: it failed).
type kind struct {
	err    error
	code   string
	status int
	exit   int
}

var kinds = []kind{
	{ErrBadInput, "bad_input", http.StatusBadRequest, 2},
	{ErrUnauthorized, "unauthorized", http.StatusUnauthorized, 2},
	{ErrForbidden, "forbidden", http.StatusForbidden, 2},
	{ErrQuota, "over_quota", http.StatusForbidden, 2},
	{ErrNotFound, "not_found", http.StatusNotFound, 2},
	{ErrMethodNotAllowed, "method_not_allowed", http.StatusMethodNotAllowed, 2},
	{ErrExists, "exists", http.StatusConflict, 2},
	{ErrConflict, "conflict", http.StatusConflict, 2},
	{ErrTooLarge, "too_large", http.StatusRequestEntityTooLarge, 2},
	{ErrRateLimited, "rate_limited", http.StatusTooManyRequests, 1},
	{ErrBusy, "busy", http.StatusServiceUnavailable, 1},
	{ErrUnavailable, "unavailable", http.StatusServiceUnavailable, 1},
	{ErrNotReady, "not_ready", http.StatusServiceUnavailable, 1},
	{ErrInternal, "internal", http.StatusInternalServerError, 1},
}

func kindOf(err error) kind {
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k
		}
	}
	return kinds[len(kinds)-1]
}

// ErrorBody is every error answer: {"error": "one line", "code": "not_found"}. An invalid
// spec's answer also lists its problems one by one, with their fields and lines.
type ErrorBody struct {
	Error    string    `json:"error"`
	Code     string    `json:"code,omitempty"`
	Problems []Problem `json:"problems,omitempty"`
}

// Problem is one problem of an invalid spec: its field path (placement.spread[1]; empty
// when the problem is the whole document's), the line it stands on in what was sent (0 when
// it is not there: a missing field), and what is wrong.
type Problem struct {
	Field string `json:"field,omitempty"`
	Line  int    `json:"line,omitempty"`
	Msg   string `json:"msg"`
}

// ParseError is the error an answer of status with body (an ErrorBody) stands for. A body
// that is not an ErrorBody (a proxy's) leaves the message fallback.
func ParseError(status int, body []byte, fallback string) *Error {
	var eb ErrorBody
	if json.Unmarshal(body, &eb) != nil || eb.Error == "" {
		eb.Error = fallback
	}
	return &Error{Status: status, Code: eb.Code, Msg: eb.Error, Problems: eb.Problems}
}

// Error is an error answered by a master or a router.
type Error struct {
	Status   int
	Code     string
	Msg      string
	Problems []Problem
}

func (e *Error) Error() string { return e.Msg }

// Is matches the sentinel of the answer's code. An answer without a known code (a proxy's,
// or a plain-text 405 from the router) matches the sentinel its status alone names, when
// only one does.
func (e *Error) Is(target error) bool {
	for _, k := range kinds {
		if k.code == e.Code {
			return k.err == target
		}
	}
	var match error
	for _, k := range kinds {
		if k.status == e.Status {
			if match != nil {
				return false
			}
			match = k.err
		}
	}
	return match == target
}

// Code is the wire code an error is answered with.
func Code(err error) string { return kindOf(err).code }

// Status is the HTTP status an error is answered with.
func Status(err error) int { return kindOf(err).status }

// ExitCode is the CLI's exit code for an error of a request: 0 for nil.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var ae *Error
	if errors.As(err, &ae) {
		for _, k := range kinds {
			if errors.Is(ae, k.err) {
				return k.exit
			}
		}
		return 1
	}
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k.exit
		}
	}
	return 1 // not an API error: the master could not be reached, or the answer not read
}

// WriteError answers err: its status and code from the table, its message in one line
// without the sentinel's own prefix (the code says that).
func WriteError(w http.ResponseWriter, err error) {
	k := kindOf(err)
	msg := err.Error()
	msg = strings.TrimPrefix(msg, k.err.Error()+": ")
	var ve *cluster.ValidationError
	if errors.As(err, &ve) {
		ps := make([]Problem, len(ve.Problems))
		for i, p := range ve.Problems {
			ps[i] = Problem{Field: p.Path, Line: p.Line, Msg: p.Msg}
		}
		writeError(w, k, msg, ps...)
		return
	}
	writeError(w, k, msg)
}

// Errorf answers a sentinel with a message of its own.
func Errorf(w http.ResponseWriter, sentinel error, msg string) {
	writeError(w, kindOf(sentinel), msg)
}

func writeError(w http.ResponseWriter, k kind, msg string, problems ...Problem) {
	msg = strings.ReplaceAll(strings.TrimSpace(msg), "\n", "; ")
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(k.status)
	_ = json.NewEncoder(w).Encode(ErrorBody{Error: msg, Code: k.code, Problems: problems})
}

// WriteJSON answers v as indented JSON.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
