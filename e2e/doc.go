// Package e2e runs stormdock end to end: real `stormdock master` and `stormdock agent`
// processes on a real ZooKeeper, with workers in real cgroups, driven through the API.
package e2e
