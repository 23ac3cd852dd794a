// Command metricsjunk is a test worker that serves what a worker gone wrong might on its
// STORMDOCK_METRICS_PORT (at STORMDOCK_ADDR), until SIGTERM:
//
//	metricsjunk garbage          a page that is not the exposition format
//	metricsjunk huge             an endless body
//	metricsjunk stop NAME VALUE D  the gauge NAME = VALUE for D, then nothing (the port closed)
package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	ln, err := net.Listen("tcp", net.JoinHostPort(os.Getenv("STORMDOCK_ADDR"), os.Getenv("STORMDOCK_METRICS_PORT")))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var h http.HandlerFunc
	switch os.Args[1] {
	case "garbage":
		h = func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "<html><body>{{ not metrics }}\n") }
	case "huge":
		h = func(w http.ResponseWriter, r *http.Request) {
			line := "x_" + strings.Repeat("y", 100) + " 1\n"
			for r.Context().Err() == nil {
				if _, err := fmt.Fprint(w, line); err != nil {
					return
				}
			}
		}
	case "stop":
		h = func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "# TYPE %s gauge\n%s %s\n", os.Args[2], os.Args[2], os.Args[3])
		}
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	if os.Args[1] == "stop" {
		// Close, not the listener alone: the agent's scraper keeps its connection alive,
		// and a connection kept would go on serving the gauge.
		d, _ := time.ParseDuration(os.Args[4])
		time.AfterFunc(d, func() { srv.Close() })
	}
	go srv.Serve(ln) //nolint:errcheck // ends with the server
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	<-term
}
