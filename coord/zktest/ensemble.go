package zktest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// Ensemble is a ZooKeeper ensemble of real servers on loopback, run by a test.
type Ensemble struct {
	t       testing.TB
	servers []*Server
	opts    Options
}

// StartEnsemble runs an ensemble of n servers (3 for a quorum that survives one loss) for the
// test and returns once every server serves, so that a test starts from a whole ensemble with
// a leader. Every server is killed and its directory removed when the test ends. A missing
// ZooKeeper skips the test, or fails it under CI=true.
func StartEnsemble(t testing.TB, n int, opts Options) *Ensemble {
	t.Helper()
	if n < 1 {
		t.Fatalf("zktest: ensemble of %d servers", n)
	}
	opts = opts.withDefaults(250*time.Millisecond, "128m")
	// 128 MiB each: three JVMs must fit beside the tests on a small machine, and a test
	// ensemble holds little data.
	e := &Ensemble{t: t, servers: launch(t, n, opts), opts: opts}
	ctx, cancel := context.WithTimeout(context.Background(), opts.StartTimeout)
	defer cancel()
	if err := e.waitServing(ctx, n); err != nil {
		for _, s := range e.servers {
			t.Logf("zktest: %s log tail:\n%s", s, s.logTail())
		}
		t.Fatalf("zktest: ensemble not serving: %v", err)
	}
	return e
}

// Servers returns the ensemble's servers in myid order (Servers()[i].ID() == i+1).
func (e *Ensemble) Servers() []*Server { return append([]*Server(nil), e.servers...) }

// Addrs returns the client addresses as a comma-separated list.
func (e *Ensemble) Addrs() string {
	addrs := make([]string, len(e.servers))
	for i, s := range e.servers {
		addrs[i] = s.Addr()
	}
	return strings.Join(addrs, ",")
}

// URL returns a coord store URL naming every server, with the given chroot ("" for none).
func (e *Ensemble) URL(chroot string) string { return "zk://" + e.Addrs() + chroot }

// TickTime returns the servers' tick.
func (e *Ensemble) TickTime() time.Duration { return e.opts.TickTime }

// Leader returns the server whose srvr says "Mode: leader", or nil if none does now.
func (e *Ensemble) Leader() *Server {
	for _, s := range e.servers {
		if !s.Running() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		m, err := s.Mode(ctx)
		cancel()
		if err == nil && m == "leader" {
			return s
		}
	}
	return nil
}

// WaitServing waits until a quorum (a majority of the servers) answers srvr with a Mode
// line and one of them leads, that is until the ensemble has a leader and serves clients,
// or ctx is done. A quorum of Mode lines alone is not evidence: for syncLimit ticks after
// its leader dies, a follower still answers "Mode: follower".
func (e *Ensemble) WaitServing(ctx context.Context) error {
	return e.waitServing(ctx, len(e.servers)/2+1)
}

func (e *Ensemble) waitServing(ctx context.Context, want int) error {
	for {
		// All at once: an unreachable server (a cut host) takes the whole timeout to say so,
		// and must not delay seeing the others serve.
		states := make([]string, len(e.servers))
		ok := make([]bool, len(e.servers))
		leads := make([]bool, len(e.servers))
		var wg sync.WaitGroup
		for i, s := range e.servers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				actx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				m, err := s.Mode(actx)
				ok[i] = err == nil
				leads[i] = err == nil && (m == "leader" || m == "standalone")
				if err == nil {
					states[i] = fmt.Sprintf("%s: %s", s, m)
				} else {
					states[i] = fmt.Sprintf("%s: %v", s, err)
				}
			}()
		}
		wg.Wait()
		serving, leaders := 0, 0
		for i := range ok {
			if ok[i] {
				serving++
			}
			if leads[i] {
				leaders++
			}
		}
		if serving >= want && leaders > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d servers serving (%d leading), want %d and a leader: %s: %w",
				serving, len(e.servers), leaders, want, strings.Join(states, "; "), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
