// Package docs holds stormdock's manual, the markdown files beside this one, and what keeps
// it true: cli.md is rendered from the CLI's own command tree, and the tests run every command
// of getting-started.md against a local cluster.
package docs

//go:generate go run ./cligen -o cli.md
