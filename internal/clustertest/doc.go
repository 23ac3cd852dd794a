// Package clustertest starts whole stormdock clusters for tests: a local cluster in the test's
// own process on the embedded store, or stormdock processes on a ZooKeeper of the test's own,
// each with an admin client and waits on what the agents report.
//
// It is a test harness (like net/http/httptest): only tests import it.
package clustertest
