package master

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
)

// FuzzNodeRecordDecode: the master decodes node records with a faster decoder than the
// standard library's (unmarshalNodeRecord: half the cost, BenchmarkNodeDecoder). On any
// bytes, what it takes encoding/json takes and reads alike: it is never looser. It may be
// stricter (a time written as "0000-01-01T0:00:00,0Z" it refuses as not RFC 3339, where
// encoding/json reads it): such a record is ignored as unreadable, as a broken one is. And
// whatever encoding/json writes, as agents write their records, it reads as encoding/json
// does.
func FuzzNodeRecordDecode(f *testing.F) {
	f.Add(benchNodeRecord(f))
	f.Add([]byte(`{"node":{"id":"n1","dc":"dc-1","rack":"r1","slots":4,"memory":"4Gi","cpu":2000,"labels":{"ssd":"true"}},"health":{"state":"healthy"},"workers":[{"key":{"job":"j","link":"a","worker":3},"state":"running","memory":"100Mi","since":"2026-01-02T03:04:05.123456789Z"}],"isolation":["process","docker"],"agent":"x","started":"2026-01-02T03:04:05Z"}`))
	f.Add([]byte(`{"node":{"id":"n1","ID":"n2"},"workers":null,"Workers":[{"KEY":{"Job":"j"}}]}`))
	f.Add([]byte(`{"node":{"id":"n1"},"workers":[{"key":{"job":"\u00e9\ud800x","worker":1e2}}]}`))
	f.Add([]byte(`{"node":{"id":"n1","memory":-1,"cpu":"2"},"health":{"throttled":1.5}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var want cluster.NodeRecord
		wantErr := json.Unmarshal(b, &want)
		var got cluster.NodeRecord
		if err := unmarshalNodeRecord(b, &got); err == nil && (wantErr != nil || !reflect.DeepEqual(got, want)) {
			t.Fatalf("%q: decoded %+v; encoding/json: %+v, %v", b, got, want, wantErr)
		}
		if wantErr != nil {
			return
		}
		// As an agent writes it.
		written, err := json.Marshal(want)
		if err != nil {
			return // a time beyond year 9999, say: no agent writes that
		}
		var again, fast cluster.NodeRecord
		if err := json.Unmarshal(written, &again); err != nil {
			t.Fatalf("%q: encoding/json refuses what it wrote: %v", written, err)
		}
		if err := unmarshalNodeRecord(written, &fast); err != nil || !reflect.DeepEqual(fast, again) {
			t.Fatalf("%q: decoded %+v, %v; encoding/json: %+v", written, fast, err, again)
		}
	})
}

// TestNodeRecordKeptSmall: a decoded record's labels are a map of their own size, not the
// decoder's room for 64 (7 KiB a node): what the mirror keeps of ten thousand nodes.
func TestNodeRecordKeptSmall(t *testing.T) {
	value := benchNodeRecord(t)
	m := &Master{log: slog.New(slog.DiscardHandler)}
	var recs []any
	before := testenv.LiveHeap()
	for range 1000 {
		rec, _ := m.nodeDecoder("node-00042", value)
		recs = append(recs, rec)
	}
	per := (testenv.LiveHeap() - before) / uint64(len(recs))
	runtime.KeepAlive(recs)
	// 10 workers of 192 bytes, the labels and the node: under 4 KiB. With the decoder's
	// maps as made, 10 KiB.
	if per > 4<<10 {
		t.Errorf("%d bytes kept per decoded record of %d bytes, want under 4 KiB", per, len(value))
	}
	t.Logf("%d bytes kept per decoded record of %d bytes", per, len(value))
}

// TestNodeMirrorKeepsRecordsDecodedOnly: the nodes' mirror keeps each record decoded, once,
// and not also the bytes it was decoded from (a second copy of every record, 25 MiB at ten
// thousand nodes). NodeRecords hands out the decoded records with their entries' owner and
// revision, and leaves out a record that does not decode.
func TestNodeMirrorKeepsRecordsDecodedOnly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	store, m := newUnstarted(t, Config{})
	done := make(chan error, 1)
	go func() { done <- m.nodes.run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	good, _ := cluster.NodeKey("node-00042")
	bad, _ := cluster.NodeKey("n-bad")
	if _, err := store.Create(ctx, good, benchNodeRecord(t), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Create(ctx, bad, []byte("{not json"), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the mirror holds both entries", 5*time.Second, func() bool { return len(m.NodeEntries()) == 2 })

	for id, e := range m.NodeEntries() {
		if e.Value != nil {
			t.Errorf("%s: the mirror kept the record's %d bytes besides its decoding", id, len(e.Value))
		}
	}
	recs := m.NodeRecords()
	if _, ok := recs["n-bad"]; ok || len(recs) != 1 {
		t.Fatalf("NodeRecords = %v, want node-00042 alone", slices.Collect(maps.Keys(recs)))
	}
	e, err := store.Get(ctx, good)
	if err != nil {
		t.Fatal(err)
	}
	got := recs["node-00042"]
	if got.Rev != e.ModRev || got.Owner != e.Owner || got.Record.Node.ID != "node-00042" || len(got.Record.Workers) != 10 {
		t.Errorf("NodeRecords[node-00042] = rev %d, owner %d, node %q, %d workers; want rev %d, owner %d, 10 workers",
			got.Rev, got.Owner, got.Record.Node.ID, len(got.Record.Workers), e.ModRev, e.Owner)
	}
}
