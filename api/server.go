package api

import (
	"net/http"
	"time"
)

// Limits on what one connection may take of a stormdock HTTP server (the master's API, an
// agent's metrics, an output router). A client that sends its headers slowly is cut off
// after ReadHeaderTimeout, one that sends its body slowly after ReadTimeout; an answer that
// cannot be written within WriteTimeout is abandoned; an idle keep-alive connection is
// closed after IdleTimeout.
const (
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 30 * time.Second
	WriteTimeout      = 60 * time.Second
	IdleTimeout       = 2 * time.Minute
	MaxHeaderBytes    = 64 << 10
)

// NewServer is the one constructor of stormdock's HTTP servers: h served within the limits
// above. A handler that streams (server-sent events) must extend its own write deadline
// with http.ResponseController.
func NewServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}
