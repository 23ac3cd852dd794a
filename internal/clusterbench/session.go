package clusterbench

import (
	"context"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// A simulated agent holds a ZooKeeper session, and a session is a connection: one open file
// in this process and one in the server for each. Where either may open fewer files than
// there are nodes (ulimit -n; this machine caps both at 20,000 and grants no more), nodes of
// one rack share a session (Config.NodesPerSession): each still registers its own
// session-bound entry, watches its own assignment and writes its own record, and the
// master stamps each assignment with the session that owns the node's entry, as for one
// agent alone; the loss of a rack or a data center closes every session of its nodes.

// session is one store session shared by the agents of a group of nodes. It is opened by
// the first agent that asks and closed when the last one closes.
type session struct {
	open func(ctx context.Context) (coord.Store, error)
	mu   sync.Mutex
	st   coord.Store
	refs int
}

// get returns the session's store for one more agent, opening it when none is open.
func (s *session) get(ctx context.Context) (coord.Store, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st == nil {
		st, err := s.open(ctx)
		if err != nil {
			return nil, err
		}
		s.st = st
	}
	s.refs++
	return &sessionRef{Store: s.st, s: s}, nil
}

func (s *session) release() error {
	s.mu.Lock()
	s.refs--
	if s.refs > 0 {
		s.mu.Unlock()
		return nil
	}
	st := s.st
	s.st = nil
	s.mu.Unlock()
	return st.Close()
}

// sessionRef is one agent's hold on a shared session: its Close lets go of it.
type sessionRef struct {
	coord.Store
	s    *session
	once sync.Once
}

func (r *sessionRef) Close() error {
	var err error
	r.once.Do(func() { err = r.s.release() })
	return err
}

// groups splits the nodes into groups of at most per nodes of one rack, in the nodes'
// order: each group shares one session.
func groups(nodes []cluster.Node, per int) [][]int {
	if per <= 1 {
		out := make([][]int, len(nodes))
		for i := range nodes {
			out[i] = []int{i}
		}
		return out
	}
	open := map[[2]string]int{} // dc, rack -> index in out of its last group
	var out [][]int
	for i, n := range nodes {
		k := [2]string{n.DC, n.Rack}
		if g, ok := open[k]; ok && len(out[g]) < per {
			out[g] = append(out[g], i)
			continue
		}
		open[k] = len(out)
		out = append(out, []int{i})
	}
	return out
}

// checkFiles refuses a run whose sessions this process cannot open: each is a connection,
// an open file, and the agents' process must hold them all with room for the rest.
func checkFiles(sessions int) error {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return nil
	}
	need := uint64(sessions) + 256
	if lim.Cur >= need {
		return nil
	}
	if lim.Max >= need {
		// Up to the hard limit: no privilege needed.
		lim.Cur = need
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err == nil {
			return nil
		}
	}
	return fmt.Errorf("the agents' %d ZooKeeper sessions need %d open files in this process and it may open %d (ulimit -n, hard limit %d): raise the limit, or share sessions among the nodes of a rack (--nodes-per-session)",
		sessions, need, lim.Cur, lim.Max)
}
