package placement

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// explain says why no node takes another worker of g, counting each node under the first
// check it fails: "0 of 400 nodes fit: dc not allowed (200), no free slot (150)". It looks
// at the final state of the plan, so it is the same for every unplaced worker of g.
func (p *planner) explain(g *group) string {
	for _, n := range g.nodeOf {
		if n >= 0 {
			p.nodeCount[n]++
		}
	}
	defer func() {
		for _, n := range g.nodeOf {
			if n >= 0 {
				p.nodeCount[n] = 0
			}
		}
	}()
	type key struct {
		r     reject
		label string
	}
	counts := map[key]int{}
	fit := 0
	for i := range p.idx.nodes {
		r, label := p.check(g, int32(i))
		if r == okNode {
			fit++
			continue
		}
		counts[key{r, label}]++
	}
	total := len(p.idx.nodes)
	if total == 0 {
		return "0 of 0 nodes fit: the cluster has no nodes"
	}
	type item struct {
		text string
		n    int
	}
	items := make([]item, 0, len(counts))
	for k, n := range counts {
		items = append(items, item{p.rejectText(g, k.r, k.label), n})
	}
	slices.SortFunc(items, func(a, b item) int {
		if c := cmp.Compare(b.n, a.n); c != 0 {
			return c
		}
		return cmp.Compare(a.text, b.text)
	})
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d nodes fit", fit, total)
	for i, it := range items {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString(", ")
		}
		b.WriteString(it.text + " (" + strconv.Itoa(it.n) + ")")
	}
	return b.String()
}

// check runs every test a new worker of g must pass on node n, in explanation order.
// p.nodeCount must hold g's counts.
func (p *planner) check(g *group, n int32) (reject, string) {
	ns := &p.idx.nodes[n]
	switch {
	case ns.draining:
		return rejDraining, ""
	case ns.unsched:
		return rejUnschedulable, ""
	}
	if r, label := p.allowed(g, ns); r != okNode {
		return r, label
	}
	switch {
	case g.maxPerNode > 0 && p.nodeCount[n] >= int32(g.maxPerNode):
		return rejMaxPerNode, ""
	case ns.freeNew() < 1 && ns.keepCap-ns.slots >= 1:
		return rejThrottled, ""
	case ns.freeNew() < 1:
		return rejSlots, ""
	case ns.mem-ns.usedMem < g.mem:
		return rejMemory, ""
	case ns.cpu-ns.usedCPU < g.cpu:
		return rejCPU, ""
	}
	return okNode, ""
}

// rejectText words a rejection for people.
func (p *planner) rejectText(g *group, r reject, label string) string {
	switch r {
	case rejDraining:
		return "node draining"
	case rejUnschedulable:
		return "node unschedulable"
	case rejLinkDC:
		return "not in link dc " + g.link
	case rejDC:
		return "dc not allowed"
	case rejOtherPool:
		return "pool of another tenant"
	case rejNotPool:
		return "outside tenant " + g.job.Tenant + "'s pool"
	case rejLabel:
		return "missing label " + label + "=" + g.job.Placement.NodeLabels[label]
	case rejAvoided:
		return "avoided after crash loops"
	case rejMaxPerNode:
		return "maxPerNode " + strconv.Itoa(g.maxPerNode) + " reached"
	case rejThrottled:
		return "slots throttled"
	case rejSlots:
		return "no free slot"
	case rejMemory:
		return "not enough memory"
	case rejCPU:
		return "not enough cpu"
	}
	return "ok"
}
