package testenv

import (
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
)

// LogLevelEnv names the variable that sets the level of every test logger (debug, info, warn
// or error) in place of the one its test chose: STORMDOCK_TEST_LOG=debug shows all that the
// parts of a failing test said.
const LogLevelEnv = "STORMDOCK_TEST_LOG"

// Logger is a logger of the parts a test runs whose records from level up go to t's log,
// shown for a failed test and with -v. Records that come once its cleanup ran are dropped:
// a part still stopping in the background must not log to a finished test (testing panics).
func Logger(t testing.TB, level slog.Level) *slog.Logger {
	if v := os.Getenv(LogLevelEnv); v != "" {
		if err := level.UnmarshalText([]byte(v)); err != nil {
			t.Fatalf("%s=%q: %v", LogLevelEnv, v, err)
		}
	}
	w := &testWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}
