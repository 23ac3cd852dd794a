package placement

import (
	"errors"
	"fmt"
	"slices"

	"github.com/stormdock/stormdock/cluster"
)

// resolveCurrent records where each worker of the current assignment runs. Workers whose
// job, link or index no longer exists become moves to nowhere right away.
func (p *planner) resolveCurrent(cur []cluster.Placement) error {
	var errs []error
	var gone map[cluster.WorkerKey]bool // removed workers seen, to catch duplicates
	var lastJob string
	var lastGroups []*group
	for i := range cur {
		c := &cur[i]
		// Current is usually sorted by job: skip the map lookup while the job repeats.
		if c.Job != lastJob || lastGroups == nil {
			lastJob, lastGroups = c.Job, p.jobs[c.Job]
		}
		var g *group
		for _, lg := range lastGroups {
			if lg.link == c.Link {
				g = lg
				break
			}
		}
		why := ""
		switch {
		case c.Worker < 0:
			errs = append(errs, fmt.Errorf("current placement of %s: worker index must not be negative", c.Key()))
			continue
		case lastGroups == nil:
			why = "job removed"
		case g == nil && c.Link == "":
			why = "job is now mirrored"
		case g == nil:
			why = "link removed"
		case c.Worker >= len(g.cur):
			why = "scaled in"
		}
		if why != "" {
			if gone == nil {
				gone = map[cluster.WorkerKey]bool{}
			}
			if gone[c.Key()] {
				errs = append(errs, fmt.Errorf("current placement: worker %s is placed twice", c.Key()))
			}
			gone[c.Key()] = true
			p.removed = append(p.removed, Move{Job: c.Job, Worker: c.Worker, Link: c.Link, From: c.Node, Reason: why})
			continue
		}
		w := int32(c.Worker)
		if g.cur[w] != -1 {
			errs = append(errs, fmt.Errorf("current placement: worker %s is placed twice", c.Key()))
			continue
		}
		n, ok := p.idx.byID[c.Node]
		if !ok {
			g.cur[w] = lostNode
			p.lostFrom[wref{g.idx, w}] = c.Node
			continue
		}
		g.cur[w] = n
	}
	return errors.Join(errs...)
}

// pend queues a worker for a new node, unless Hold keeps it back.
func (p *planner) pend(g *group, w int32) {
	if len(p.hold) > 0 {
		if _, held := p.hold[cluster.WorkerKey{Job: g.job.Name, Link: g.link, Worker: int(w)}]; held {
			g.held = append(g.held, w)
			return
		}
	}
	g.pending = append(g.pending, w)
}

// keep leaves every current worker where it is when that is still valid, in priority
// order so that an over-committed node keeps its most important workers. Every other
// worker of a job becomes pending.
func (p *planner) keep() {
	for _, g := range p.groups {
		for wi, n := range g.cur {
			w := int32(wi)
			if n < 0 {
				if n == lostNode {
					p.displaced[wref{g.idx, w}] = "node lost"
				}
				p.pend(g, w)
				continue
			}
			if why := p.keepable(g, n); why != "" {
				p.displaced[wref{g.idx, w}] = why
				p.pend(g, w)
				continue
			}
			p.nodeCount[n]++
			p.commit(g, w, n, nil)
		}
		for _, n := range g.nodeOf {
			if n >= 0 {
				p.nodeCount[n] = 0
			}
		}
	}
}

// keepable says why worker of g cannot stay on node n, or "" when it can.
func (p *planner) keepable(g *group, n int32) string {
	ns := &p.idx.nodes[n]
	if ns.draining {
		return "node draining"
	}
	if r, label := p.allowed(g, ns); r != okNode {
		return "node no longer allowed: " + p.rejectText(g, r, label)
	}
	if g.maxPerNode > 0 && p.nodeCount[n] >= int32(g.maxPerNode) {
		return "node no longer allowed: " + p.rejectText(g, rejMaxPerNode, "")
	}
	if ns.keepCap-ns.slots < 1 || ns.mem-ns.usedMem < g.mem || ns.cpu-ns.usedCPU < g.cpu {
		return "node over capacity"
	}
	return ""
}

// moves lists every current worker whose node changed, sorted by worker; order is the
// groups sorted by job and link.
func (p *planner) moves(order []*group) []Move {
	out := []Move{}
	for _, g := range order {
		for wi, c := range g.cur {
			n := g.nodeOf[wi]
			if c == -1 || c == n {
				continue
			}
			r := wref{g.idx, int32(wi)}
			m := Move{Job: g.job.Name, Worker: wi, Link: g.link, Reason: p.displaced[r]}
			if c == lostNode {
				m.From = p.lostFrom[r]
			} else {
				m.From = p.idx.nodes[c].id
			}
			if n >= 0 {
				m.To = p.idx.nodes[n].id
			}
			out = append(out, m)
		}
	}
	if len(p.removed) > 0 {
		out = append(out, p.removed...)
		slices.SortFunc(out, func(a, b Move) int { return a.Key().Compare(b.Key()) })
	}
	return out
}
