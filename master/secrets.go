package master

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/keyring"
	"github.com/stormdock/stormdock/master/desired"
)

// Tenant secrets, the master's side: the masters mirror every tenant's secret index (names
// and versions, never values) so that a worker's assignment names the versions of its
// secrets, and a new version reaches it live; the leader hands a node the values of its
// workers' secrets, opened with the keyring only masters hold, sealed to the node (see
// api/nodeauth.go).

// Keyring is the masters' keyring as its file holds it now; nil (and no error) when this
// master was given none: secrets are off.
func (m *Master) Keyring() (*keyring.Keyring, error) {
	if m.cfg.Keyring == nil {
		return nil, nil
	}
	return m.cfg.Keyring.Ring()
}

// CheckSecrets refuses, as bad input, a spec that names secrets on a master that holds no
// keyring: its workers could never get them.
func (m *Master) CheckSecrets(spec *cluster.JobSpec) error {
	if m.cfg.Keyring == nil && (len(spec.Secrets) > 0 || spec.OutputSecret != "") {
		return fmt.Errorf("%w: job %s names secrets, but %w", api.ErrBadInput, spec.Name, desired.ErrSecretsOff)
	}
	return nil
}

// secretVersions is a tenant's secrets as the mirror decodes its index: versions by name.
type secretVersions map[string]int64

// secretsDecoder decodes a tenant's secret index for the mirror; the digest changes with
// a name or a version, so that the index rewritten as it was (a submit's guard against a
// concurrent delete) wakes no reconcile.
func secretsDecoder(_ string, value []byte) (any, uint64) {
	idx, err := desired.DecodeSecretIndex(value)
	if err != nil {
		return nil, 0
	}
	out := make(secretVersions, len(idx.Secrets))
	h := fnv.New64a()
	for _, name := range slices.Sorted(maps.Keys(idx.Secrets)) {
		out[name] = idx.Secrets[name].Version
		fmt.Fprintf(h, "%s=%d;", name, out[name])
	}
	return out, h.Sum64()
}

// setSecrets notes every tenant's secret versions from the mirror.
func (v *View) setSecrets(decoded map[string]decodedValue) {
	v.secrets = make(map[string]secretVersions, len(decoded))
	for tenant, d := range decoded {
		if sv, ok := d.v.(secretVersions); ok {
			v.secrets[tenant] = sv
		}
	}
}

// secretRefs are the refs of the tenant's secrets named, with the versions the view knows
// (0 for one the tenant lacks: its worker waits, saying so).
func (v *View) secretRefs(tenant string, names []string) []cluster.SecretRef {
	if len(names) == 0 {
		return nil
	}
	out := make([]cluster.SecretRef, len(names))
	for i, n := range names {
		out[i] = cluster.SecretRef{Name: n, Version: v.secrets[tenant][n]}
	}
	return out
}

// refNames lists the names of refs.
func refNames(refs []cluster.SecretRef) []string {
	var out []string
	for _, r := range refs {
		out = append(out, r.Name)
	}
	return out
}

// checkKeyring compares this master's keyring with the check values other masters left in
// the store: a key id this keyring holds with another key is refused at start (secrets
// sealed by one master would not open on the other), and the ids the store has no check
// for yet get this keyring's.
func (m *Master) checkKeyring(ctx context.Context) error {
	ring, err := m.Keyring()
	if err != nil || ring == nil {
		return err
	}
	var mismatch error
	_, err = coord.Update(ctx, m.store, cluster.SecretsKeyringKey, func(cur []byte, exists bool) ([]byte, error) {
		var kc cluster.KeyringChecks
		if exists && len(cur) > 0 {
			if err := json.Unmarshal(cur, &kc); err != nil {
				return nil, fmt.Errorf("read %s: %w", cluster.SecretsKeyringKey, err)
			}
		}
		if kc.Checks == nil {
			kc.Checks = map[string][]byte{}
		}
		added := false
		for _, id := range ring.IDs() {
			c, ok := kc.Checks[id]
			if !ok {
				kc.Checks[id] = ring.Check(id)
				added = true
				continue
			}
			if err := ring.Verify(id, c); err != nil {
				mismatch = fmt.Errorf("--secrets-key %s: %w", m.cfg.Keyring.Path(), err)
				return nil, mismatch
			}
		}
		if !added {
			return nil, errNoChange
		}
		return json.Marshal(kc)
	})
	if errors.Is(err, errNoChange) {
		return nil
	}
	if mismatch != nil {
		return mismatch
	}
	if err != nil {
		return fmt.Errorf("master: check the secrets keyring: %w", err)
	}
	return nil
}

