package multidc

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestSenderPassesOverAnUnreachableRouter: a router whose host is lost (requests hang until
// the sender's timeout) is not asked again while another router answers, even when that
// one only stands by for a while: each return to the lost one would cost a whole timeout.
func TestSenderPassesOverAnUnreachableRouter(t *testing.T) {
	release := make(chan struct{})
	var lostAsked atomic.Int64
	lost := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lostAsked.Add(1)
		select { // a partition: no answer until the client gives up
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer lost.Close()
	defer close(release)
	var standbyAsked atomic.Int64
	standby := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Stands by for its first five requests (the old leader's session has not expired
		// yet), then leads.
		if standbyAsked.Add(1) <= 5 {
			writeError(w, errNotReady)
			return
		}
		writeJSON(w, http.StatusOK, IngestResult{Accepted: 1, Instance: "standby"})
	}))
	defer standby.Close()

	s := NewSender(lost.URL+","+standby.URL, "dc-a", 0, 1)
	s.hc.Timeout = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Send(ctx, []byte(`{"offset":0,"link":"dc-a"}`+"\n")); err != nil {
		t.Fatal(err)
	}
	if n := lostAsked.Load(); n != 1 {
		t.Errorf("the unreachable router was asked %d times, want once (the standby answered meanwhile)", n)
	}
	if n := standbyAsked.Load(); n != 6 {
		t.Errorf("the standby was asked %d times, want 6", n)
	}
}
