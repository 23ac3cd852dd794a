package master_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation/docker"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/httpapi"
)

// TestImagePinning: a docker job's tag is resolved to its digest at submit and its workers
// are assigned that digest, also after the tag moves and the job scales; a job submitted
// while the registry is down is accepted unpinned, with the reason, and pinned by the leader
// once the registry answers again.
func TestImagePinning(t *testing.T) {
	testenv.DockerSocket(t)
	srv := testenv.StartRegistry(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cli, err := docker.Connect(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	hog := testenv.BuildBinary(t, "./isolation/testdata/hog")
	tag := fmt.Sprintf("%s/stormdock-test/sched-%d:1", srv.Addr, os.Getpid())
	ims := images.New(cli)
	push := func(variant string) string {
		t.Helper()
		img, err := ims.Build(ctx, images.BuildOptions{Tag: tag, Binary: hog, Labels: map[string]string{"io.stormdock.test.variant": variant}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ims.Remove(context.Background(), img.ID) })
		dgst, err := ims.Push(ctx, tag, images.Progress{})
		if err != nil {
			t.Fatal(err)
		}
		r, _ := images.ParseRef(tag)
		pinned, _ := r.WithDigest(dgst)
		return pinned
	}
	first := push("sched-1")

	tc := clustertest.NewSim(t)
	m, _, _ := tc.Master("m1", func(c *master.Config) { c.PinRetry = 100 * time.Millisecond })
	for _, n := range clustertest.Nodes(1, 1, 2) {
		n.Labels = map[string]string{"isolation/docker": "true"}
		tc.Node(n)
	}
	testenv.Eventually(t, "the master sees 2 nodes", 5*time.Second, func() bool { return len(m.MirrorView().Nodes()) == 2 })
	hs := httptest.NewServer(httpapi.New(m, httpapi.Config{}))
	defer hs.Close()
	token := api.NewToken()
	if _, err := tc.Admin.Create(ctx, cluster.AdminTokenKey, []byte(api.HashToken(token)), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	cl, _ := api.NewClient(hs.URL, token)
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "search"}); err != nil {
		t.Fatal(err)
	}
	spec := func(name string, workers int) []byte {
		return fmt.Appendf(nil, "name: %s\ntenant: search\nworkers: %d\nisolation: docker\nimage: %s\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [/job, term]\n", name, workers, tag)
	}

	rec, err := cl.SubmitJob(ctx, spec("wc", 2))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Image == nil || rec.Image.Ref != first || rec.Image.Generation != 1 || rec.Image.Error != "" {
		t.Fatalf("pin at submit = %+v; want %s for generation 1", rec.Image, first)
	}
	waitPinned(t, tc, "wc", 2, first)

	// The tag moves; the job scales: every worker, new ones included, keeps the pinned bytes.
	second := push("sched-2")
	if _, err := cl.ScaleJob(ctx, "wc", 4); err != nil {
		t.Fatal(err)
	}
	waitPinned(t, tc, "wc", 4, first)
	if st, err := cl.Job(ctx, "wc"); err != nil || st.Job.Image == nil || st.Job.Image.Ref != first {
		t.Fatalf("job status image = %+v, %v; want %s", st.Job.Image, err, first)
	}

	// Registry down at submit: accepted unpinned with the reason; pinned once it is back.
	srv.Stop()
	rec, err = cl.SubmitJob(ctx, spec("late", 1))
	if err != nil {
		t.Fatalf("submit with the registry down: %v", err)
	}
	if rec.Image == nil || rec.Image.Ref != "" || !strings.Contains(rec.Image.Error, "registry "+srv.Addr+" refused") {
		t.Fatalf("pin with the registry down = %+v; want no ref and the registry's refusal", rec.Image)
	}
	waitPinned(t, tc, "late", 1, "")
	srv.Start()
	waitPinned(t, tc, "late", 1, second)
	if st, err := cl.Job(ctx, "late"); err != nil || st.Job.Image.Ref != second || st.Job.Image.Error != "" {
		t.Fatalf("late job's image = %+v, %v; want %s", st.Job.Image, err, second)
	}
}

// waitPinned waits until job has n workers assigned, each with Pinned == pinned.
func waitPinned(t *testing.T, tc *clustertest.Sim, job string, n int, pinned string) {
	t.Helper()
	testenv.EventuallyWith(t, fmt.Sprintf("%d workers of %s assigned %q", n, job, pinned), 10*time.Second, func() (bool, string) {
		names, err := tc.Admin.Children(tc.Ctx, cluster.AssignmentsKey)
		if err != nil {
			return false, err.Error()
		}
		got := 0
		for _, name := range names {
			key, _ := cluster.AssignmentKey(name)
			e, err := tc.Admin.Get(tc.Ctx, key)
			if err != nil {
				continue
			}
			var a cluster.NodeAssignment
			_ = json.Unmarshal(e.Value, &a)
			for _, w := range a.Workers {
				if w.Key.Job != job {
					continue
				}
				if w.Pinned != pinned {
					return false, fmt.Sprintf("worker %s pinned %q", w.Key, w.Pinned)
				}
				got++
			}
		}
		return got == n, fmt.Sprintf("%d assigned", got)
	})
}
