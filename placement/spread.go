package placement

import "slices"

// gstate is what placing one group needs beyond the cluster: how many of its workers each
// domain and node holds, and which domains are known to have no room for it.
//
// Within one group's turn capacity only shrinks and its counts only grow (except when it
// preempts, which resets the state), so "full" stays true once found and the smallest
// count among fitting nodes of a domain (floor) never decreases: a node whose count is
// at the floor can be taken without looking further.
type gstate struct {
	p     *planner
	g     *group
	s     *signature
	cnt   []int32 // per domain of s
	full  []bool
	floor []int32
}

func (p *planner) load(g *group) *gstate {
	s := p.sigFor(g)
	st := &p.scratch
	nd := len(s.doms)
	*st = gstate{p: p, g: g, s: s,
		cnt: grow(st.cnt, nd), full: grow(st.full, nd), floor: grow(st.floor, nd)}
	for _, n := range g.nodeOf {
		if n >= 0 {
			st.add(n, 1)
		}
	}
	return st
}

// grow returns a zeroed slice of n elements, reusing buf when it is large enough.
func grow[T any](buf []T, n int) []T {
	if cap(buf) < n {
		return make([]T, n)
	}
	buf = buf[:n]
	clear(buf)
	return buf
}

// unload clears the per-node scratch counts the group used.
func (st *gstate) unload() {
	for _, n := range st.g.nodeOf {
		if n >= 0 {
			st.p.nodeCount[n] = 0
		}
	}
}

// reset forgets what was learnt about full domains, after capacity grew.
func (st *gstate) reset() {
	clear(st.full)
	clear(st.floor)
}

// add counts d more workers of the group on global node n.
func (st *gstate) add(n int32, d int32) {
	st.p.nodeCount[n] += d
	loc := st.p.idx.loc[n]
	st.cnt[0] += d
	if dd := st.s.dcDom[loc.dc]; dd >= 0 {
		st.cnt[dd] += d
	}
	if rd := st.s.rackDom[loc.rack]; rd >= 0 {
		st.cnt[rd] += d
	}
}

// fits reports whether local node l of the signature can take one more worker now.
func (st *gstate) fits(l int32) bool {
	n := st.s.nodes[l]
	if st.g.maxPerNode > 0 && st.p.nodeCount[n] >= int32(st.g.maxPerNode) {
		return false
	}
	return st.p.idx.nodes[n].fitsNew(st.g)
}

// pick chooses a node for one more worker, or returns -1 when no node fits.
func (st *gstate) pick() int32 {
	if st.g.spreadDC {
		return st.choose(st.s.doms[0].dcs, st.pickRack)
	}
	return st.pickRack(0)
}

func (st *gstate) pickRack(d int32) int32 {
	if st.g.spreadRack {
		return st.choose(st.s.doms[d].racks, st.pickNode)
	}
	return st.pickNode(d)
}

// choose walks into the sibling domain with the fewest of the group's workers (then the
// most free slots, then the first), skipping domains found full.
func (st *gstate) choose(children []int32, next func(int32) int32) int32 {
	for {
		best := int32(-1)
		for _, c := range children {
			if st.full[c] || st.s.doms[c].free == 0 {
				continue
			}
			if best < 0 || st.cnt[c] < st.cnt[best] ||
				(st.cnt[c] == st.cnt[best] && st.s.doms[c].free > st.s.doms[best].free) {
				best = c
			}
		}
		if best < 0 {
			return -1
		}
		if n := next(best); n >= 0 {
			return n
		}
		st.full[best] = true
	}
}

// pickNode chooses a node inside domain d by the group's strategy and returns its global
// index, or -1 (and marks d full) when none fits.
func (st *gstate) pickNode(d int32) int32 {
	if st.full[d] {
		return -1
	}
	dom := &st.s.doms[d]
	nb := len(dom.bk)
	if st.g.binpack && !st.g.spreadNode {
		// Best fit: the fullest node that still has room.
		for b := 1; b < nb; b++ {
			for _, l := range dom.bk[b] {
				if st.fits(l) {
					return st.s.nodes[l]
				}
			}
		}
		st.full[d] = true
		return -1
	}
	// Fewest of the group's workers first; among those the most free slots (spread) or the
	// fewest (binpack with node spread), which is the order the buckets are walked in.
	floor := st.floor[d]
	best, bestCnt := int32(-1), int32(0)
	for i := 1; i < nb; i++ {
		b := nb - i
		if st.g.binpack {
			b = i
		}
		for _, l := range dom.bk[b] {
			if !st.fits(l) {
				continue
			}
			c := st.p.nodeCount[st.s.nodes[l]]
			if c <= floor {
				return st.s.nodes[l]
			}
			if best < 0 || c < bestCnt {
				best, bestCnt = l, c
			}
		}
	}
	if best < 0 {
		st.full[d] = true
		return -1
	}
	st.floor[d] = bestCnt
	return st.s.nodes[best]
}

// placeGroup gives a node to each pending worker of g. When a worker fits nowhere, it may
// evict lower-priority workers; when that fails too, the remaining workers, which ask for
// exactly the same, are left unplaced without searching again.
func (p *planner) placeGroup(g *group) {
	slices.Sort(g.pending)
	st := p.load(g)
	failed := false
	for _, w := range g.pending {
		if failed {
			g.unplaced = append(g.unplaced, w)
			continue
		}
		n := st.pick()
		if n < 0 {
			if n = p.preempt(st); n >= 0 {
				st.reset()
			}
		}
		if n < 0 {
			failed = true
			g.unplaced = append(g.unplaced, w)
			continue
		}
		p.commit(g, w, n, st)
	}
	g.pending = g.pending[:0]
	st.unload()
}
