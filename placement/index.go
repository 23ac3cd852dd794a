package placement

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/stormdock/stormdock/cluster"
)

// maxBucket bounds the free-slot buckets: nodes with more free slots share the top bucket,
// which only blurs the "most free first" order among very large nodes.
const maxBucket = 64

// nodeState is a node with what the plan has put on it so far.
type nodeState struct {
	id       string
	dc, rack int32 // global indexes
	keepCap  int   // slots running workers may keep: Slots - Used.Slots
	newCap   int   // slots new workers may take: keepCap - Throttled
	mem, cpu int64 // capacity less Used
	sched    bool  // takes new work: neither unschedulable nor draining
	draining bool
	unsched  bool
	pool     string
	labels   map[string]string

	slots            int // taken by the plan
	usedMem, usedCPU int64
}

func (n *nodeState) freeNew() int { return n.newCap - n.slots }

// fitsNew reports whether a new worker of g has room on n (constraints aside).
func (n *nodeState) fitsNew(g *group) bool {
	return n.newCap-n.slots >= 1 && n.mem-n.usedMem >= g.mem && n.cpu-n.usedCPU >= g.cpu
}

type nodeLoc struct{ dc, rack int32 }

// index is the cluster snapshot in a fixed order: by dc, rack, then node id, so the plan
// does not depend on the order of the input.
type index struct {
	nodes  []nodeState
	loc    []nodeLoc // nodes' dc and rack, packed: counting a group's workers reads only this
	byID   map[string]int32
	dcs    []string
	racks  []string // names, indexed globally; rackDC gives the dc
	rackDC []int32
	owners map[string]bool // tenants that own at least one pool node
}

func buildIndex(in []cluster.Node) (index, error) {
	order := make([]*cluster.Node, len(in))
	for i := range in {
		order[i] = &in[i]
	}
	byPlace := func(a, b *cluster.Node) int {
		if c := cmp.Compare(a.DC, b.DC); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Rack, b.Rack); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	}
	if !slices.IsSortedFunc(order, byPlace) { // inventories usually come sorted
		slices.SortFunc(order, byPlace)
	}
	x := index{
		nodes:  make([]nodeState, len(order)),
		loc:    make([]nodeLoc, len(order)),
		byID:   make(map[string]int32, len(order)),
		owners: map[string]bool{},
	}
	var errs []error
	for i, n := range order {
		if _, dup := x.byID[n.ID]; dup {
			errs = append(errs, fmt.Errorf("node %q is given twice", n.ID))
		}
		x.byID[n.ID] = int32(i)
		if len(x.dcs) == 0 || x.dcs[len(x.dcs)-1] != n.DC {
			x.dcs = append(x.dcs, n.DC)
			x.racks = append(x.racks, n.Rack)
			x.rackDC = append(x.rackDC, int32(len(x.dcs)-1))
		} else if x.racks[len(x.racks)-1] != n.Rack {
			x.racks = append(x.racks, n.Rack)
			x.rackDC = append(x.rackDC, int32(len(x.dcs)-1))
		}
		if n.Pool != "" {
			x.owners[n.Pool] = true
		}
		keep := n.Slots - n.Used.Slots
		x.loc[i] = nodeLoc{int32(len(x.dcs) - 1), int32(len(x.racks) - 1)}
		x.nodes[i] = nodeState{
			id: n.ID, unsched: n.Unschedulable,
			dc: int32(len(x.dcs) - 1), rack: int32(len(x.racks) - 1),
			keepCap: keep, newCap: keep - n.Throttled,
			mem:   int64(n.Memory - n.Used.Memory),
			cpu:   int64(n.CPU - n.Used.CPU),
			sched: !n.Unschedulable && !n.Draining, draining: n.Draining,
			pool: n.Pool, labels: n.Labels,
		}
	}
	return x, errors.Join(errs...)
}

func (x *index) dcIndex(name string) (int32, bool) {
	i, ok := slices.BinarySearch(x.dcs, name)
	return int32(i), ok
}

