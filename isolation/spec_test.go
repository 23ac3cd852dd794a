package isolation

import (
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func valid() Spec {
	return Spec{ID: "wc-0", Job: "wc", Tenant: "search", Worker: 3, Node: "n1", Command: []string{"/stormdock", "worker"}, MemoryBytes: 64 * MiB, MilliCPU: 500}
}

func TestValidate(t *testing.T) {
	if err := valid().Validate(); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	for name, tc := range map[string]struct {
		edit func(*Spec)
		says string
	}{
		"bad id":         {func(s *Spec) { s.ID = "../etc" }, "must match"},
		"empty id":       {func(s *Spec) { s.ID = "" }, "must match"},
		"no command":     {func(s *Spec) { s.Command = nil }, "no command"},
		"no memory":      {func(s *Spec) { s.MemoryBytes = 0 }, "no memory limit"},
		"tiny memory":    {func(s *Spec) { s.MemoryBytes = 3 * MiB }, "at least 4Mi"},
		"tiny cpu":       {func(s *Spec) { s.MilliCPU = 5 }, "at least 0.01"},
		"negative pids":  {func(s *Spec) { s.Pids = -1 }, "negative"},
		"relative mount": {func(s *Spec) { s.Mounts = []Mount{{Source: "lease", Target: "/lease"}} }, "absolute"},
	} {
		s := valid()
		tc.edit(&s)
		err := s.Validate()
		if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), tc.says) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want a one-line ErrInvalidSpec saying %q", name, err, tc.says)
		}
	}
}

func TestEnviron(t *testing.T) {
	s := valid()
	s.Env = map[string]string{"STORMDOCK_JOB": "spoofed", "STORMDOCK_DC": "dc-a", "A": "1"}
	got := s.Environ()
	want := []string{"A=1", "STORMDOCK_DC=dc-a", "STORMDOCK_JOB=wc", "STORMDOCK_NODE=n1", "STORMDOCK_TENANT=search", "STORMDOCK_WORKER=3"}
	if !slices.Equal(got, want) {
		t.Fatalf("Environ = %v, want %v", got, want)
	}
	if s.Env["STORMDOCK_JOB"] != "spoofed" {
		t.Fatalf("Environ changed the spec's map")
	}
}

func TestDefaultsAndFormat(t *testing.T) {
	s := valid()
	if s.PidsLimit() != DefaultPids || s.GracePeriod() != DefaultGrace || s.LogLimit() != DefaultLogMaxBytes {
		t.Fatalf("defaults: %d %v %d", s.PidsLimit(), s.GracePeriod(), s.LogLimit())
	}
	for n, want := range map[int64]string{64 * MiB: "64Mi", 2 << 30: "2Gi", 1536: "1536", 3 << 10: "3Ki"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %s, want %s", n, got, want)
		}
	}
	if got := (Exit{Code: 137, Signal: 9, OOMKilled: true}).String(); !strings.Contains(got, "OOM") || !strings.Contains(got, "signal 9") {
		t.Errorf("exit string %q", got)
	}
	if (Limits{CPUQuota: 50e6, CPUPeriod: 100e6}).MilliCPU() != 500 {
		t.Errorf("MilliCPU of half a period")
	}
}

// FuzzSpecID: the hand-written worker id check accepts exactly the ids of its rule.
func FuzzSpecID(f *testing.F) {
	re := regexp.MustCompile(idRule)
	for _, s := range []string{"", "a", "n1.wc.0", "_a", "a_", "A-b.c_d", strings.Repeat("a", 100), strings.Repeat("a", 101), "a/b", "a\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if got, want := validID(id), re.MatchString(id); got != want {
			t.Fatalf("validID(%q) = %v, the rule says %v", id, got, want)
		}
	})
}
