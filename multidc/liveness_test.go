package multidc

import (
	"path/filepath"
	"testing"
	"time"
)

func TestLiveness(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	lv := newLiveness([]string{"dc-a", "dc-b"}, 600*time.Millisecond, 300*time.Millisecond)
	if lv.alive("dc-a", t0) {
		t.Fatal("a link that never beat is alive")
	}
	lv.beat("dc-a", 0, 2, at(0))
	if lv.alive("dc-a", at(10)) {
		t.Fatal("dc-a alive with worker 1 of 2 never heard from")
	}
	lv.beat("dc-a", 1, 2, at(100))
	if !lv.alive("dc-a", at(600)) || lv.alive("dc-a", at(601)) {
		t.Fatal("dc-a must be alive until worker 0's beat is 600ms old, and no longer")
	}
	if a, w := lv.counts("dc-a", at(650)); a != 1 || w != 2 {
		t.Fatalf("counts = %d/%d, want 1/2", a, w)
	}
	// An older beat arriving late does not move the clock back.
	lv.beat("dc-a", 0, 2, at(700))
	lv.beat("dc-a", 0, 2, at(50))
	if oldest, _ := lv.oldest("dc-a", at(700)); !oldest.Equal(at(100)) {
		t.Fatalf("oldest = %v, want worker 1's beat at 100ms", oldest.Sub(t0))
	}
	// Scale-in: workers=1 forgets worker 1.
	lv.beat("dc-a", 0, 1, at(1000))
	if !lv.alive("dc-a", at(1000)) {
		t.Fatal("dc-a not alive after scaling in to its one beating worker")
	}
	// Without a worker count, the workers heard from are required until forgotten.
	lv.beat("dc-b", 0, 0, at(0))
	lv.beat("dc-b", 3, 0, at(500))
	if !lv.alive("dc-b", at(600)) || lv.alive("dc-b", at(700)) {
		t.Fatal("dc-b: worker 0 silent for 700ms must make the link dead")
	}
	lv.beat("dc-b", 3, 0, at(forgetAfter*600+100))
	if !lv.alive("dc-b", at(forgetAfter*600+100)) {
		t.Fatal("dc-b: a worker silent for ten timeouts must be forgotten")
	}
}

func TestLivenessConnectionClosed(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	lv := newLiveness([]string{"dc-a"}, 600*time.Millisecond, 300*time.Millisecond)
	lv.connClosed("dc-a", 0, at(0)) // a worker never heard from: nothing to forget
	lv.beat("dc-a", 0, 2, at(0))
	lv.beat("dc-a", 1, 2, at(0))
	// Worker 0's connection closes; it beats again within grace: still alive (an idle
	// connection closed by its client).
	lv.connClosed("dc-a", 0, at(100))
	if !lv.alive("dc-a", at(350)) {
		t.Fatal("dead within grace")
	}
	lv.beat("dc-a", 0, 2, at(300))
	lv.beat("dc-a", 1, 2, at(300))
	if !lv.alive("dc-a", at(500)) {
		t.Fatal("a beat after the close must clear it")
	}
	// Worker 1's connection closes and it stays silent: dead after grace, long before the
	// heartbeat timeout.
	lv.connClosed("dc-a", 1, at(500))
	if !lv.alive("dc-a", at(800)) || lv.alive("dc-a", at(801)) {
		t.Fatal("worker 1 must be dead exactly grace after its connection closed")
	}
	if a, w := lv.counts("dc-a", at(801)); a != 1 || w != 2 {
		t.Fatalf("counts = %d/%d", a, w)
	}
	lv.beat("dc-a", 1, 2, at(900)) // restarted
	lv.beat("dc-a", 0, 2, at(900))
	if !lv.alive("dc-a", at(900)) {
		t.Fatal("a restarted worker's beat must revive the link")
	}
}

// A heartbeat failover whose link beats again within two timeouts of its last beat was
// spurious (its workers were late) and is counted; one whose link was silent longer (dead,
// started again) is not. The router's clock is the test's.
func TestSpuriousFailoversCounted(t *testing.T) {
	_, store := embeddedStore(t)
	fs, err := openTestFileSink(filepath.Join(testSinkBase(t), "sink.jsonl"), FsyncCheckpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	r, err := New(Config{Job: "wordcount", Links: []string{"dc-a", "dc-b"}, Store: store, Sink: fs, TokenHash: testTokenHash,
		HeartbeatTimeout: 400 * time.Millisecond, CloseGrace: -1})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	r.ord, r.readyAt = newOrderer(r.cfg.Links, 0, Limits{}), t0
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// silent says when each link does not beat: [from, to) in ms.
	run := func(from, to int, silent map[string][2]int) {
		for ms := from; ms < to; ms += 10 {
			for _, l := range r.cfg.Links {
				if s := silent[l]; ms%100 == 0 && !(ms >= s[0] && ms < s[1]) {
					r.live.beat(l, 0, 1, at(ms))
				}
			}
			r.checkHealthLocked(at(ms))
		}
	}
	run(0, 1000, nil)
	if r.ord.activeName() != "dc-a" {
		t.Fatalf("active %q, want dc-a", r.ord.activeName())
	}
	// dc-a late: silent 500 ms, within two timeouts of its last beat.
	run(1000, 2000, map[string][2]int{"dc-a": {1000, 1500}})
	if r.failovers != 1 || r.spurious != 1 || r.ord.activeName() != "dc-b" {
		t.Fatalf("after a late link: %d failovers, %d spurious, active %s; want 1, 1, dc-b", r.failovers, r.spurious, r.ord.activeName())
	}
	// dc-b gone for 1.1 s and back 0.7 s after the failover: not spurious (it was silent too long).
	run(2000, 5000, map[string][2]int{"dc-b": {2000, 3000}})
	if r.failovers != 2 || r.spurious != 1 || r.ord.activeName() != "dc-a" {
		t.Fatalf("after a lost link: %d failovers, %d spurious, active %s; want 2, 1, dc-a", r.failovers, r.spurious, r.ord.activeName())
	}
}
