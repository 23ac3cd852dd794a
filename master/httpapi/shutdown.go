package httpapi

import (
	"net/http"
	"sync"
)

// shutdowns tells long answers (watch streams, blocking queries) that their server is
// shutting down: they never go idle by themselves, and http.Server.Shutdown waits for idle
// connections only.
type shutdowns struct {
	m sync.Map // *http.Server -> chan struct{}, closed when it shuts down
}

// stopping returns a channel closed when the server serving r shuts down (nil, never
// closed, for a request without one).
func (s *shutdowns) stopping(r *http.Request) <-chan struct{} {
	srv, ok := r.Context().Value(http.ServerContextKey).(*http.Server)
	if !ok {
		return nil
	}
	ch, loaded := s.m.LoadOrStore(srv, make(chan struct{}))
	if !loaded {
		srv.RegisterOnShutdown(func() { close(ch.(chan struct{})) })
	}
	return ch.(chan struct{})
}
