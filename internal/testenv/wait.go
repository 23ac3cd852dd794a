package testenv

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// TimeoutScaleEnv names the variable that multiplies every test timeout (see Timeout).
const TimeoutScaleEnv = "STORMDOCK_TEST_TIMEOUT_SCALE"

// ciScale is the factor under CI=true when TimeoutScaleEnv is not set: CI machines are
// shared and slower than the quiet machine a timeout was chosen on.
const ciScale = 3

func scale() float64 {
	if v := os.Getenv(TimeoutScaleEnv); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 {
			panic(fmt.Sprintf("testenv: %s=%q: want a positive number", TimeoutScaleEnv, v))
		}
		return f
	}
	if CI() {
		return ciScale
	}
	return 1
}

// Timeout scales a test timeout for the machine the tests run on, as Nomad's
// testutil.TestMultiplier does: multiplied by STORMDOCK_TEST_TIMEOUT_SCALE when it is set,
// else by 3 under CI=true, else unchanged. Eventually and AssertUntil apply it themselves.
func Timeout(d time.Duration) time.Duration {
	return time.Duration(float64(d) * scale())
}

// Eventually polls every tenth of the time waited so far, between minPoll and maxPoll: a
// condition that holds soon is seen soon (and a logged time is off by a tenth at most), and a
// long wait does not load the machine, or the ZooKeeper it reads, with the test's own polls.
const (
	minPoll = 10 * time.Millisecond
	maxPoll = 100 * time.Millisecond
)

// Eventually polls cond until it holds and fails the test when it still does not after
// Timeout(timeout). what says what the test waits for, in the failure message.
func Eventually(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	EventuallyWith(t, what, timeout, func() (bool, string) { return cond(), "" })
}

// EventuallyWith is Eventually for a condition that says why it does not hold yet: the last
// reason is in the failure message.
func EventuallyWith(t testing.TB, what string, timeout time.Duration, cond func() (ok bool, why string)) {
	t.Helper()
	timeout = Timeout(timeout)
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if why != "" {
				t.Fatalf("timed out after %s waiting for %s; last: %s", timeout, what, why)
			}
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(min(max(time.Since(start)/10, minPoll), maxPoll))
	}
}

// AssertUntil checks that cond holds on every poll from now until Timeout(window) has passed,
// and fails the test, with what and cond's reason, on the first poll where it does not (Nomad's
// testutil.AssertUntil). It is for a property that must hold throughout a window ("the worker
// stays up"); to assert that something did not happen, first wait for evidence that the
// system acted (a counter advanced, the next heartbeat landed), then check.
func AssertUntil(t testing.TB, what string, window time.Duration, cond func() (ok bool, why string)) {
	t.Helper()
	window = Timeout(window)
	// About fifty checks per window, between minPoll and maxPoll apart: often enough to catch
	// a property that breaks for a moment, seldom enough for checks that cost something.
	poll := min(max(window/50, minPoll), maxPoll)
	start := time.Now()
	deadline := start.Add(window)
	for {
		if ok, why := cond(); !ok {
			t.Fatalf("%s stopped holding after %s of %s: %s", what, time.Since(start).Round(time.Millisecond), window, why)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		time.Sleep(min(poll, left))
	}
}
