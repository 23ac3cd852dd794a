// Package master is the stormdock master: it elects one active master through the store,
// turns desired jobs and live nodes into per-node assignments, and publishes the snapshot
// its HTTP API (package master/httpapi) answers from.
package master
