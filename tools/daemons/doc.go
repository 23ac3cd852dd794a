// Package daemons holds the entry points of stormdock's long-running processes (master,
// agent, launch, keeper, router, and up, a local cluster): their flags, turned into the
// configurations package daemon builds the processes from.
package daemons
