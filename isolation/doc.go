// Package isolation runs stormdock workers in isolated slots and reports how they end.
// It defines the driver contract; process (cgroups) and docker (containers) implement it.
package isolation
