package testenv

import (
	"log/slog"
	"strings"
	"testing"
)

// logTB records what a logger under test writes, and runs its cleanups when told.
type logTB struct {
	testing.TB
	lines    []string
	cleanups []func()
}

func (l *logTB) Log(args ...any) {
	for _, a := range args {
		l.lines = append(l.lines, a.(string))
	}
}

func (l *logTB) Cleanup(f func()) { l.cleanups = append(l.cleanups, f) }

func (l *logTB) cleanup() {
	for i := len(l.cleanups) - 1; i >= 0; i-- {
		l.cleanups[i]()
	}
}

func TestLogger(t *testing.T) {
	t.Setenv(LogLevelEnv, "")
	tb := &logTB{TB: t}
	log := Logger(tb, slog.LevelWarn)
	log.Info("quiet")
	log.Warn("said", "k", "v")
	tb.cleanup()
	log.Error("after the end")
	if len(tb.lines) != 1 || !strings.Contains(tb.lines[0], "msg=said k=v") || strings.HasSuffix(tb.lines[0], "\n") {
		t.Fatalf("logged %q, want the one warning, in one line", tb.lines)
	}
}

func TestLoggerLevelFromEnv(t *testing.T) {
	t.Setenv(LogLevelEnv, "debug")
	tb := &logTB{TB: t}
	Logger(tb, slog.LevelError).Debug("detail")
	if len(tb.lines) != 1 || !strings.Contains(tb.lines[0], "msg=detail") {
		t.Fatalf("logged %q, want the debug record %s=debug asks for", tb.lines, LogLevelEnv)
	}
}
