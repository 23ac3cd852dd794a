package netlab

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

// ForTest builds a lab for the test and removes it when the test ends (after the test's later
// cleanups, which stop what runs in it). A machine that cannot build one skips the test, or
// fails it under CI=true.
func ForTest(t testing.TB) *Lab {
	t.Helper()
	if err := Available(); err != nil {
		testenv.Missing(t, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := New(ctx, Options{Logf: t.Logf})
	if errors.Is(err, ErrUnavailable) {
		testenv.Missing(t, "%v", err)
	}
	if err != nil {
		t.Fatalf("netlab: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("netlab: %v", err)
		}
	})
	return l
}

// AddHosts adds hosts of these names or fails the test.
func (l *Lab) AddHosts(t testing.TB, names ...string) []*Host {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := make([]*Host, len(names))
	for i, n := range names {
		h, err := l.AddHost(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = h
	}
	return out
}
