// Package provision creates, scales and destroys whole stormdock clusters (a master and N
// agents) on resources a platform team already runs: Docker hosts or a Nomad cluster.
//
// A Provider does the work for one kind of resource (see provision/docker and
// provision/nomad); this package holds what they share: the cluster spec and its node
// layout, the admin token handed to the operator, and the drain that precedes a scale-in.
package provision
