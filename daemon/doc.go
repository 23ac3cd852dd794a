// Package daemon builds stormdock's running processes the one way every command starts
// them: masters, node agents with their drivers and health checks, and whole local clusters.
package daemon
