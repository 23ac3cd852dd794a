package placement

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/stormdock/stormdock/cluster"
)

// Input is everything a plan depends on.
type Input struct {
	// Nodes is the cluster snapshot. A node of Current that is missing here is lost.
	Nodes []cluster.Node
	// Jobs are the desired jobs. Workers of Current whose job is missing are stopped.
	Jobs []cluster.JobSpec
	// Current is where workers run now.
	Current []cluster.Placement
	// Avoid lists, by job, nodes the job's workers must not use: the master notes a node
	// where a worker of the job kept crashing. Workers already there move off.
	Avoid map[string][]string
	// Hold keeps workers from getting a new node in this plan, with the reason to report
	// for them; a held worker keeps a current node that is still valid. The master holds
	// the displaced workers of a job that cannot move whole (data-center failover).
	Hold map[cluster.WorkerKey]string `json:"-"`
}

// Result is a plan. Every list is sorted by job, link, then worker index.
type Result struct {
	// Placements is where every placed worker runs after the plan, kept or new.
	Placements []cluster.Placement `json:"placements"`
	// Unplaced lists the workers that no node can take, with the reason.
	Unplaced []Unplaced `json:"unplaced"`
	// Moves lists the workers of Current whose node changes.
	Moves []Move `json:"moves"`
}

// Unplaced is a worker that no node can take.
type Unplaced struct {
	Job    string `json:"job"`
	Worker int    `json:"worker"`
	Link   string `json:"link,omitempty"`
	// Reason counts why the nodes were rejected, like
	// "0 of 400 nodes fit: dc not allowed (200), no free slot (150)".
	Reason string `json:"reason"`
	// Why is Reason check by check, when the placement engine found no node (nil when the
	// worker was held, or left unplaced by its master for a reason of its own).
	Why *Explanation `json:"-"`
}

// Move is a worker of the current assignment whose node changes. To == "" means the worker
// is stopped. From is never empty: a worker that did not run before is a new placement,
// not a move.
type Move struct {
	Job    string `json:"job"`
	Worker int    `json:"worker"`
	Link   string `json:"link,omitempty"`
	From   string `json:"from"`
	To     string `json:"to"`
	// Reason says why the worker left From: "node lost", "node draining", "scaled in",
	// "preempted by job X of tenant T (priority 100 over 10)", ...
	Reason string `json:"reason,omitempty"`
}

// Key returns the worker the unplaced entry is for.
func (u Unplaced) Key() cluster.WorkerKey {
	return cluster.WorkerKey{Job: u.Job, Link: u.Link, Worker: u.Worker}
}

// Key returns the worker that moves.
func (m Move) Key() cluster.WorkerKey {
	return cluster.WorkerKey{Job: m.Job, Link: m.Link, Worker: m.Worker}
}

// Plan computes where every worker goes. It fails only on input that has no single
// meaning: two nodes or two jobs with one name, or one worker placed twice in Current.
func Plan(in Input) (*Result, error) {
	p, err := newPlanner(in)
	if err != nil {
		return nil, err
	}
	if err := p.resolveCurrent(in.Current); err != nil {
		return nil, err
	}
	p.keep()
	p.placeAll()
	return p.result(), nil
}

// wref names one worker inside the planner: a group and an index.
type wref struct{ g, w int32 }

// group is the unit of placement and spread: a job, or one link of a mirrored job.
type group struct {
	job        *cluster.JobSpec
	idx        int32 // position in planner.groups (priority order)
	link       string
	prio       int
	mem, cpu   int64
	maxPerNode int
	spreadDC   bool
	spreadRack bool
	spreadNode bool
	binpack    bool
	labelKeys  []string // sorted
	allowedDC  []bool   // by global dc index; nil: every dc
	ownPool    bool     // the tenant owns pool nodes, so it may use only those
	sigKey     string

	cur      []int32 // current node per worker: -1 none, lostNode when the node is gone
	nodeOf   []int32 // planned node per worker, -1 unplaced
	pending  []int32 // workers waiting for a node, ascending
	unplaced []int32
	held     []int32 // workers Hold kept from a new node
	avoid    map[string]bool
	placed   int
	sig      *signature
}