// reject says why a node cannot take a worker of a group. Its order is the order of the
// checks, which is also the order explanations attribute a node to.
type reject uint8

const (
	okNode reject = iota
	rejDraining
	rejUnschedulable
	rejLinkDC
	rejDC
	rejOtherPool
	rejNotPool
	rejLabel
	rejAvoided
	rejMaxPerNode
	rejThrottled
	rejSlots
	rejMemory
	rejCPU
)

// allowed checks the constraints that do not change during a plan: dc, link, pool and
// labels. It returns the first failing check and, for rejLabel, the missing label's key.
func (p *planner) allowed(g *group, n *nodeState) (reject, string) {
	if g.allowedDC != nil && !g.allowedDC[n.dc] {
		if g.link != "" {
			return rejLinkDC, ""
		}
		return rejDC, ""
	}
	switch {
	case n.pool == g.job.Tenant:
	case n.pool != "":
		return rejOtherPool, ""
	case g.ownPool:
		return rejNotPool, ""
	}
	for _, k := range g.labelKeys {
		if v, ok := n.labels[k]; !ok || v != g.job.Placement.NodeLabels[k] {
			return rejLabel, k
		}
	}
	if g.avoid[n.id] {
		return rejAvoided, ""
	}
	return okNode, ""
}

// sigKeyOf names the set of nodes a group may use for new work: groups with the same
// key share one signature (domain tree and free-capacity buckets).
func (p *planner) sigKeyOf(g *group) string {
	var b strings.Builder
	if g.allowedDC == nil {
		b.WriteString("*")
	} else {
		for i, ok := range g.allowedDC {
			if ok {
				b.WriteString(p.idx.dcs[i])
				b.WriteByte(',')
			}
		}
	}
	b.WriteByte('|')
	if p.idx.owners[g.job.Tenant] {
		b.WriteString(g.job.Tenant)
	}
	for _, k := range g.labelKeys {
		fmt.Fprintf(&b, "|%q=%q", k, g.job.Placement.NodeLabels[k])
	}
	if len(g.avoid) > 0 {
		b.WriteString("|avoid")
		for _, id := range slices.Sorted(maps.Keys(g.avoid)) {
			fmt.Fprintf(&b, ",%q", id)
		}
	}
	return b.String()
}

// signature is the part of the cluster one kind of group may place new workers on, as a
// tree root -> dc -> rack, each domain with its nodes bucketed by free slots. Picking a
// node is then a walk down the tree and a look at the top (or bottom) bucket, not a scan
// of the cluster.
type signature struct {
	nodes    []int32 // local id -> global node
	nodeDC   []int32 // local id -> dc domain
	nodeRack []int32 // local id -> rack domain
	bucket   []int32 // local id -> current bucket
	pos      [3][]int32
	doms     []domain // doms[0] is the root
	dcDom    []int32  // global dc -> domain, -1 when the signature has no node there
	rackDom  []int32  // global rack -> domain, -1 likewise
	nbuckets int
}

type domain struct {
	name  string
	dcs   []int32 // child dc domains (root only)
	racks []int32 // rack domains below: all of them for the root
	free  int64   // free slots of its nodes, for new work
	bk    [][]int32
}

type sigRef struct{ sig, local, next int32 }

func bucketOf(free, n int) int32 { return int32(min(max(free, 0), n-1)) }

