// Package desired holds the master's commands on the desired state in the store: submit,
// scale, update and kill jobs, rollout actions, tenants and their tokens, node settings and
// data center states. Each is a checked read-modify-write over coord.KV that any master (or
// tool) may run; the leader carries out what they record.
package desired
