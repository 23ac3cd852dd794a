// Package cluster holds the types every stormdock component shares: nodes, tenants, job
// specs, workers and assignments, with their JSON and YAML forms and their validation.
package cluster
