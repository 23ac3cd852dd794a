// Package images builds stormdock worker images (FROM scratch around static binaries), pushes
// and pulls them through the Docker API, pins tags to registry digests and garbage-collects them.
package images
