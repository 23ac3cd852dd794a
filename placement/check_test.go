package placement_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/placement"
)

// This file re-states the planner's rules in the simplest possible way (brute force over
// every node) so that the property tests check the planner against an independent model.

type model struct {
	nodes  map[string]*cluster.Node
	order  []string // node ids
	jobs   map[string]*cluster.JobSpec
	owners map[string]bool
}

func newModel(in placement.Input) *model {
	m := &model{nodes: map[string]*cluster.Node{}, jobs: map[string]*cluster.JobSpec{}, owners: map[string]bool{}}
	for i := range in.Nodes {
		n := &in.Nodes[i]
		m.nodes[n.ID] = n
		m.order = append(m.order, n.ID)
		if n.Pool != "" {
			m.owners[n.Pool] = true
		}
	}
	slices.Sort(m.order)
	for i := range in.Jobs {
		m.jobs[in.Jobs[i].Name] = &in.Jobs[i]
	}
	return m
}

// allowed: dc, link, pool and labels.
func (m *model) allowed(j *cluster.JobSpec, link string, n *cluster.Node) bool {
	if link != "" && n.DC != link {
		return false
	}
	if len(j.Placement.DCs) > 0 && !slices.Contains(j.Placement.DCs, n.DC) {
		return false
	}
	if n.Pool != "" && n.Pool != j.Tenant {
		return false
	}
	if n.Pool == "" && m.owners[j.Tenant] {
		return false
	}
	for k, v := range j.Placement.NodeLabels {
		if got, ok := n.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// eligible: allowed and open to new work.
func (m *model) eligible(j *cluster.JobSpec, link string, n *cluster.Node) bool {
	return !n.Unschedulable && !n.Draining && m.allowed(j, link, n)
}

type usage struct {
	slots    int
	mem, cpu int64
	perJob   map[string]int
	hasNew   bool
	workers  []cluster.Placement
}

// state is the cluster after a plan.
type state struct {
	m    *model
	use  map[string]*usage
	byWk map[cluster.WorkerKey]string
}

func (m *model) state(ps []cluster.Placement, cur []cluster.Placement) *state {
	s := &state{m: m, use: map[string]*usage{}, byWk: map[cluster.WorkerKey]string{}}
	for _, id := range m.order {
		s.use[id] = &usage{perJob: map[string]int{}}
	}
	was := map[cluster.WorkerKey]string{}
	for _, c := range cur {
		was[c.Key()] = c.Node
	}
	for _, p := range ps {
		u := s.use[p.Node]
		if u == nil {
			continue
		}
		j := m.jobs[p.Job]
		u.slots++
		u.mem += int64(j.Resources.Memory)
		u.cpu += int64(j.Resources.CPU)
		u.perJob[p.Job]++
		u.workers = append(u.workers, p)
		if was[p.Key()] != p.Node {
			u.hasNew = true
		}
		s.byWk[p.Key()] = p.Node
	}
	return s
}

// fits: could node n take one more new worker of j now (constraints included)?
func (s *state) fits(j *cluster.JobSpec, link string, n *cluster.Node) bool {
	u := s.use[n.ID]
	if !s.m.eligible(j, link, n) {
		return false
	}
	if j.Placement.MaxPerNode > 0 && u.perJob[j.Name] >= j.Placement.MaxPerNode {
		return false
	}
	return n.Slots-n.Used.Slots-n.Throttled-u.slots >= 1 &&
		int64(n.Memory-n.Used.Memory)-u.mem >= int64(j.Resources.Memory) &&
		int64(n.CPU-n.Used.CPU)-u.cpu >= int64(j.Resources.CPU)
}

// fitsAfterEvicting: could it, with every worker of lower priority evicted?
func (s *state) fitsAfterEvicting(j *cluster.JobSpec, link string, n *cluster.Node) bool {
	u := s.use[n.ID]
	if !s.m.eligible(j, link, n) || (j.Placement.MaxPerNode > 0 && u.perJob[j.Name] >= j.Placement.MaxPerNode) {
		return false
	}
	slots, mem, cpu := u.slots, u.mem, u.cpu
	for _, w := range u.workers {
		if o := s.m.jobs[w.Job]; o.Priority < j.Priority {
			slots--
			mem -= int64(o.Resources.Memory)
			cpu -= int64(o.Resources.CPU)
		}
	}
	return n.Slots-n.Used.Slots-n.Throttled-slots >= 1 &&
		int64(n.Memory-n.Used.Memory)-mem >= int64(j.Resources.Memory) &&
		int64(n.CPU-n.Used.CPU)-cpu >= int64(j.Resources.CPU)
}

// verify checks every invariant of a plan that does not depend on history. fresh says
// the plan started from nothing, where the skew bound must hold.
func verify(t *testing.T, in placement.Input, r *placement.Result, fresh bool) {
	t.Helper()
	m := newModel(in)
	s := m.state(r.Placements, in.Current)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%s\ninput: %s", fmt.Sprintf(format, args...), dump(in))
	}
	if !slices.IsSortedFunc(r.Placements, func(a, b cluster.Placement) int { return a.Key().Compare(b.Key()) }) ||
		!slices.IsSortedFunc(r.Unplaced, func(a, b placement.Unplaced) int { return a.Key().Compare(b.Key()) }) ||
		!slices.IsSortedFunc(r.Moves, func(a, b placement.Move) int { return a.Key().Compare(b.Key()) }) {
		fail("output not sorted")
	}
	// Every worker exactly once, placed or unplaced.
	seen := map[cluster.WorkerKey]bool{}
	for _, p := range r.Placements {
		if seen[p.Key()] {
			fail("%s placed twice", p.Key())
		}
		seen[p.Key()] = true
	}
	for _, u := range r.Unplaced {
		if seen[u.Key()] {
			fail("%s both placed and unplaced", u.Key())
		}
		seen[u.Key()] = true
	}
	for _, j := range in.Jobs {
		for _, k := range j.Keys() {
			if !seen[k] {
				fail("%s neither placed nor unplaced", k)
			}
			delete(seen, k)
		}
	}
	if len(seen) > 0 {
		fail("workers of no job in the plan: %v", seen)
	}
	// Capacity and constraints.
	for id, u := range s.use {
		n := m.nodes[id]
		if u.slots == 0 {
			continue
		}
		if n.Slots-n.Used.Slots < u.slots || int64(n.Memory-n.Used.Memory) < u.mem || int64(n.CPU-n.Used.CPU) < u.cpu {
			fail("node %s over-committed: %d slots, %d mem, %d cpu", id, u.slots, u.mem, u.cpu)
		}
		if u.hasNew && (n.Slots-n.Used.Slots-n.Throttled < u.slots || n.Unschedulable || n.Draining) {
			fail("node %s took new workers beyond its schedulable slots (%d)", id, u.slots)
		}
		for job, c := range u.perJob {
			if mx := m.jobs[job].Placement.MaxPerNode; mx > 0 && c > mx {
				fail("job %s has %d workers on %s, maxPerNode %d", job, c, id, mx)
			}
		}
	}
	for _, p := range r.Placements {
		n := m.nodes[p.Node]
		if n == nil || n.Draining || !m.allowed(m.jobs[p.Job], p.Link, n) {
			fail("%s on node %s breaks the job's constraints", p.Key(), p.Node)
		}
	}
	// Unplaced only when nothing fits, even after evicting lower priorities.
	for _, u := range r.Unplaced {
		j := m.jobs[u.Job]
		if !strings.HasPrefix(u.Reason, fmt.Sprintf("0 of %d nodes fit", len(m.order))) {
			fail("%s: reason %q", u.Key(), u.Reason)
		}
		for _, id := range m.order {
			if s.fits(j, u.Link, m.nodes[id]) {
				fail("%s unplaced but node %s could take it", u.Key(), id)
			}
			if s.fitsAfterEvicting(j, u.Link, m.nodes[id]) {
				fail("%s (priority %d) unplaced but node %s could take it by evicting lower priorities", u.Key(), j.Priority, id)
			}
		}
	}
	// Moves are exactly the current workers whose node changed.
	moved := map[cluster.WorkerKey]placement.Move{}
	for _, mv := range r.Moves {
		moved[mv.Key()] = mv
	}
	for _, c := range in.Current {
		mv, isMove := moved[c.Key()]
		now := s.byWk[c.Key()]
		if (now != c.Node) != isMove || (isMove && (mv.From != c.Node || mv.To != now)) {
			fail("move of %s wrong: was %s, now %q, move %+v", c.Key(), c.Node, now, mv)
		}
		delete(moved, c.Key())
	}
	if len(moved) > 0 {
		fail("moves of workers not in current: %v", moved)
	}
	if fresh {
		checkSkew(t, in, m, s, fail)
	}
}

// checkSkew: sibling domains differ by at most one worker of a job (link), unless the
// smaller one has no node that could take another.
func checkSkew(t *testing.T, in placement.Input, m *model, s *state, fail func(string, ...any)) {
	t.Helper()
	for _, j := range in.Jobs {
		links := j.Links
		if len(links) == 0 {
			links = []string{""}
		}
		levels := j.Placement.Spread
		for _, link := range links {
			// A domain is named by the path of its levels so far, like "dc-a/r1/n3".
			type dom struct{ count, fit, eligible int }
			for li, lv := range levels {
				parentOf := func(n *cluster.Node) string { return domPath(n, levels[:li]) }
				doms := map[string]map[string]*dom{} // parent -> child -> dom
				for _, id := range m.order {
					n := m.nodes[id]
					if !m.eligible(&j, link, n) {
						continue
					}
					par, child := parentOf(n), domPath(n, levels[:li+1])
					if doms[par] == nil {
						doms[par] = map[string]*dom{}
					}
					d := doms[par][child]
					if d == nil {
						d = &dom{}
						doms[par][child] = d
					}
					d.eligible++
					if s.fits(&j, link, n) {
						d.fit++
					}
				}
				for _, k := range j.Keys() {
					if k.Link != link {
						continue
					}
					id, ok := s.byWk[k]
					if !ok {
						continue
					}
					n := m.nodes[id]
					if d := doms[parentOf(n)][domPath(n, levels[:li+1])]; d != nil {
						d.count++
					}
				}
				for par, children := range doms {
					for a, da := range children {
						for b, db := range children {
							if da.count > db.count+1 && db.fit > 0 {
								fail("job %s link %q level %s under %q: %s has %d workers, %s has %d and room",
									j.Name, link, lv, par, a, da.count, b, db.count)
							}
						}
					}
				}
			}
		}
	}
}

func domPath(n *cluster.Node, levels []string) string {
	var b strings.Builder
	for _, lv := range levels {
		switch lv {
		case cluster.DomainDC:
			b.WriteString(n.DC)
		case cluster.DomainRack:
			b.WriteString(n.DC + "." + n.Rack)
		case cluster.DomainNode:
			b.WriteString(n.ID)
		}
		b.WriteByte('/')
	}
	return b.String()
}
