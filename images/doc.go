// Package images builds, lists and prunes stormdock worker images through the Docker API.
// Images are FROM scratch around static binaries, so nothing is ever pulled from a registry.
package images
