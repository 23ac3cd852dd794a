// Package master is the stormdock master: it elects one active master through the store,
// turns desired jobs and live nodes into per-node assignments, and serves the HTTP API.
package master