var errNoChange = errors.New("no change")

// ErrNotLeader: a request only the leading master answers came to another.
var ErrNotLeader = errors.New("not the leading master")

// NodeSecrets answers a node's request for its workers' secrets (api.NodeSecretsRequest in
// body, signed in auth): the node's signature is checked with the key in its live record,
// each worker must be in the node's assignment as this leader wrote it last, and gets the
// secrets that assignment names (the tenant's own: the job was checked at submit). It
// returns the sealed reply, which only the node opens. The values are cleared once sealed.
func (m *Master) NodeSecrets(ctx context.Context, node string, body []byte, auth string) (sealed []byte, names int, err error) {
	d, ok := m.nodes.decodedOne(node)
	rec, isRec := d.v.(cluster.NodeRecord)
	if !ok || !isRec {
		return nil, 0, fmt.Errorf("%w: no live node %s", api.ErrUnauthorized, node)
	}
	if rec.Identity == nil {
		return nil, 0, fmt.Errorf("%w: node %s published no identity key (an agent from before secrets): upgrade it", api.ErrUnauthorized, node)
	}
	if err := api.VerifyNodeRequest(rec.Identity.Sign, "POST", api.NodeSecretsPath(node), body, auth, time.Now()); err != nil {
		return nil, 0, fmt.Errorf("%w: node %s: %v", api.ErrUnauthorized, node, err)
	}
	var req api.NodeSecretsRequest
	if err := json.Unmarshal(body, &req); err != nil || req.Node != node {
		return nil, 0, fmt.Errorf("%w: a secrets request of node %s must name it and its workers", api.ErrBadInput, node)
	}
	if len(req.Workers) > 4096 || len(req.RegistryAuth) > 4096 {
		return nil, 0, fmt.Errorf("%w: %d workers and %d tenants in one request, over 4096", api.ErrBadInput, len(req.Workers), len(req.RegistryAuth))
	}
	if !m.Leader() {
		return nil, 0, fmt.Errorf("%w: %w: ask the one the store names (%s)", api.ErrNotReady, ErrNotLeader, cluster.MasterKey)
	}
	na, err := m.awaitAssignment(ctx, node, d.owner, func(na cluster.NodeAssignment) bool {
		return holdsAll(na, req.Workers) && len(tenantsMissing(na, req.RegistryAuth)) == 0
	})
	if err != nil {
		return nil, 0, err
	}
	ring, err := m.Keyring()
	if err != nil {
		return nil, 0, fmt.Errorf("%w: the masters' keyring: %v", api.ErrInternal, err)
	}
	assigned := make(map[cluster.WorkerKey]cluster.WorkerAssignment, len(na.Workers))
	for _, w := range na.Workers {
		if !w.Stop {
			assigned[w.Key] = w
		}
	}
	out := api.NodeSecrets{Workers: make([]api.WorkerSecrets, 0, len(req.Workers))}
	defer out.Wipe()
	for _, k := range req.Workers {
		ws := api.WorkerSecrets{Key: k}
		wa, ok := assigned[k]
		switch {
		case !ok:
			ws.Error = fmt.Sprintf("worker %s is not assigned to node %s (yet)", k, node)
		case ring == nil && len(wa.Secrets) > 0:
			ws.Error = desired.ErrSecretsOff.Error()
		default:
			for _, ref := range wa.Secrets {
				v, version, err := desired.OpenSecret(ctx, m.store, ring, wa.Tenant, ref.Name)
				if err != nil {
					ws.Error = err.Error()
					break
				}
				ws.Secrets = append(ws.Secrets, api.SecretValue{Name: ref.Name, Version: version, Value: v})
				names++
			}
			if ws.Error != "" {
				for _, s := range ws.Secrets {
					clear(s.Value)
				}
				ws.Secrets = nil
			}
		}
		out.Workers = append(out.Workers, ws)
	}
	missing := tenantsMissing(na, req.RegistryAuth)
	for _, tenant := range req.RegistryAuth {
		ra := api.TenantRegistryAuth{Tenant: tenant}
		switch {
		case slices.Contains(missing, tenant):
			ra.Error = fmt.Sprintf("node %s runs no worker and pulls no image of tenant %s", node, tenant)
		default:
			auth, err := desired.TenantRegistryAuth(ctx, m.store, ring, tenant)
			if err != nil {
				ra.Error = err.Error()
			} else if auth != nil {
				ra.Config = auth.Marshal()
				names++
			}
		}
		out.RegistryAuth = append(out.RegistryAuth, ra)
	}
	plain, err := json.Marshal(out)
	if err != nil {
		return nil, 0, err
	}
	defer clear(plain)
	sealed, err = api.SealForNode(rec.Identity.Seal, node, body, plain)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %v", api.ErrInternal, err)
	}
	return sealed, names, nil
}

