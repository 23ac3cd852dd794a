package placement

import "github.com/stormdock/stormdock/cluster"

// MaxSkew measures how evenly placements spread each job (each link of a mirrored job):
// the largest difference in worker count between sibling domains of any spread level the
// job asks for, over domains that have a node the job may use. It is a raw measure: a
// domain that is full still counts, so a tight cluster can show a skew the planner could
// not avoid. Placements of unknown jobs or workers are ignored.
func MaxSkew(nodes []cluster.Node, jobs []cluster.JobSpec, placements []cluster.Placement) (int, error) {
	p, err := newPlanner(Input{Nodes: nodes, Jobs: jobs})
	if err != nil {
		return 0, err
	}
	for _, pl := range placements {
		n, ok := p.idx.byID[pl.Node]
		if !ok {
			continue
		}
		for _, g := range p.jobs[pl.Job] {
			if g.link == pl.Link && pl.Worker >= 0 && pl.Worker < len(g.nodeOf) {
				g.nodeOf[pl.Worker] = n
			}
		}
	}
	worst := 0
	spread := func(counts func(yield func(int32) bool)) {
		lo, hi, any := int32(0), int32(0), false
		for c := range counts {
			if !any {
				lo, hi, any = c, c, true
			}
			lo, hi = min(lo, c), max(hi, c)
		}
		worst = max(worst, int(hi-lo))
	}
	for _, g := range p.groups {
		st := p.load(g)
		s := st.s
		doms := func(ds []int32) func(func(int32) bool) {
			return func(yield func(int32) bool) {
				for _, d := range ds {
					if !yield(st.cnt[d]) {
						return
					}
				}
			}
		}
		var parents []int32 // domains whose children are compared at the next level
		if g.spreadDC {
			spread(doms(s.doms[0].dcs))
			parents = s.doms[0].dcs
		} else if len(s.nodes) > 0 {
			parents = []int32{0}
		}
		if g.spreadRack {
			var racks []int32
			for _, d := range parents {
				spread(doms(s.doms[d].racks))
				racks = append(racks, s.doms[d].racks...)
			}
			parents = racks
		}
		if g.spreadNode {
			for _, d := range parents {
				spread(func(yield func(int32) bool) {
					for _, bk := range s.doms[d].bk {
						for _, l := range bk {
							if !yield(p.nodeCount[s.nodes[l]]) {
								return
							}
						}
					}
				})
			}
		}
		st.unload()
	}
	return worst, nil
}
