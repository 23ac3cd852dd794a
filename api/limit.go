package api

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Failed token checks cost each remote address one token of a bucket that refills slowly:
// a client that keeps presenting wrong tokens is answered 429 without any check (no store
// read) until its bucket refills, so guessing tokens runs at the refill rate at best, and
// the log gets at most that many lines from it. The master's API and the output routers
// both count failures this way.
const (
	AuthFailBurst  = 10          // failures an address may have at once
	AuthFailRefill = time.Second // one more failure allowed per this much time
	authFailHosts  = 10000       // addresses tracked; full buckets are dropped beyond it
)

// FailLimiter counts failed token checks per remote address. Safe for concurrent use.
type FailLimiter struct {
	burst  float64
	refill time.Duration
	now    func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

// NewFailLimiter returns a limiter of AuthFailBurst failures, refilled one per
// AuthFailRefill.
func NewFailLimiter() *FailLimiter {
	return &FailLimiter{burst: AuthFailBurst, refill: AuthFailRefill, now: time.Now, buckets: map[string]*bucket{}}
}

// level refills b up to now and returns its tokens.
func (l *FailLimiter) level(b *bucket, now time.Time) float64 {
	b.tokens = min(l.burst, b.tokens+float64(now.Sub(b.at))/float64(l.refill))
	b.at = now
	return b.tokens
}

// Blocked reports whether host has used up its failures, and how long until it has one.
func (l *FailLimiter) Blocked(host string) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[host]
	if !ok {
		return false, 0
	}
	if t := l.level(b, l.now()); t < 1 {
		return true, time.Duration((1 - t) * float64(l.refill))
	}
	return false, 0
}

// Fail counts one failed check of host.
func (l *FailLimiter) Fail(host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b, ok := l.buckets[host]
	if !ok {
		if len(l.buckets) >= authFailHosts {
			for h, o := range l.buckets {
				if l.level(o, now) >= l.burst {
					delete(l.buckets, h)
				}
			}
			for h := range l.buckets {
				if len(l.buckets) < authFailHosts {
					break
				}
				delete(l.buckets, h) // an arbitrary one: the map stays bounded
			}
		}
		b = &bucket{tokens: l.burst, at: now}
		l.buckets[host] = b
	}
	l.level(b, now)
	b.tokens = max(b.tokens-1, 0)
}

// RemoteHost is the address a request came from, without its port: what failed token
// checks are counted by.
func RemoteHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
