// Package clustertest starts whole stormdock clusters for tests: masters on an embedded
// store with simulated agents (agents/sim) and their HTTP API on test servers (Sim), a
// local cluster in the test's own process on the embedded store (Local), or stormdock
// processes on a ZooKeeper of the test's own, each with an admin client and waits on what
// the agents report.
//
// It is a test harness (like net/http/httptest): only tests import it.
package clustertest
