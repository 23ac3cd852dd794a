package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
)

// A store that does not answer makes NewMaster wait for it, its API answering /v1/health
// with 503 and what it waits for; when its context ends it fails with the store's error and
// releases what it had built (its listener): not panic on the nil it returns.
func TestNewMasterWaitsForTheStore(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there now
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		m   *Master
		err error
	}
	done := make(chan result, 1)
	go func() {
		m, err := NewMaster(ctx, MasterConfig{
			Store:        "zk://" + dead + "/x",
			StoreOptions: coord.Options{SessionTimeout: time.Second, ConnectTimeout: 300 * time.Millisecond},
			Listen:       listen,
			DataDir:      t.TempDir(),
		})
		done <- result{m, err}
	}()
	testenv.EventuallyWith(t, "the waiting master's /v1/health", 30*time.Second, func() (bool, string) {
		resp, err := http.Get("http://" + listen + "/v1/health")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		var h api.Health
		_ = json.NewDecoder(resp.Body).Decode(&h)
		return resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(h.Waiting, "store unavailable"),
			fmt.Sprintf("%d %+v", resp.StatusCode, h)
	})
	select {
	case r := <-done:
		t.Fatalf("NewMaster returned while the store was away: %v, %v", r.m, r.err)
	default:
	}
	cancel()
	r := <-done
	if r.err == nil || r.m != nil || !strings.Contains(r.err.Error(), "open store") || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("NewMaster = %v, %v; want nil and an open store error for the ended context", r.m, r.err)
	}
	ln, err = net.Listen("tcp", listen)
	if err != nil {
		t.Fatalf("the master's listener was not released: %v", err)
	}
	ln.Close()
}
