package coord_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord"
)

// memStore opens a client of a fresh named in-memory store; clients opened with the same
// name share it, as processes share a ZooKeeper ensemble.
func memStore(t *testing.T, name string) coord.Store {
	t.Helper()
	s, err := coord.Open(context.Background(), "mem://"+name, coord.Options{SessionTimeout: embeddedTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestUpdate(t *testing.T) {
	errNoRecord := errors.New("no record")
	tests := []struct {
		name    string
		initial *string // nil: key missing
		key     string
		change  func(cur []byte, exists bool) ([]byte, error)
		wantErr error
		wantVer int64
		want    *string // value afterwards, nil: missing
	}{
		{
			name: "creates a missing key",
			key:  "/a/b/missing",
			change: func(cur []byte, exists bool) ([]byte, error) {
				if exists || cur != nil {
					return nil, fmt.Errorf("exists %v, cur %q", exists, cur)
				}
				return []byte("new"), nil
			},
			wantVer: 0, want: ptr("new"),
		},
		{
			name: "updates an existing key", initial: ptr("1"), key: "/k",
			change: func(cur []byte, exists bool) ([]byte, error) {
				if !exists {
					return nil, errNoRecord
				}
				return append(cur, '1'), nil
			},
			wantVer: 1, want: ptr("11"),
		},
		{
			name: "change refuses a missing key", key: "/k",
			change:  func([]byte, bool) ([]byte, error) { return nil, errNoRecord },
			wantErr: errNoRecord,
		},
		{
			name: "change's error leaves the key as it was", initial: ptr("1"), key: "/k",
			change:  func([]byte, bool) ([]byte, error) { return nil, errNoRecord },
			wantErr: errNoRecord, want: ptr("1"),
		},
		{
			name: "invalid key", key: "k",
			change:  func([]byte, bool) ([]byte, error) { return []byte("x"), nil },
			wantErr: coord.ErrInvalid,
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s := memStore(t, fmt.Sprintf("update-%d", i))
			if tt.initial != nil {
				if _, err := s.Create(ctx, tt.key, []byte(*tt.initial), coord.Persistent); err != nil {
					t.Fatal(err)
				}
			}
			v, err := coord.Update(ctx, s, tt.key, tt.change)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
			} else if err != nil || v != tt.wantVer {
				t.Fatalf("Update = %d, %v; want %d, nil", v, err, tt.wantVer)
			}
			if tt.wantErr == coord.ErrInvalid {
				return
			}
			e, err := s.Get(ctx, tt.key)
			switch {
			case tt.want == nil && !errors.Is(err, coord.ErrNotFound):
				t.Fatalf("key afterwards: %q, %v; want missing", e.Value, err)
			case tt.want != nil && (err != nil || string(e.Value) != *tt.want):
				t.Fatalf("key afterwards: %q, %v; want %q", e.Value, err, *tt.want)
			}
		})
	}
}

func ptr(s string) *string { return &s }

// TestUpdateStartsOver has another client change the key between Update's read and its
// write, in each way a key can change: Update must read again and apply its change to what
// the other wrote.
func TestUpdateStartsOver(t *testing.T) {
	tests := []struct {
		name      string
		initial   bool
		interfere func(ctx context.Context, s coord.Store) error
		want      string
	}{
		{"written meanwhile", true, func(ctx context.Context, s coord.Store) error {
			_, err := s.Put(ctx, "/k", []byte("other"), coord.AnyVersion)
			return err
		}, "other+"},
		{"deleted meanwhile", true, func(ctx context.Context, s coord.Store) error {
			return s.Delete(ctx, "/k", coord.AnyVersion)
		}, "+"},
		{"created meanwhile", false, func(ctx context.Context, s coord.Store) error {
			_, err := s.Create(ctx, "/k", []byte("other"), coord.Persistent)
			return err
		}, "other+"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			name := fmt.Sprintf("update-over-%d", i)
			s, other := memStore(t, name), memStore(t, name)
			if tt.initial {
				if _, err := s.Create(ctx, "/k", []byte("mine"), coord.Persistent); err != nil {
					t.Fatal(err)
				}
			}
			calls := 0
			_, err := coord.Update(ctx, s, "/k", func(cur []byte, exists bool) ([]byte, error) {
				calls++
				if calls == 1 {
					if err := tt.interfere(ctx, other); err != nil {
						return nil, err
					}
				}
				return append(cur, '+'), nil
			})
			if err != nil || calls != 2 {
				t.Fatalf("Update: %v after %d calls of change; want nil after 2", err, calls)
			}
			if e, err := s.Get(ctx, "/k"); err != nil || string(e.Value) != tt.want {
				t.Fatalf("value %q, %v; want %q", e.Value, err, tt.want)
			}
		})
	}
}

