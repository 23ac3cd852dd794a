package multidc

import (
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
