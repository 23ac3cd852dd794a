package placement

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Explanation says why no node takes another worker of a job (or link): how many of the
// cluster's nodes fit, and for each check a node can fail how many nodes failed it. Rejected
// counts each node under the first check it fails, in the order the planner checks (so the
// counts add up to Total-Fit); Failing counts every node that fails the check at all,
// whatever else it fails. It is the same for every unplaced worker of the job (or link).
type Explanation struct {
	Fit      int         `json:"fit"`
	Total    int         `json:"total"`
	Rejected []Rejection `json:"rejected,omitempty"`
}

// Rejection is one check of Explanation.
type Rejection struct {
	// Check names the check: draining, unschedulable, link-dc, dc, other-pool, not-pool,
	// label, avoided, max-per-node, throttled, slots, memory, cpu.
	Check string `json:"check"`
	// Text words it for people ("missing label disk=ssd").
	Text string `json:"text"`
	// Nodes is how many nodes failed this check first; Failing how many failed it at all.
	Nodes   int `json:"nodes"`
	Failing int `json:"failing"`
}

// String is the explanation in one line, as Unplaced.Reason has it:
// "0 of 400 nodes fit: dc not allowed (200), no free slot (150)".
func (e *Explanation) String() string {
	if e.Total == 0 {
		return "0 of 0 nodes fit: the cluster has no nodes"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d nodes fit", e.Fit, e.Total)
	n := 0
	for _, r := range e.Rejected {
		if r.Nodes == 0 {
			continue
		}
		if n == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString(", ")
		}
		n++
		b.WriteString(r.Text + " (" + strconv.Itoa(r.Nodes) + ")")
	}
	return b.String()
}

// explain says why no node takes another worker of g, counting each node under the first
// check it fails, and every check it fails. It looks at the final state of the plan, so it
// is the same for every unplaced worker of g.
func (p *planner) explain(g *group) *Explanation {
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
	first, failing := map[key]int{}, map[key]int{}
	e := &Explanation{Total: len(p.idx.nodes)}
	for i := range p.idx.nodes {
		r, label := p.check(g, int32(i))
		if r == okNode {
			e.Fit++
			continue
		}
		first[key{r, label}]++
		p.failures(g, int32(i), func(r reject, label string) { failing[key{r, label}]++ })
	}
	for k, n := range failing {
		e.Rejected = append(e.Rejected, Rejection{Check: checkNames[k.r], Text: p.rejectText(g, k.r, k.label), Nodes: first[k], Failing: n})
	}
	// The first failures, most first (the one-line form lists these), then the checks
	// that were never a node's first, by how many nodes fail them.
	slices.SortFunc(e.Rejected, func(a, b Rejection) int {
		if c := cmp.Compare(b.Nodes, a.Nodes); c != 0 || a.Nodes > 0 {
			return cmp.Or(c, cmp.Compare(a.Text, b.Text))
		}
		return cmp.Or(cmp.Compare(b.Failing, a.Failing), cmp.Compare(a.Text, b.Text))
	})
	return e
}

// checkNames are the Rejection.Check names of the rejections.
var checkNames = map[reject]string{
	rejDraining: "draining", rejUnschedulable: "unschedulable", rejLinkDC: "link-dc", rejDC: "dc",
	rejOtherPool: "other-pool", rejNotPool: "not-pool", rejLabel: "label", rejAvoided: "avoided",
	rejMaxPerNode: "max-per-node", rejThrottled: "throttled", rejSlots: "slots", rejMemory: "memory", rejCPU: "cpu",
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

// failures calls fail for every test of check that node n fails, not only the first (a
// missing label, for each label).
func (p *planner) failures(g *group, n int32, fail func(reject, string)) {
	ns := &p.idx.nodes[n]
	if ns.draining {
		fail(rejDraining, "")
	}
	if ns.unsched {
		fail(rejUnschedulable, "")
	}
	if g.allowedDC != nil && !g.allowedDC[ns.dc] {
		if g.link != "" {
			fail(rejLinkDC, "")
		} else {
			fail(rejDC, "")
		}
	}
	switch {
	case ns.pool == g.job.Tenant:
	case ns.pool != "":
		fail(rejOtherPool, "")
	case g.ownPool:
		fail(rejNotPool, "")
	}
	for _, k := range g.labelKeys {
		if v, ok := ns.labels[k]; !ok || v != g.job.Placement.NodeLabels[k] {
			fail(rejLabel, k)
		}
	}
	if g.avoid[ns.id] {
		fail(rejAvoided, "")
	}
	if g.maxPerNode > 0 && p.nodeCount[n] >= int32(g.maxPerNode) {
		fail(rejMaxPerNode, "")
	}
	switch {
	case ns.freeNew() < 1 && ns.keepCap-ns.slots >= 1:
		fail(rejThrottled, "")
	case ns.freeNew() < 1:
		fail(rejSlots, "")
	}
	if ns.mem-ns.usedMem < g.mem {
		fail(rejMemory, "")
	}
	if ns.cpu-ns.usedCPU < g.cpu {
		fail(rejCPU, "")
	}
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
