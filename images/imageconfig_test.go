package images

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

// An image's own command, as Build gives it (Entrypoint, Cmd), read back from the registry
// by tag and by digest (manifest, then configuration blob, each
// checked against its digest): what the master refuses a job without a command on when
// both are empty.
func TestCommandOf(t *testing.T) {
	reg := testenv.Registry(t)
	cli := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	labels := testLabels(t)
	removeOnCleanup(t, cli, labels)
	m := New(cli)
	res := &Resolver{}
	for _, tc := range []struct {
		name             string
		entrypoint, cmd  []string
		wantEntry, wantC []string
	}{
		// The e2e tests read the default's and one with neither through the master.
		{"entrypoint and cmd", []string{StormdockPath}, []string{"worker", "<&>"}, []string{StormdockPath}, []string{"worker", "<&>"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tag := fmt.Sprintf("%s/stormdock-test/own-%d:%d", reg, os.Getpid(), time.Now().UnixNano())
			l := map[string]string{"io.stormdock.test.variant": tc.name}
			for k, v := range labels {
				l[k] = v
			}
			if _, err := m.Build(ctx, BuildOptions{Tag: tag, Binary: hog, Labels: l, Entrypoint: tc.entrypoint, Cmd: tc.cmd}); err != nil {
				t.Fatal(err)
			}
			dgst, err := m.Push(ctx, tag, Progress{})
			if err != nil {
				t.Fatal(err)
			}
			p, _ := ParseRef(tag)
			pinned, _ := p.WithDigest(dgst)
			for _, ref := range []string{tag, pinned} {
				got, err := res.CommandOf(ctx, ref, Access{Tenant: "a"})
				if err != nil {
					t.Fatalf("%s: %v", ref, err)
				}
				if !slices.Equal(got.Entrypoint, tc.wantEntry) || !slices.Equal(got.Cmd, tc.wantC) || got.Empty() != (len(tc.wantEntry)+len(tc.wantC) == 0) {
					t.Errorf("%s: %+v; want entrypoint %q, cmd %q", ref, got, tc.wantEntry, tc.wantC)
				}
			}
		})
	}
	if _, err := res.CommandOf(ctx, reg+"/stormdock-test/absent:1", Access{Tenant: "a"}); !errors.Is(err, ErrUnknown) {
		t.Errorf("command of an image the registry lacks: %v; want ErrUnknown", err)
	}
	if _, err := res.CommandOf(ctx, "stormdock-test/local:1", Access{Tenant: "a"}); !errors.Is(err, ErrNoRegistry) {
		t.Errorf("command of an image without a registry: %v; want ErrNoRegistry", err)
	}
}
