package e2e

import (
	"testing"
	"time"
)

// TestSinkWatchLongestStall checks the sink's longest gap while input kept flowing: the
// input's own pauses do not count, a sink that stops while lines wait does, and a record
// delivered again ends no gap.
func TestSinkWatchLongestStall(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	type rec struct {
		offset int64
		at     int // ms after t0
	}
	for _, tc := range []struct {
		name    string
		batches [][2]int // first offset, written at (ms)
		recs    []rec
		want    time.Duration
		offset  int64
	}{
		{
			name:    "input pauses, sink keeps up",
			batches: [][2]int{{0, 0}, {2, 1000}, {4, 2000}},
			recs:    []rec{{0, 10}, {1, 20}, {2, 1030}, {3, 1040}, {4, 2015}, {5, 2020}},
			want:    30 * time.Millisecond, offset: 2,
		},
		{
			name:    "sink stops while lines wait",
			batches: [][2]int{{0, 0}, {2, 1000}, {4, 2000}},
			recs:    []rec{{0, 10}, {1, 20}, {2, 2500}, {3, 2500}, {4, 2510}, {5, 2520}},
			want:    1500 * time.Millisecond, offset: 2,
		},
		{
			name:    "a line written while the sink waits",
			batches: [][2]int{{0, 0}, {2, 1000}},
			recs:    []rec{{0, 10}, {1, 600}, {2, 1700}},
			want:    700 * time.Millisecond, offset: 2,
		},
		{
			name:    "a record delivered again ends no gap",
			batches: [][2]int{{0, 0}},
			recs:    []rec{{0, 10}, {1, 20}, {1, 900}, {2, 1020}},
			want:    1000 * time.Millisecond, offset: 2,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var in inputLog
			for _, b := range tc.batches {
				in.wrote(int64(b[0]), ms(b[1]))
			}
			s := &sinkWatch{}
			for _, r := range tc.recs {
				s.addLocked(r.offset, "dc-a", 0, ms(r.at))
			}
			d, o, end := s.longestStall(&in)
			if d != tc.want || o != tc.offset {
				t.Errorf("longest stall %s ending with offset %d at %s; want %s ending with offset %d", d, o, end.Sub(t0), tc.want, tc.offset)
			}
		})
	}
}
