package master

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
)

// BenchmarkNodeDecoder is the master's cost of one node record an agent rewrote: at ten
// thousand nodes the agents rewrite 2,000 a second, and decoding them was a third of the
// master's cpu in steady state. The record is a node of 10 running workers, as `stormdock
// bench cluster` writes it (1.8 KB).
//
//	go test -run '^$' -bench NodeDecoder -count 5 ./master/
func BenchmarkNodeDecoder(b *testing.B) {
	value := benchNodeRecord(b)
	m := &Master{log: slog.New(slog.DiscardHandler)}
	b.SetBytes(int64(len(value)))
	for b.Loop() {
		if _, d := m.nodeDecoder("node-00042", value); d == 0 {
			b.Fatal("unreadable")
		}
	}
}

func benchNodeRecord(tb testing.TB) []byte {
	rec := cluster.NodeRecord{Node: cluster.Node{ID: "node-00042", Host: "host-00042", DC: "dc-1", Rack: "r004", Slots: 16,
		Memory: 64 << 30, CPU: 32000, Labels: map[string]string{"isolation/process": "true", "ssd": "true"}}, Health: cluster.NodeHealth{State: cluster.HealthHealthy},
		Isolation: []string{"process"}, Agent: "a1b2c3d4", Started: time.Unix(1700000000, 0).UTC()}
	for i := range 10 {
		rec.Workers = append(rec.Workers, cluster.WorkerStatus{Key: cluster.WorkerKey{Job: fmt.Sprintf("job-%05d", i*37), Worker: i * 3},
			Generation: 1, State: cluster.WorkerRunning, PID: 40000 + i, Port: 31000 + i, Restarts: i % 2,
			Memory: cluster.Bytes(100<<20 + i), Since: time.Unix(1700000100, 0).UTC()})
	}
	b, err := json.Marshal(rec)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