// assignWait bounds how long a secrets request waits for the leader to publish the
// assignment the node acts on: the leader writes assignments, then publishes them, so a
// fast agent may ask in between.
const assignWait = 3 * time.Second

// awaitAssignment returns the node's assignment as the leader published it, for the node's
// session owner, waiting up to assignWait for one that holds everything asked for (want).
func (m *Master) awaitAssignment(ctx context.Context, node string, owner int64, want func(cluster.NodeAssignment) bool) (cluster.NodeAssignment, error) {
	t := time.NewTimer(assignWait)
	defer t.Stop()
	for {
		st, next := m.leaderState()
		var na cluster.NodeAssignment
		ok := false
		if st != nil {
			na, ok = st.assigns[node]
			ok = ok && na.Session == owner
		}
		if ok && want(na) {
			return na, nil
		}
		select {
		case <-next:
			continue
		case <-ctx.Done():
			return na, ctx.Err()
		case <-t.C:
		}
		switch {
		case st == nil:
			return na, fmt.Errorf("%w: the leader has not assigned workers yet", api.ErrNotReady)
		case !ok:
			return na, fmt.Errorf("%w: node %s has no assignment of its current session yet", api.ErrNotReady, node)
		}
		return na, nil // what it lacks gets its error
	}
}

// tenantsMissing lists the tenants of tenants of which the node's assignment has neither a
// worker nor an image to pre-pull: the node gets no registry credentials of theirs.
func tenantsMissing(na cluster.NodeAssignment, tenants []string) []string {
	if len(tenants) == 0 {
		return nil
	}
	has := map[string]bool{}
	for _, w := range na.Workers {
		if !w.Stop {
			has[w.Tenant] = true
		}
	}
	for _, t := range na.PrepullTenants {
		has[t] = true
	}
	var out []string
	for _, t := range tenants {
		if !has[t] {
			out = append(out, t)
		}
	}
	return out
}

func holdsAll(na cluster.NodeAssignment, workers []cluster.WorkerKey) bool {
	have := make(map[cluster.WorkerKey]bool, len(na.Workers))
	for _, w := range na.Workers {
		if !w.Stop {
			have[w.Key] = true
		}
	}
	for _, k := range workers {
		if !have[k] {
			return false
		}
	}
	return true
}
