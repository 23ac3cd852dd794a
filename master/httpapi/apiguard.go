package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
)

// What every route goes through before its handler (see secure): the names in its path are
// checked, the caller authenticated for the role the route needs, and a call that changes
// something is logged once for audit when it is answered.

// pathParam finds the {name} wildcards of a route pattern.
var pathParam = regexp.MustCompile(`\{([a-z]+)\}`)

// objectKinds names what a route's first path segment holds, for audit lines.
var objectKinds = map[string]string{"jobs": "job", "tenants": "tenant", "nodes": "node", "dcs": "dc"}

// secure wraps the handler of one route (pattern as given to http.ServeMux).
func (a *API) secure(pattern string, need role, h http.HandlerFunc) http.HandlerFunc {
	method, path, _ := strings.Cut(pattern, " ")
	var params []string
	for _, p := range pathParam.FindAllStringSubmatch(path, -1) {
		params = append(params, p[1])
	}
	kind := ""
	if segs := strings.Split(strings.TrimPrefix(path, "/v1/"), "/"); len(segs) > 0 {
		kind = objectKinds[segs[0]]
	}
	checked := func(w http.ResponseWriter, r *http.Request) {
		// Every name in the path is checked before anything is read or written: the key
		// builders would refuse it too, but the caller deserves the reason at once.
		for _, p := range params {
			v := r.PathValue(p)
			check := cluster.CheckName
			if p == "secret" {
				check = cluster.CheckSecretName
			}
			if err := check(v); err != nil {
				fail(w, api.ErrBadInput, "%s in the path: %v", p, err)
				return
			}
			if kind != "" && p == params[0] {
				noteObject(r, kind+"/"+v) // what the path's first segment names
			}
		}
		a.guard(need, h)(w, r)
	}
	if method == http.MethodGet || method == http.MethodHead {
		return checked
	}
	action := pattern
	return func(w http.ResponseWriter, r *http.Request) {
		e := &auditEntry{principal: "-"}
		sw := &statusWriter{ResponseWriter: w, before: func(status int) {
			if status < 300 {
				a.m.ReadYourWrite(r.Context(), e.object)
			}
		}}
		checked(sw, r.WithContext(context.WithValue(r.Context(), auditKey{}, e)))
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		result := "ok"
		if status >= 400 {
			result = strings.ToLower(strings.ReplaceAll(http.StatusText(status), " ", "_"))
		} else if e.dryRun {
			result = "dry_run" // checked, nothing changed: not an event
		}
		a.log.Info("audit", "principal", e.principal, "action", action, "object", e.object,
			"result", result, "status", status, "remote", r.RemoteAddr)
		a.apiEvent(e, action, result, status)
	}
}

// apiEvent records a call that changed something as an event with its principal. Refused
// calls change nothing, and are not recorded (their audit line is in the master's log): a
// stranger's guesses, or a tenant's, would fill the events.
func (a *API) apiEvent(e *auditEntry, action, result string, status int) {
	if e.principal == "-" || status >= 300 || e.dryRun {
		return
	}
	ev := api.Event{Kind: api.EventAPICall, Object: e.object, Principal: e.principal, Tenant: e.tenant,
		Reason: fmt.Sprintf("%s: %s (%d)", action, result, status)}
	if t, ok := strings.CutPrefix(e.principal, "tenant/"); ok {
		ev.Tenant = t
	}
	if kind, name, ok := strings.Cut(e.object, "/"); ok {
		switch kind {
		case "job":
			ev.Job = name
		case "node":
			ev.Node = name
		case "dc":
			ev.DC = name
		}
	}
	a.m.Events().Emit(ev)
}

// auditEntry collects, while a request is served, who made it and what it is about.
type auditEntry struct {
	principal string
	object    string
	tenant    string // the tenant whose job the call is about, when it is one
	dryRun    bool   // the call only checked what it would do
}

type auditKey struct{}

// noteObject records what a request acts on, for its audit line (handlers call it for what
// their body names, like a submitted job).
func noteObject(r *http.Request, object string) {
	if e, ok := r.Context().Value(auditKey{}).(*auditEntry); ok {
		e.object = object
	}
}

// noteTenant records whose job a request acts on, for its event.
func noteTenant(r *http.Request, tenant string) {
	if e, ok := r.Context().Value(auditKey{}).(*auditEntry); ok {
		e.tenant = tenant
	}
}

// noteDryRun records that a request changes nothing (a dry run): it is no event.
func noteDryRun(r *http.Request) {
	if e, ok := r.Context().Value(auditKey{}).(*auditEntry); ok {
		e.dryRun = true
	}
}

// notePrincipal records who made the request, for its audit line.
func notePrincipal(r *http.Request, p principal) {
	if e, ok := r.Context().Value(auditKey{}).(*auditEntry); ok {
		e.principal = p.String()
	}
}

func (p principal) String() string {
	if p.admin {
		return "admin"
	}
	if p.scrape {
		return "scrape"
	}
	return "tenant/" + p.tenant
}

// statusWriter remembers the status a handler answered with.
type statusWriter struct {
	http.ResponseWriter
	status int
	// before runs once, with the status, before anything of the answer is written.
	before func(status int)
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
		if s.before != nil {
			s.before(code)
		}
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.WriteHeader(http.StatusOK)
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// notFound answers what no route serves: 405 with the methods the path takes, or 404.
func notFound(mux *http.ServeMux) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var allow []string
		for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			if method == r.Method {
				continue
			}
			probe := r.Clone(r.Context())
			probe.Method = method
			if _, pattern := mux.Handler(probe); pattern != "" && pattern != "/" {
				allow = append(allow, method)
			}
		}
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			fail(w, api.ErrMethodNotAllowed, "%s %s: this path takes %s", r.Method, clipPath(r.URL.Path), strings.Join(allow, " or "))
			return
		}
		fail(w, api.ErrNotFound, "no such API path %s %s", r.Method, clipPath(r.URL.Path))
	}
}

// clipPath quotes a request path for a one-line message, escaped and bounded.
func clipPath(p string) string {
	if len(p) > 200 {
		p = p[:200] + "..."
	}
	q := fmt.Sprintf("%q", p)
	return q[1 : len(q)-1]
}

// decodeStrict decodes one JSON value into v and refuses what encoding/json lets through:
// unknown fields, a repeated key (which would silently take the last value) and anything
// after the value. An empty body is an error unless optional.
func decodeStrict(data []byte, v any, optional bool) error {
	if len(bytes.TrimSpace(data)) == 0 {
		if optional {
			return nil
		}
		return errors.New("the body is empty: send a JSON object")
	}
	if err := checkDuplicateKeys(data); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("unexpected data after the JSON object")
	}
	return nil
}

// checkDuplicateKeys walks the JSON tokens and refuses an object that names a key twice.
func checkDuplicateKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	type frame struct {
		keys   map[string]bool
		object bool
		key    bool // the next string token is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				if top != nil && top.object {
					top.key = true // this value ends; a key comes next
				}
				stack = append(stack, &frame{keys: map[string]bool{}, object: t == '{', key: t == '{'})
			default:
				stack = stack[:len(stack)-1]
			}
			continue
		case string:
			if top != nil && top.object && top.key {
				if top.keys[t] {
					return fmt.Errorf("key %q is given twice in one object", t)
				}
				top.keys[t] = true
				top.key = false
				continue
			}
		}
		if top != nil && top.object {
			top.key = true
		}
	}
}
