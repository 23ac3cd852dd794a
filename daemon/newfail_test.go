package daemon

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord"
)

// A store that does not answer makes NewMaster fail with the store's error, and release what
// it had built (its listener): not panic on the nil it returns.
func TestNewMasterFailsCleanlyWithoutAStore(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there now
	listen := "127.0.0.1:0"
	m, err := NewMaster(context.Background(), MasterConfig{
		Store:        "zk://" + dead + "/x",
		StoreOptions: coord.Options{SessionTimeout: time.Second, ConnectTimeout: 300 * time.Millisecond},
		Listen:       listen,
		DataDir:      t.TempDir(),
	})
	if err == nil || m != nil || !strings.Contains(err.Error(), "open store") {
		t.Fatalf("NewMaster = %v, %v; want nil and an open store error", m, err)
	}
}
