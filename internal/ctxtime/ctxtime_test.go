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