const lostNode = -2

type planner struct {
	idx    index
	groups []*group
	jobs   map[string][]*group // job name -> its groups, in link order

	sigs    map[string]*signature
	sigList []*signature
	sigHead []int32 // per node: first sigRef, -1 none
	sigRefs []sigRef

	nodeCount    []int32 // per node: workers of the group being placed (scratch)
	scratch      gstate  // reused by each group in turn
	byNode       [][]wref
	placedByPrio []int // placed workers per (clamped) priority, for preemption

	displaced map[wref]string // why a current worker left its node
	lostFrom  map[wref]string // node id of workers whose node is gone
	removed   []Move          // workers of Current that no longer exist
	hold      map[cluster.WorkerKey]string
}

func newPlanner(in Input) (*planner, error) {
	idx, err := buildIndex(in.Nodes)
	if err != nil {
		return nil, err
	}
	p := &planner{
		idx:          idx,
		jobs:         make(map[string][]*group, len(in.Jobs)),
		sigs:         map[string]*signature{},
		sigHead:      make([]int32, len(idx.nodes)),
		nodeCount:    make([]int32, len(idx.nodes)),
		placedByPrio: make([]int, cluster.MaxPriority+1),
		displaced:    map[wref]string{},
		lostFrom:     map[wref]string{},
		hold:         in.Hold,
	}
	for i := range p.sigHead {
		p.sigHead[i] = -1
	}
	jobs := make([]*cluster.JobSpec, len(in.Jobs))
	var errs []error
	for i := range in.Jobs {
		j := &in.Jobs[i]
		jobs[i] = j
		if _, dup := p.jobs[j.Name]; dup {
			errs = append(errs, fmt.Errorf("job %q is given twice", j.Name))
		}
		p.jobs[j.Name] = nil
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	slices.SortFunc(jobs, func(a, b *cluster.JobSpec) int {
		if c := cmp.Compare(b.Priority, a.Priority); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	for _, j := range jobs {
		links := j.Links
		if len(links) == 0 {
			links = []string{""}
		}
		for _, l := range links {
			g := p.newGroup(j, l, in.Avoid[j.Name])
			p.groups = append(p.groups, g)
			p.jobs[j.Name] = append(p.jobs[j.Name], g)
		}
	}
	return p, nil
}

func (p *planner) newGroup(j *cluster.JobSpec, link string, avoid []string) *group {
	n := max(j.Workers, 0)
	g := &group{
		job: j, idx: int32(len(p.groups)), link: link, prio: j.Priority,
		mem: int64(j.Resources.Memory), cpu: int64(j.Resources.CPU),
		maxPerNode: j.Placement.MaxPerNode,
		binpack:    j.StrategyName() == cluster.StrategyBinpack,
		ownPool:    p.idx.owners[j.Tenant],
		cur:        make([]int32, n),
		nodeOf:     make([]int32, n),
	}
	for i := range n {
		g.cur[i], g.nodeOf[i] = -1, -1
	}
	for _, d := range j.Placement.Spread {
		switch d {
		case cluster.DomainDC:
			g.spreadDC = true
		case cluster.DomainRack:
			g.spreadRack = true
		case cluster.DomainNode:
			g.spreadNode = true
		}
	}
	for k := range j.Placement.NodeLabels {
		g.labelKeys = append(g.labelKeys, k)
	}
	if len(avoid) > 0 {
		g.avoid = make(map[string]bool, len(avoid))
		for _, id := range avoid {
			g.avoid[id] = true
		}
	}
	slices.Sort(g.labelKeys)
	switch {
	case link != "":
		g.allowedDC = make([]bool, len(p.idx.dcs))
		if d, ok := p.idx.dcIndex(link); ok {
			g.allowedDC[d] = true
		}
	case len(j.Placement.DCs) > 0:
		g.allowedDC = make([]bool, len(p.idx.dcs))
		for _, dc := range j.Placement.DCs {
			if d, ok := p.idx.dcIndex(dc); ok {
				g.allowedDC[d] = true
			}
		}
	}
	g.sigKey = p.sigKeyOf(g)
	return g
}

// placeAll gives a node to every pending worker, group by group in priority order.
//
// One pass is enough. When a worker of group X fits nowhere, even by preemption, then on
// every node free+lower < demand, where lower is what workers of lower priority than X
// hold. Nothing later raises free+lower on any node: later placements are of priority at
// most X's, and a preemption evicts workers of lower priority than the preemptor, so at
// most X's, which moves capacity from lower to free. So X would still fit nowhere at the
// end, and no worker left unplaced could have been placed on capacity freed later.
func (p *planner) placeAll() {
	for _, g := range p.groups {
		if len(g.pending) > 0 {
			p.placeGroup(g)
		}
	}
}

// commit puts worker w of g on node n. st, when not nil, is g's placement state.
func (p *planner) commit(g *group, w int32, n int32, st *gstate) {
	ns := &p.idx.nodes[n]
	old := ns.freeNew()
	ns.slots++
	ns.usedMem += g.mem
	ns.usedCPU += g.cpu
	g.nodeOf[w] = n
	g.placed++
	p.placedByPrio[clampPrio(g.prio)]++
	if p.byNode != nil {
		p.byNode[n] = append(p.byNode[n], wref{g.idx, w})
	}
	if st != nil {
		st.add(n, 1)
	}
	p.updateSigs(n, old)
}

// evict takes worker w of g off its node.
func (p *planner) evict(g *group, w int32) {
	n := g.nodeOf[w]
	ns := &p.idx.nodes[n]
	old := ns.freeNew()
	ns.slots--
	ns.usedMem -= g.mem
	ns.usedCPU -= g.cpu
	g.nodeOf[w] = -1
	g.placed--
	p.placedByPrio[clampPrio(g.prio)]--
	if p.byNode != nil {
		refs := p.byNode[n]
		i := slices.Index(refs, wref{g.idx, w})
		p.byNode[n] = slices.Delete(refs, i, i+1)
	}
	p.updateSigs(n, old)
}

func clampPrio(v int) int { return min(max(v, 0), cluster.MaxPriority) }

// result writes the plan out, sorted by job, link and worker.
func (p *planner) result() *Result {
	order := slices.Clone(p.groups)
	slices.SortFunc(order, func(a, b *group) int {
		if c := cmp.Compare(a.job.Name, b.job.Name); c != 0 {
			return c
		}
		return cmp.Compare(a.link, b.link)
	})
	total := 0
	for _, g := range order {
		total += g.placed
	}
	r := &Result{Placements: make([]cluster.Placement, total), Unplaced: []Unplaced{}}
	i := 0
	for _, g := range order {
		for w, n := range g.nodeOf {
			if n >= 0 {
				// Field by field: appending whole structs costs a bulk write barrier each
				// while the collector runs, which it does while a million are written.
				pl := &r.Placements[i]
				pl.Job, pl.Worker, pl.Node = g.job.Name, w, p.idx.nodes[n].id
				if g.link != "" {
					pl.Link = g.link
				}
				i++
			}
		}
		for _, w := range g.held {
			r.Unplaced = append(r.Unplaced, Unplaced{Job: g.job.Name, Worker: int(w), Link: g.link,
				Reason: p.hold[cluster.WorkerKey{Job: g.job.Name, Link: g.link, Worker: int(w)}]})
		}
		if len(g.unplaced) == 0 {
			sortUnplaced(r.Unplaced)
			continue
		}
		why := p.explain(g)
		reason := why.String()
		slices.Sort(g.unplaced)
		for _, w := range g.unplaced {
			r.Unplaced = append(r.Unplaced, Unplaced{Job: g.job.Name, Worker: int(w), Link: g.link, Reason: reason, Why: why})
		}
	}
	r.Moves = p.moves(order)
	return r
}

// sortUnplaced orders a job's held and unplaced workers together by worker index; groups
// are appended in order, so only the tail of one group can be out of order.
func sortUnplaced(u []Unplaced) {
	slices.SortStableFunc(u, func(a, b Unplaced) int {
		if c := cmp.Compare(a.Job, b.Job); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Link, b.Link); c != 0 {
			return c
		}
		return cmp.Compare(a.Worker, b.Worker)
	})
}
