// Package healthcheck decides how many worker slots a node's agent may offer: it throttles
// slots under memory pressure with hysteresis, runs operator health scripts, and evicts.
//
// The agent embeds one Monitor. Every --health-interval it probes /proc and the workers'
// parent cgroup (v1 or v2; a limit on the parent counts as the node's memory), feeds the
// Throttle state machine (withhold slots step by step from --mem-high, all of them and evict
// from --mem-critical, release only after --throttle-hold below --mem-low), merges the
// verdicts of the scripts in --health-dir, and publishes each change of NodeState on a
// channel so the agent can advertise it at once.
package healthcheck
