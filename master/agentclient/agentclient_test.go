package agentclient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// TestGetPinsAndSigns: a request reaches an agent over TLS only when its certificate is the
// one its node record pins, and carries a signature for that one request; a record without
// an endpoint or an address is refused before any dial; the key is made at the first use.
func TestGetPinsAndSigns(t *testing.T) {
	srv, err := coord.NewServer(coord.ServerOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	store, err := srv.Connect(coord.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c := New(store)
	key, err := c.Key(context.Background())
	if err != nil || len(key) != 32 {
		t.Fatalf("key %x: %v", key, err)
	}
	agent := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if err := api.VerifyAgentRequest(key, r.Method, r.URL.RequestURI(), tok, time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		io.WriteString(w, "hello "+r.URL.Query().Get("node"))
	}))
	defer agent.Close()
	sum := sha256.Sum256(agent.Certificate().Raw)
	host, port, _ := net.SplitHostPort(agent.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	rec := cluster.NodeRecord{Node: cluster.Node{ID: "n1", Addr: host}, Logs: &cluster.LogsEndpoint{Port: p, TLS: true, CertSHA256: hex.EncodeToString(sum[:])}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, rec, "/v1/metrics?node=n1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "hello n1" {
		t.Fatalf("pinned: %d %q", resp.StatusCode, b)
	}
	if resp.TLS == nil || resp.TLS.DidResume {
		t.Fatalf("first connection: %+v, want a full handshake", resp.TLS)
	}
	// Dialled again (the master keeps few idle connections): the session resumes.
	c.CloseIdleConnections()
	resp, err = c.Get(ctx, rec, "/v1/metrics?node=n1")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil || !resp.TLS.DidResume {
		t.Errorf("second connection: status %d, resumed %v; want the session resumed", resp.StatusCode, resp.TLS != nil && resp.TLS.DidResume)
	}
	// Another certificate than the record's: refused at the handshake, a resumption of a
	// session of the pinned one included.
	bad := rec
	bad.Logs = &cluster.LogsEndpoint{Port: p, TLS: true, CertSHA256: strings.Repeat("0", 64)}
	c.CloseIdleConnections()
	if _, err := c.Get(ctx, bad, "/v1/metrics?node=n1"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a certificate the record does not pin: err = %v", err)
	}
	for name, r := range map[string]cluster.NodeRecord{
		"no endpoint": {Node: cluster.Node{ID: "n2", Addr: host}},
		"no address":  {Node: cluster.Node{ID: "n3"}, Logs: rec.Logs},
	} {
		if _, err := c.Get(ctx, r, "/v1/metrics"); !errors.Is(err, ErrNoEndpoint) {
			t.Errorf("%s: err = %v, want ErrNoEndpoint", name, err)
		}
	}
}

// BenchmarkDialAgain is what a master pays for each agent it pulls over a new connection
// (beyond its maxIdle kept open): a pinned TLS handshake and one signed GET, with and without
// resuming the agent's last session. Both ends run in this process: cpu-ns/op is their sum.
func BenchmarkDialAgain(b *testing.B) {
	for _, resume := range []bool{false, true} {
		b.Run(fmt.Sprintf("resume=%v", resume), func(b *testing.B) {
			srv, err := coord.NewServer(coord.ServerOptions{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			store, err := srv.Connect(coord.Options{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			defer store.Close()
			c := New(store)
			if !resume {
				c.sessions = nil
			}
			agent := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
			defer agent.Close()
			sum := sha256.Sum256(agent.Certificate().Raw)
			host, port, _ := net.SplitHostPort(agent.Listener.Addr().String())
			p, _ := strconv.Atoi(port)
			rec := cluster.NodeRecord{Node: cluster.Node{ID: "n1", Addr: host}, Logs: &cluster.LogsEndpoint{Port: p, TLS: true, CertSHA256: hex.EncodeToString(sum[:])}}
			ctx := context.Background()
			get := func(first bool) {
				resp, err := c.Get(ctx, rec, "/v1/metrics?node=n1")
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if !first && resp.TLS.DidResume != resume {
					b.Fatalf("resumed %v, want %v", resp.TLS.DidResume, resume)
				}
				c.CloseIdleConnections()
			}
			get(true) // a full handshake: the session to resume
			var before, after syscall.Rusage
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
			b.ResetTimer()
			for b.Loop() {
				get(false)
			}
			b.StopTimer()
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
			cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
