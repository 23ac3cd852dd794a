// Package placement decides where every worker of every job runs: a pure, deterministic
// function from a cluster snapshot, job demands and the current assignment to a plan.
//
// # Semantics
//
// Plan places workers job by job, higher priority first (then by name). Mirrored jobs are
// placed link by link; each link is a separate copy confined to its data center and spread
// on its own. A worker takes one slot plus its job's memory and cpu. New work may use
// Slots - Used.Slots - Throttled slots; workers already running may stay on
// Slots - Used.Slots (throttling withholds slots from new work, it does not evict).
//
// Stability: a current placement stays where it is when the node still exists, is not
// draining, still satisfies the job's constraints (dcs, link, labels, pool, maxPerNode) and
// has room for it (checked in priority order, so an over-committed node sheds its
// lowest-priority workers). Unschedulable nodes keep their workers and take nothing new.
// Scaling in removes the workers whose index is at least the new count and moves nobody
// else: a worker restart costs a streaming job more than a temporary skew, and the skew
// bound is re-established by later placements, which always fill the emptiest domain first.
//
// Spread: for each spread level (dc, rack, node, outermost first) a worker goes to the
// sibling domain holding the fewest of its job's (or link's) workers, among domains that
// still have a node that can take it; ties go to the domain with more free slots, then to
// the first by name. Below the last spread level the strategy picks the node: spread takes
// the node with fewest of the job's workers and then the most free slots, binpack the
// fitting node with the fewest free slots.
//
// Priority: when a worker fits nowhere, it may preempt workers of strictly lower priority:
// the planner evicts, on one node, the fewest lowest-priority workers that make room. Evicted
// workers are re-placed in their own job's turn, or left unplaced. Hence a worker is left
// unplaced only when no node could take it even after evicting every lower-priority worker.
//
// Moves compare the plan with the current assignment: a Move lists every worker of Current
// whose node changes. To == "" means the worker stops (scaled in, job or link removed, or
// no room left: then it is in Unplaced too). Workers that are new (not in Current) are not
// moves; they only appear in Placements. Re-planning a plan's own output yields no moves.
package placement
