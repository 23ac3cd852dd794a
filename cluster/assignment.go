package cluster

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
)

// WorkerKey names one worker: the job, the link for mirrored jobs, and the index within it.
type WorkerKey struct {
	Job    string `json:"job"`
	Link   string `json:"link,omitempty"`
	Worker int    `json:"worker"`
}

// String writes the key as job/index or job@link/index.
func (k WorkerKey) String() string {
	if k.Link != "" {
		return k.Job + "@" + k.Link + "/" + strconv.Itoa(k.Worker)
	}
	return k.Job + "/" + strconv.Itoa(k.Worker)
}

// Compare orders keys by job, link, then index.
func (k WorkerKey) Compare(o WorkerKey) int {
	if c := cmp.Compare(k.Job, o.Job); c != 0 {
		return c
	}
	if c := cmp.Compare(k.Link, o.Link); c != 0 {
		return c
	}
	return cmp.Compare(k.Worker, o.Worker)
}

// Placement puts one worker on one node.
type Placement struct {
	Job    string `json:"job"`
	Worker int    `json:"worker"`
	Link   string `json:"link,omitempty"`
	Node   string `json:"node"`
}

// Key returns the worker the placement is for.
func (p Placement) Key() WorkerKey { return WorkerKey{Job: p.Job, Link: p.Link, Worker: p.Worker} }

// Assignment is where every placed worker runs.
type Assignment struct {
	Placements []Placement `json:"placements"`
}

// Check reports a worker placed twice or a placement with no node.
func (a Assignment) Check() error {
	seen := make(map[WorkerKey]bool, len(a.Placements))
	for i, p := range a.Placements {
		if p.Job == "" || p.Node == "" || p.Worker < 0 {
			return fmt.Errorf("placements[%d]: needs job, worker >= 0 and node", i)
		}
		if seen[p.Key()] {
			return fmt.Errorf("placements[%d]: worker %s placed twice", i, p.Key())
		}
		seen[p.Key()] = true
	}
	return nil
}

// SameRun reports whether two assignments of one worker run the same thing, so that a
// running worker can stay: command, image (and its pinned digest), environment but its live
// keys, resources, isolation, output, the uid, the names of its secrets and the restart
// rollout. The generation is left out:
// a new generation that changes none of these reaches a worker live.
func (a WorkerAssignment) SameRun(b WorkerAssignment) bool {
	return a.Key == b.Key && a.Tenant == b.Tenant && a.Restart == b.Restart &&
		a.Isolation == b.Isolation && a.Image == b.Image && a.Pinned == b.Pinned &&
		a.Output == b.Output && a.OutputToken == b.OutputToken && a.System == b.System && a.UID == b.UID && a.Resources == b.Resources &&
		slices.Equal(a.Command, b.Command) && maps.Equal(a.Env, b.Env) && sameSecretNames(a.Secrets, b.Secrets)
}

// sameSecretNames reports whether two workers get the same secrets, whatever their
// versions: a new version reaches a running worker live.
func sameSecretNames(a, b []SecretRef) bool {
	return slices.EqualFunc(a, b, func(x, y SecretRef) bool { return x.Name == y.Name })
}

// SameLive reports whether two assignments of one worker give it the same live
// configuration (WorkerConfig). Its secrets' versions are apart: see SameRun.
func (a WorkerAssignment) SameLive(b WorkerAssignment) bool {
	return a.Workers == b.Workers && a.Epoch == b.Epoch && a.Generation == b.Generation &&
		slices.Equal(a.Routers, b.Routers) && maps.Equal(a.LiveEnv, b.LiveEnv)
}

// RunEnv is the environment the worker starts with: Env with LiveEnv's values on top.
func (a WorkerAssignment) RunEnv() map[string]string {
	env := make(map[string]string, len(a.Env)+len(a.LiveEnv))
	maps.Copy(env, a.Env)
	maps.Copy(env, a.LiveEnv)
	return env
}
