package nomad_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
)

// recording is one file of testdata (see testdata/README.md).
type recording struct {
	Comment   string            `json:"comment"`
	Headers   map[string]string `json:"headers"`
	Exchanges []exchange        `json:"exchanges"`
}

type exchange struct {
	Phase   string `json:"phase"`
	Request struct {
		Method string `json:"method"`
		Path   string `json:"path"`
	} `json:"request"`
	Response struct {
		Status  int               `json:"status"`
		Headers map[string]string `json:"headers"`
		Body    json.RawMessage   `json:"body"`
	} `json:"response"`
	Then string `json:"then"`
}

// seen is a request the replay server answered.
type seen struct {
	Method, Path, Query string
	Body                []byte
	Phase               string // the phase it was answered in
}

// replay serves a recording.
type replay struct {
	t     testing.TB
	rec   recording
	subst *strings.Replacer
	// onPhase runs (in the handler, before the answer is sent) when a write moves the
	// server into a phase: the test plays Nomad's clients starting or stopping agents.
	onPhase map[string]func()

	mu     sync.Mutex
	phase  string
	served map[int]bool
	log    []seen
	events *eventLog // shared with the test's master, to check the order of drains and writes
}

// eventLog is what the Nomad replay and the test's master were asked, in order.
type eventLog struct {
	mu  sync.Mutex
	all []string
}

func (l *eventLog) add(e string) {
	l.mu.Lock()
	l.all = append(l.all, e)
	l.mu.Unlock()
}

func (l *eventLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.all...)
}

func newReplay(t testing.TB, file string, vars map[string]string, events *eventLog) (*replay, *httptest.Server) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	r := &replay{t: t, phase: "start", served: map[int]bool{}, onPhase: map[string]func(){}, events: events}
	if err := json.Unmarshal(b, &r.rec); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var pairs []string
	for k, v := range vars {
		esc, _ := json.Marshal(v)
		pairs = append(pairs, "{{"+k+"}}", string(esc[1:len(esc)-1]))
	}
	r.subst = strings.NewReplacer(pairs...)
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return r, srv
}

func (r *replay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.log = append(r.log, seen{Method: req.Method, Path: req.URL.Path, Query: req.URL.RawQuery, Body: body, Phase: r.phase})
	r.events.add("nomad " + req.Method + " " + req.URL.Path)
	pick := -1
	for i, e := range r.rec.Exchanges {
		if e.Phase != r.phase || e.Request.Method != req.Method || e.Request.Path != req.URL.Path {
			continue
		}
		pick = i
		if !r.served[i] {
			break // the first one not yet served; else the last one repeats
		}
	}
	if pick < 0 {
		phase := r.phase
		r.mu.Unlock()
		r.t.Errorf("replay: no recorded answer to %s %s in phase %q", req.Method, req.URL, phase)
		http.Error(w, "not recorded", http.StatusNotImplemented)
		return
	}
	e := r.rec.Exchanges[pick]
	r.served[pick] = true
	hook := func() {}
	if e.Then != "" {
		r.phase = e.Then
		if f := r.onPhase[e.Then]; f != nil {
			hook = f
		}
	}
	r.mu.Unlock()
	hook()

	for k, v := range r.rec.Headers {
		w.Header().Set(k, v)
	}
	for k, v := range e.Response.Headers {
		w.Header().Set(k, v)
	}
	var out []byte
	var text string
	if json.Unmarshal(e.Response.Body, &text) == nil {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		out = []byte(text)
	} else {
		out = []byte(r.subst.Replace(string(e.Response.Body)))
	}
	w.Header().Set("Content-Length", fmt.Sprint(len(out)))
	w.WriteHeader(e.Response.Status)
	_, _ = w.Write(out)
}

// requests returns the answered requests with method and path.
func (r *replay) requests(method, path string) []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []seen
	for _, s := range r.log {
		if s.Method == method && s.Path == path {
			out = append(out, s)
		}
	}
	return out
}