// sigFor returns the signature of g, building it on first use from the nodes as they are
// now; from then on every commit and eviction keeps it up to date.
func (p *planner) sigFor(g *group) *signature {
	if g.sig != nil {
		return g.sig
	}
	if s, ok := p.sigs[g.sigKey]; ok {
		g.sig = s
		return s
	}
	top := 1
	for i := range p.idx.nodes {
		top = max(top, p.idx.nodes[i].newCap)
	}
	s := &signature{
		dcDom:    make([]int32, len(p.idx.dcs)),
		rackDom:  make([]int32, len(p.idx.racks)),
		nbuckets: min(top, maxBucket) + 1,
	}
	for i := range s.dcDom {
		s.dcDom[i] = -1
	}
	for i := range s.rackDom {
		s.rackDom[i] = -1
	}
	s.doms = append(s.doms, domain{name: "*", bk: make([][]int32, s.nbuckets)})
	si := int32(len(p.sigList))
	eligible := make([]int32, 0, len(p.idx.nodes))
	for gi := range p.idx.nodes {
		n := &p.idx.nodes[gi]
		if n.sched {
			if r, _ := p.allowed(g, n); r == okNode {
				eligible = append(eligible, int32(gi))
			}
		}
	}
	// Size everything once: a signature can be as large as the cluster.
	m := len(eligible)
	s.nodes = eligible
	s.nodeDC, s.nodeRack, s.bucket = make([]int32, 0, m), make([]int32, 0, m), make([]int32, 0, m)
	for lv := range s.pos {
		s.pos[lv] = make([]int32, 0, m)
	}
	s.doms[0].bk[s.nbuckets-1] = make([]int32, 0, m)
	if p.sigRefs == nil {
		p.sigRefs = make([]sigRef, 0, m)
	}
	for _, gi := range eligible {
		n := &p.idx.nodes[gi]
		if s.dcDom[n.dc] < 0 {
			s.dcDom[n.dc] = int32(len(s.doms))
			s.doms[0].dcs = append(s.doms[0].dcs, int32(len(s.doms)))
			s.doms = append(s.doms, domain{name: p.idx.dcs[n.dc], bk: make([][]int32, s.nbuckets)})
		}
		if s.rackDom[n.rack] < 0 {
			d := int32(len(s.doms))
			s.rackDom[n.rack] = d
			s.doms[0].racks = append(s.doms[0].racks, d)
			dc := &s.doms[s.dcDom[n.dc]]
			dc.racks = append(dc.racks, d)
			s.doms = append(s.doms, domain{name: p.idx.racks[n.rack], bk: make([][]int32, s.nbuckets)})
		}
		local := int32(len(s.nodeDC))
		s.nodeDC = append(s.nodeDC, s.dcDom[n.dc])
		s.nodeRack = append(s.nodeRack, s.rackDom[n.rack])
		b := bucketOf(n.freeNew(), s.nbuckets)
		s.bucket = append(s.bucket, b)
		free := int64(max(n.freeNew(), 0))
		for lv, d := range [3]int32{0, s.dcDom[n.dc], s.rackDom[n.rack]} {
			dom := &s.doms[d]
			s.pos[lv] = append(s.pos[lv], int32(len(dom.bk[b])))
			dom.bk[b] = append(dom.bk[b], local)
			dom.free += free
		}
		p.sigRefs = append(p.sigRefs, sigRef{sig: si, local: local, next: p.sigHead[gi]})
		p.sigHead[gi] = int32(len(p.sigRefs) - 1)
	}
	p.sigs[g.sigKey] = s
	p.sigList = append(p.sigList, s)
	g.sig = s
	return s
}

// updateSigs moves node n between buckets of every signature it is in, after its free
// slots changed from old.
func (p *planner) updateSigs(n int32, old int) {
	now := p.idx.nodes[n].freeNew()
	delta := int64(max(now, 0) - max(old, 0))
	for r := p.sigHead[n]; r >= 0; r = p.sigRefs[r].next {
		ref := p.sigRefs[r]
		s := p.sigList[ref.sig]
		l := ref.local
		ob, nb := s.bucket[l], bucketOf(now, s.nbuckets)
		for lv, d := range [3]int32{0, s.nodeDC[l], s.nodeRack[l]} {
			dom := &s.doms[d]
			dom.free += delta
			if ob == nb {
				continue
			}
			sl := dom.bk[ob]
			i := s.pos[lv][l]
			last := sl[len(sl)-1]
			sl[i] = last
			s.pos[lv][last] = i
			dom.bk[ob] = sl[:len(sl)-1]
			s.pos[lv][l] = int32(len(dom.bk[nb]))
			dom.bk[nb] = append(dom.bk[nb], l)
		}
		s.bucket[l] = nb
	}
}