// TestUpdateContended: a key that changes under every attempt gives up with ErrContended
// after a bounded number of attempts, having written nothing.
func TestUpdateContended(t *testing.T) {
	ctx := context.Background()
	s, other := memStore(t, "update-contended"), memStore(t, "update-contended")
	if _, err := s.Create(ctx, "/k", []byte("0"), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	calls := 0
	start := time.Now()
	_, err := coord.Update(ctx, s, "/k", func(cur []byte, exists bool) ([]byte, error) {
		calls++
		if _, err := other.Put(ctx, "/k", []byte(strconv.Itoa(calls)), coord.AnyVersion); err != nil {
			return nil, err
		}
		return []byte("mine"), nil
	})
	if !errors.Is(err, coord.ErrContended) {
		t.Fatalf("err = %v, want ErrContended", err)
	}
	if calls < 2 || calls > 20 {
		t.Fatalf("%d attempts, want a few", calls)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("gave up after %s, want well under a second on an idle machine", d)
	}
	if e, _ := s.Get(ctx, "/k"); string(e.Value) != strconv.Itoa(calls) {
		t.Fatalf("value %q: Update wrote although it reported contention", e.Value)
	}
}

// TestUpdateConcurrentWriters has many clients increment one counter, which none of them
// creates first: every increment that Update reports done is in the final count, and each
// one got a version of its own.
func TestUpdateConcurrentWriters(t *testing.T) {
	const writers, each = 8, 25
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		versions  = map[int64]bool{}
		contended int
		calls     atomic.Int64
	)
	for w := range writers {
		s := memStore(t, "update-concurrent")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done := 0; done < each; {
				v, err := coord.Update(ctx, s, "/counter/value", func(cur []byte, exists bool) ([]byte, error) {
					calls.Add(1)
					// Widen the window between read and write, so that writers do overlap.
					time.Sleep(100 * time.Microsecond)
					n := 0
					if exists {
						var err error
						if n, err = strconv.Atoi(string(cur)); err != nil {
							return nil, err
						}
					}
					return []byte(strconv.Itoa(n + 1)), nil
				})
				mu.Lock()
				switch {
				case errors.Is(err, coord.ErrContended):
					contended++ // nothing written: try again
				case err != nil:
					mu.Unlock()
					t.Errorf("writer %d: %v", w, err)
					return
				default:
					if versions[v] {
						t.Errorf("writer %d: version %d reported twice", w, v)
					}
					versions[v] = true
					done++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	e, err := memStore(t, "update-concurrent").Get(ctx, "/counter/value")
	if err != nil {
		t.Fatal(err)
	}
	if got := string(e.Value); got != strconv.Itoa(writers*each) {
		t.Fatalf("counter = %s after %d increments: an update was lost", got, writers*each)
	}
	if e.Version != writers*each-1 || len(versions) != writers*each {
		t.Fatalf("final version %d, %d distinct versions reported; want %d and %d", e.Version, len(versions), writers*each-1, writers*each)
	}
	if calls.Load() == writers*each {
		t.Fatalf("no write conflicted: the test did not exercise concurrent writers")
	}
	t.Logf("%d reads for %d increments; %d updates gave up contended and were tried again", calls.Load(), writers*each, contended)
}

func TestRetry(t *testing.T) {
	errOther := errors.New("other")
	conflict := fmt.Errorf("write: %w", coord.ErrConflict)
	tests := []struct {
		name    string
		results []error // what successive attempts return; the last repeats
		want    error
		calls   int
	}{
		{"succeeds at once", []error{nil}, nil, 1},
		{"succeeds after conflicts", []error{conflict, conflict, nil}, nil, 3},
		{"other error ends it", []error{conflict, errOther}, errOther, 2},
		{"always conflicting", []error{conflict}, coord.ErrContended, 8}, // retryAttempts
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			err := coord.Retry(context.Background(), func() error {
				r := tt.results[min(calls, len(tt.results)-1)]
				calls++
				return r
			})
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if tt.want == coord.ErrContended && errors.Is(err, coord.ErrConflict) {
				t.Fatalf("err %v wraps ErrConflict: an outer retry loop would spin on it", err)
			}
			if calls != tt.calls {
				t.Fatalf("%d attempts, want %d", calls, tt.calls)
			}
		})
	}
}

// TestRetryHonoursContext: a done context ends the retries between attempts.
func TestRetryHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := coord.Retry(ctx, func() error {
		calls++
		cancel()
		return coord.ErrConflict
	})
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Fatalf("Retry = %v after %d attempts, want context.Canceled after 1", err, calls)
	}
	if err := coord.Retry(ctx, func() error { t.Fatal("attempt ran on a done context"); return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Retry on a done context = %v", err)
	}
}
