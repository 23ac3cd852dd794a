package multidc

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

// A router keeps the active link out of its own data center while a link elsewhere is
// alive: at start (though its own is the first configured), back after its own was the
// only one alive, but not against an operator's choice; the sink holds every offset once.
func TestActiveLinkKeptApartFromTheRouter(t *testing.T) {
	_, store := embeddedStore(t)
	tr := startRouter(t, store, []string{"dc-a", "dc-b"}, func(c *Config) { c.DC = "dc-a" })
	waitReady(t, tr.URL())
	_, lines := writeFixture(t, 6000)
	epoch := time.Now()
	stops := startSenders(t, tr.URL(), []string{"dc-a"}, 2, lines, 1000, epoch)
	// dc-b's workers start a little later: dc-a, the router's own and the first
	// configured, would be chosen on any tie-break but the one under test.
	for k, v := range startSenders(t, tr.URL(), []string{"dc-b"}, 2, lines, 1000, epoch) {
		stops[k] = v
	}
	cl, _ := NewClient(tr.URL())
	cl.Token = testToken
	ctx := context.Background()
	status := func() (Status, error) { return cl.Status(ctx) }
	testenv.EventuallyWith(t, "dc-b active and delivering", 20*time.Second, func() (bool, string) {
		st, err := status()
		return err == nil && st.Active == "dc-b" && st.Delivered > 200, fmt.Sprintf("%+v %v", st, err)
	})
	if st, _ := status(); st.Failovers != 0 {
		t.Fatalf("dc-b chosen at start after %d failovers (%+v); want it chosen first", st.Failovers, st.LastFailover)
	}

	// dc-b's workers stop: the router's own link is the only one alive and takes over.
	stops["dc-b"]()
	testenv.EventuallyWith(t, "dc-a active once dc-b is gone", 20*time.Second, func() (bool, string) {
		st, err := status()
		return err == nil && st.Active == "dc-a", fmt.Sprintf("%+v %v", st, err)
	})
	// dc-b's workers are back (from the start of the input, as a restarted link does):
	// the active link moves out of the router's data center again, for ReasonApart.
	stops["dc-b"] = startSenders(t, tr.URL(), []string{"dc-b"}, 2, lines, 1000, epoch)["dc-b"]
	testenv.EventuallyWith(t, "dc-b active again, apart from the router", 20*time.Second, func() (bool, string) {
		st, err := status()
		return err == nil && st.Active == "dc-b" && st.LastFailover != nil && st.LastFailover.Reason == ReasonApart, fmt.Sprintf("%+v %v", st, err)
	})

	// An operator's choice of the router's own data center stays.
	if _, err := cl.Failover(ctx, "wordcount", "dc-a"); err != nil {
		t.Fatal(err)
	}
	testenv.AssertUntil(t, "dc-a kept active as the operator chose", 2*time.Second, func() (bool, string) {
		st, err := status()
		return err == nil && st.Active == "dc-a", fmt.Sprintf("%+v %v", st, err)
	})
	testenv.Eventually(t, "everything delivered", 30*time.Second, func() bool { st, _ := status(); return st.Delivered == int64(len(lines)-1) })
	perLink := checkSinkFile(t, tr.path, lines)
	if perLink["dc-a"] == 0 || perLink["dc-b"] == 0 {
		t.Fatalf("records per link %v: both links should have delivered", perLink)
	}
}

// A router's data center is a name like a link's: anything else is refused at New.
func TestRouterDCChecked(t *testing.T) {
	_, store := embeddedStore(t)
	for _, dc := range []string{"../etc", "dc a", "DC-A"} {
		_, err := New(Config{Job: "wordcount", Links: []string{"dc-a", "dc-b"}, DC: dc, Store: store,
			Sink: &timedSink{}, TokenHash: testTokenHash})
		if err == nil || !strings.Contains(err.Error(), "multidc: dc:") {
			t.Errorf("DC %q: %v; want a multidc: dc: error", dc, err)
		}
	}
}
