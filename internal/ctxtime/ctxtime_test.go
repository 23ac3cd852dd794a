package ctxtime

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSleepWaits(t *testing.T) {
	start := time.Now()
	if err := Sleep(context.Background(), 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 20*time.Millisecond {
		t.Fatalf("returned after %v, want at least 20ms", el)
	}
}

func TestSleepStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Sleep(ctx, time.Hour) }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Sleep: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Sleep went on after its context ended")
	}
}

func TestSleepEndedContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, d := range []time.Duration{0, -time.Second, time.Hour} {
		if err := Sleep(ctx, d); !errors.Is(err, context.Canceled) {
			t.Fatalf("Sleep(ended, %v): %v, want context.Canceled", d, err)
		}
	}
	if err := Sleep(context.Background(), 0); err != nil {
		t.Fatalf("Sleep(0): %v, want nil", err)
	}
}

// Outlive's context goes on after its parent ends, for d, and no longer.
func TestOutliveEndsAfterParent(t *testing.T) {
	type key struct{}
	parent, stop := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	c, cancel := Outlive(parent, 50*time.Millisecond)
	defer cancel()
	if c.Value(key{}) != "v" {
		t.Fatal("the parent's values are lost")
	}
	stop()
	ended := time.Now()
	if c.Err() != nil {
		t.Fatalf("ended with its parent: %v", c.Err())
	}
	select {
	case <-c.Done():
	case <-time.After(time.Minute):
		t.Fatal("never ended after its parent did")
	}
	if el := time.Since(ended); el < 50*time.Millisecond {
		t.Fatalf("ended %v after its parent, want at least 50ms", el)
	}
	if !errors.Is(c.Err(), context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", c.Err())
	}
}

// cancel ends Outlive's context at once, before or after its parent ends.
func TestOutliveCancel(t *testing.T) {
	for _, parentEnded := range []bool{false, true} {
		parent, stop := context.WithCancel(context.Background())
		c, cancel := Outlive(parent, time.Hour)
		if parentEnded {
			stop()
		}
		cancel()
		if c.Err() == nil {
			t.Fatalf("parent ended %v: still going after cancel", parentEnded)
		}
		stop()
	}
}
