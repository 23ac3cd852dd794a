package placement

import (
	"cmp"
	"fmt"
	"slices"
)

// preempt finds room for one more worker of st's group by evicting workers of strictly
// lower priority, and returns the node it took, or -1 when even evicting every
// lower-priority worker of a node makes room on none.
//
// Among the nodes where eviction works it prefers, in order: the emptiest spread domains
// (as pick does), the fewest evictions, then the first node. On the chosen node it evicts
// lowest priority first, then the last placed group and highest worker index first.
// This path scans the group's whole signature, so it is slower than pick; it runs only
// when the cluster is short of capacity.
func (p *planner) preempt(st *gstate) int32 {
	g := st.g
	// Placed workers of lower priority; zero means there is nothing to evict. Priorities
	// out of range share the end buckets, so for those count g's own bucket too.
	top := clampPrio(g.prio)
	if top != g.prio {
		top++
	}
	lower := 0
	for _, n := range p.placedByPrio[:top] {
		lower += n
	}
	if lower == 0 {
		return -1
	}
	p.buildByNode()
	var (
		best      = int32(-1)
		bestScore [4]int32
		bestSet   []wref
		set       []wref
	)
	for _, n := range st.s.nodes {
		if g.maxPerNode > 0 && p.nodeCount[n] >= int32(g.maxPerNode) {
			continue
		}
		ns := &p.idx.nodes[n]
		slots, mem, cpu := ns.freeNew(), ns.mem-ns.usedMem, ns.cpu-ns.usedCPU
		set = set[:0]
		for _, r := range p.byNode[n] {
			if o := p.groups[r.g]; o.prio < g.prio {
				slots, mem, cpu = slots+1, mem+o.mem, cpu+o.cpu
				set = append(set, r)
			}
		}
		if slots < 1 || mem < g.mem || cpu < g.cpu {
			continue
		}
		slices.SortFunc(set, func(a, b wref) int {
			if c := cmp.Compare(p.groups[a.g].prio, p.groups[b.g].prio); c != 0 {
				return c
			}
			if c := cmp.Compare(b.g, a.g); c != 0 {
				return c
			}
			return cmp.Compare(b.w, a.w)
		})
		// Evict in that order only as many as needed.
		slots, mem, cpu = ns.freeNew(), ns.mem-ns.usedMem, ns.cpu-ns.usedCPU
		k := 0
		for slots < 1 || mem < g.mem || cpu < g.cpu {
			o := p.groups[set[k].g]
			slots, mem, cpu = slots+1, mem+o.mem, cpu+o.cpu
			k++
		}
		score := [4]int32{-1, -1, p.nodeCount[n], int32(k)}
		if g.spreadDC {
			score[0] = st.cnt[st.s.dcDom[ns.dc]]
		}
		if g.spreadRack {
			score[1] = st.cnt[st.s.rackDom[ns.rack]]
		}
		if best < 0 || slices.Compare(score[:], bestScore[:]) < 0 {
			best, bestScore = n, score
			bestSet = append(bestSet[:0], set[:k]...)
		}
	}
	if best < 0 {
		return -1
	}
	for _, r := range bestSet {
		o := p.groups[r.g]
		p.evict(o, r.w)
		p.displaced[r] = fmt.Sprintf("preempted by job %s of tenant %s (priority %d over %d)", g.job.Name, g.job.Tenant, g.prio, o.prio)
		o.pending = append(o.pending, r.w)
	}
	return best
}

// buildByNode lists the workers on each node, the first time preemption needs it; commit
// and evict keep it current from then on.
func (p *planner) buildByNode() {
	if p.byNode != nil {
		return
	}
	p.byNode = make([][]wref, len(p.idx.nodes))
	for _, g := range p.groups {
		for w, n := range g.nodeOf {
			if n >= 0 {
				p.byNode[n] = append(p.byNode[n], wref{g.idx, int32(w)})
			}
		}
	}
}
