package run

import (
	"os"
	"slices"
	"testing"

	"github.com/stormdock/stormdock/cluster"
)

// TestRunCommand: `stormdock run` treats a program named stormdock as the agent does.
func TestRunCommand(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cmd  []string
		mode string
		want []string
	}{
		{"process runs this binary", []string{"stormdock", "version"}, cluster.IsolationProcess, []string{self, "version"}},
		{"docker runs the image's copy", []string{"stormdock", "worker", "wordcount"}, cluster.IsolationDocker, []string{"/stormdock", "worker", "wordcount"}},
		{"a path is left alone", []string{"/usr/bin/stormdock", "version"}, cluster.IsolationProcess, []string{"/usr/bin/stormdock", "version"}},
		{"other programs are left alone", []string{"sleep", "stormdock"}, cluster.IsolationDocker, []string{"sleep", "stormdock"}},
		{"no command", nil, cluster.IsolationProcess, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := runCommand(tt.cmd, tt.mode); !slices.Equal(got, tt.want) {
				t.Fatalf("runCommand(%q, %s) = %q, want %q", tt.cmd, tt.mode, got, tt.want)
			}
		})
	}
}
