// Package examples holds the example job specs and the example streaming worker that the
// demo, the README and the tests use.
package examples

import _ "embed"

// WordcountSpec is examples/wordcount.yaml, built in so that `stormdock demo` runs from
// any directory.
//
//go:embed wordcount.yaml
var WordcountSpec []byte
