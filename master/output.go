package master

import (
	"context"
	"fmt"
	"strings"

	"github.com/stormdock/stormdock/multidc"
)

// A mirrored job's link workers prove to its output router that they are its workers with
// a sender token (see package multidc): its hash is in the job record from the submit on
// (desired.SubmitJob), and the leader puts the token itself in the link workers'
// assignments.

// ensureOutputKey reads the cluster's output key once there is a mirrored job.
func (r *reconciler) ensureOutputKey(ctx context.Context, v *View) error {
	if r.outputKey != nil {
		return nil
	}
	for _, j := range v.jobs {
		if j.rec.Spec.Mirrored() {
			key, err := multidc.EnsureOutputKey(ctx, r.kv)
			if err != nil {
				return fmt.Errorf("master: %w", err)
			}
			r.outputKey = key
			return nil
		}
	}
	return nil
}

// isRouterJob reports whether a job is a mirrored job's output router: only those have a
// dot in their name, which names of submitted jobs never hold (cluster.CheckName).
func isRouterJob(name string) bool { return strings.HasSuffix(name, routerSuffix) }
