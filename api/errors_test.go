package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// Every sentinel crosses the wire and comes back as itself and nothing else, with the
// status and exit code of the table.
func TestErrorRoundTrip(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.code, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				WriteError(w, fmt.Errorf("%w: something about %s", k.err, r.URL.Path))
			}))
			defer srv.Close()
			cl, err := NewClient(srv.URL, "t")
			if err != nil {
				t.Fatal(err)
			}
			_, err = cl.Jobs(context.Background())
			var ae *Error
			if !errors.As(err, &ae) || ae.Status != k.status || ae.Code != k.code {
				t.Fatalf("got %#v, want status %d code %s", err, k.status, k.code)
			}
			if err.Error() != "something about /v1/jobs" {
				t.Errorf("message %q keeps the sentinel's prefix or lost its text", err.Error())
			}
			for _, other := range kinds {
				if got := errors.Is(err, other.err); got != (other.err == k.err) {
					t.Errorf("errors.Is(%s answer, %v) = %v", k.code, other.err, got)
				}
			}
			if got := ExitCode(err); got != k.exit {
				t.Errorf("exit code %d, want %d", got, k.exit)
			}
		})
	}
}

// An answer without a code (a proxy's, a plain 405) matches a sentinel only when its status
// names exactly one.
func TestErrorWithoutCode(t *testing.T) {
	cases := []struct {
		status int
		want   error
	}{
		{http.StatusNotFound, ErrNotFound},
		{http.StatusUnauthorized, ErrUnauthorized},
		{http.StatusRequestEntityTooLarge, ErrTooLarge},
		{http.StatusForbidden, nil},          // forbidden or over quota: neither is claimed
		{http.StatusServiceUnavailable, nil}, // busy, store unavailable or not ready
		{http.StatusConflict, nil},           // exists or conflict
		{http.StatusMethodNotAllowed, ErrMethodNotAllowed},
		{http.StatusTeapot, nil},
	}
	for _, c := range cases {
		e := &Error{Status: c.status, Msg: "x"}
		for _, k := range kinds {
			if got := errors.Is(e, k.err); got != (k.err == c.want) {
				t.Errorf("status %d: errors.Is(%v) = %v", c.status, k.err, got)
			}
		}
	}
	if ExitCode(errors.New("dial tcp: connection refused")) != 1 {
		t.Error("a transport error must exit 1")
	}
	if ExitCode(nil) != 0 {
		t.Error("nil must exit 0")
	}
}
