// Package examples holds stormdock's example job specs and workers; this test keeps the specs
// valid.
package examples

import (
	"os"
	"testing"

	"github.com/stormdock/stormdock/cluster"
)

func TestWordcountSpec(t *testing.T) {
	b, err := os.ReadFile("wordcount.yaml")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := cluster.ParseJobSpec(b)
	if err != nil {
		t.Fatal(err)
	}
	if spec.IsolationMode() != cluster.IsolationProcess || len(spec.Command) < 3 ||
		spec.Command[0] != "stormdock" || spec.Command[1] != "worker" || spec.Command[2] != "wordcount" {
		t.Errorf("spec = %+v, want process isolation running [stormdock worker wordcount ...]", spec)
	}
}

func TestMirrorJetStreamSpec(t *testing.T) {
	b, err := os.ReadFile("mirror-jetstream.yaml")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := cluster.ParseJobSpec(b)
	if err != nil {
		t.Fatal(err)
	}
	if !spec.Mirrored() || len(spec.Command) < 5 || spec.Command[3] != "--input" {
		t.Fatalf("spec = %+v, want a mirrored job reading --input", spec)
	}
	if _, err := cluster.ParsePostgresOutput(spec.Output); err != nil {
		t.Errorf("output %s: %v", spec.Output, err)
	}
	// Its comment says the password is the output secret: one it may send to that host.
	if spec.OutputSecret == "" {
		t.Error("no outputSecret: the example's role has no password to give")
	}
	if err := cluster.CheckOutputSecretTransport(spec.Output); err != nil {
		t.Errorf("output %s with its secret: %v", spec.Output, err)
	}
}
