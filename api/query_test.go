package api

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// TestQueryOptionsOnTheWire: a read without a WaitIndex sends no index or wait; one with
// sends both (the wait capped at MaxQueryWait, added to a query the path already has); the
// answer's index comes back in QueryMeta, an error's too.
func TestQueryOptionsOnTheWire(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.URL.RequestURI())
		mu.Unlock()
		w.Header().Set(IndexHeader, "42")
		if r.URL.Path == "/v1/jobs/gone" {
			Errorf(w, ErrNotFound, "no job")
			return
		}
		if r.URL.Path == "/v1/jobs/web" {
			WriteJSON(w, http.StatusOK, JobStatus{})
			return
		}
		WriteJSON(w, http.StatusOK, []struct{}{})
	}))
	defer srv.Close()
	c, err := NewClient(srv.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		read func() (QueryMeta, error)
		uri  string
		err  error
	}{
		{func() (QueryMeta, error) { _, m, err := c.JobsWith(ctx, QueryOptions{}); return m, err }, "/v1/jobs", nil},
		{func() (QueryMeta, error) {
			_, m, err := c.JobSummaryWith(ctx, "web", QueryOptions{WaitIndex: 7, WaitTime: 20 * time.Minute})
			return m, err
		}, "/v1/jobs/web?workers=false&index=7&wait=10m0s", nil},
		{func() (QueryMeta, error) { _, m, err := c.NodesWith(ctx, QueryOptions{WaitIndex: 9}); return m, err }, "/v1/nodes?index=9", nil},
		{func() (QueryMeta, error) {
			_, m, err := c.JobWith(ctx, "gone", QueryOptions{WaitIndex: 3})
			return m, err
		}, "/v1/jobs/gone?index=3", ErrNotFound},
	} {
		mu.Lock()
		got = nil
		mu.Unlock()
		meta, err := tc.read()
		if tc.err == nil && err != nil || tc.err != nil && !errors.Is(err, tc.err) {
			t.Errorf("%s: err %v, want %v", tc.uri, err, tc.err)
		}
		mu.Lock()
		if len(got) != 1 || got[0] != tc.uri {
			t.Errorf("sent %q, want %q", got, tc.uri)
		}
		mu.Unlock()
		if meta.LastIndex != 42 {
			t.Errorf("%s: LastIndex %d, want 42", tc.uri, meta.LastIndex)
		}
	}
}
