// Package api is the wire contract of a stormdock master: the HTTP client, every request
// and response type, the error body, and the one table from errors to statuses to exit codes.
package api
