package desired

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/keyring"
)

// Tenant secrets in the store (see cluster/secret.go): a tenant's index (names, versions,
// sizes, who and when) and each value sealed with the masters' keyring, bound to its
// tenant, name and version, so that a sealed value moved to another tenant's or name's key,
// or put back at an older version, does not open. Set and delete write the index and the
// value in one transaction: nothing is ever half written.

// ErrSecretsOff: the masters were given no keyring (--secrets-key), so they can keep no
// secret.
var ErrSecretsOff = errors.New("secrets are off on this cluster: the operator gives every master the same --secrets-key FILE (see docs/security.md, \"Secrets\")")

// SecretAAD is what a sealed secret is bound to.
func SecretAAD(tenant, name string, version int64) []byte {
	return []byte("stormdock-secret\x00v1\x00" + tenant + "\x00" + name + "\x00" + strconv.FormatInt(version, 10))
}

// readSecretIndex reads a tenant's secret index; exists is false when it has none.
func readSecretIndex(ctx context.Context, s coord.KV, tenant string) (cluster.SecretIndex, coord.Entry, bool, error) {
	key, err := keyOf(cluster.SecretIndexKey(tenant))
	if err != nil {
		return cluster.SecretIndex{}, coord.Entry{}, false, err
	}
	e, err := s.Get(ctx, key)
	if errors.Is(err, coord.ErrNotFound) {
		return cluster.SecretIndex{Secrets: map[string]cluster.SecretMeta{}}, e, false, nil
	}
	if err != nil {
		return cluster.SecretIndex{}, e, false, fmt.Errorf("read tenant %s's secrets: %w", tenant, err)
	}
	idx, err := DecodeSecretIndex(e.Value)
	if err != nil {
		return idx, e, false, fmt.Errorf("read tenant %s's secrets: %w", tenant, err)
	}
	return idx, e, true, nil
}

// DecodeSecretIndex decodes a tenant's stored secret index.
func DecodeSecretIndex(val []byte) (cluster.SecretIndex, error) {
	var idx cluster.SecretIndex
	if err := json.Unmarshal(val, &idx); err != nil {
		return idx, err
	}
	if idx.Secrets == nil {
		idx.Secrets = map[string]cluster.SecretMeta{}
	}
	return idx, nil
}

// checkSecretName refuses a name that cannot be a secret's, as bad input.
func checkSecretName(name string) error {
	if err := cluster.CheckSecretName(name); err != nil {
		return fmt.Errorf("%w: %v", api.ErrBadInput, err)
	}
	return nil
}

// SetSecret stores value as the tenant's secret name, sealed with ring's active key: a new
// secret at version 1, or the next version of one it has. A value equal to the one stored
// changes nothing (changed is false): its workers get no new version. who is the API
// principal, kept as UpdatedBy. Errors never carry the value.
func SetSecret(ctx context.Context, s coord.KV, ring *keyring.Keyring, tenant, name string, value []byte, who string) (meta cluster.SecretMeta, changed bool, err error) {
	if ring == nil {
		return meta, false, fmt.Errorf("%w: %w", api.ErrConflict, ErrSecretsOff)
	}
	if err := checkSecretName(name); err != nil {
		return meta, false, err
	}
	switch {
	case len(value) == 0:
		return meta, false, fmt.Errorf("%w: secret %s: the value is empty (an empty file?)", api.ErrBadInput, name)
	case len(value) > cluster.MaxSecretBytes:
		return meta, false, fmt.Errorf("%w: secret %s is %d bytes, over the %d allowed", api.ErrTooLarge, name, len(value), cluster.MaxSecretBytes)
	}
	idxKey, err := keyOf(cluster.SecretIndexKey(tenant))
	if err != nil {
		return meta, false, err
	}
	valKey, err := keyOf(cluster.SecretKey(tenant, name))
	if err != nil {
		return meta, false, err
	}
	// A store made before secrets has no directory for them (masters make it at start).
	if _, err := s.Create(ctx, cluster.SecretsKey, nil, coord.Persistent); err != nil && !errors.Is(err, coord.ErrExists) {
		return meta, false, fmt.Errorf("store tenant %s's secret %s: %w", tenant, name, err)
	}
	err = coord.Retry(ctx, func() error {
		changed = false
		if _, _, err := ReadTenant(ctx, s, tenant); err != nil {
			return err
		}
		idx, ie, iexists, err := readSecretIndex(ctx, s, tenant)
		if err != nil {
			return err
		}
		old, had := idx.Secrets[name]
		ve, verr := s.Get(ctx, valKey)
		if verr != nil && !errors.Is(verr, coord.ErrNotFound) {
			return fmt.Errorf("read tenant %s's secret %s: %w", tenant, name, verr)
		}
		if had && verr == nil {
			if cur, _, err := openSealed(ring, tenant, name, ve.Value); err == nil {
				same := bytes.Equal(cur, value)
				clear(cur)
				if same {
					meta = old
					return nil
				}
			}
		}
		if !had && len(idx.Secrets) >= cluster.MaxTenantSecrets {
			return fmt.Errorf("%w: tenant %s has %d secrets, the most it may have: delete one first (`stormdock secret delete`)", api.ErrQuota, tenant, len(idx.Secrets))
		}
		now := time.Now().UTC()
		meta = cluster.SecretMeta{Version: old.Version + 1, Size: len(value), Created: old.Created, Updated: now, UpdatedBy: who}
		if !had {
			meta.Created = now
		}
		id, sealed, err := ring.Seal(value, SecretAAD(tenant, name, meta.Version))
		if err != nil {
			return err
		}
		val, _ := json.Marshal(cluster.SealedSecret{Version: meta.Version, Key: id, Sealed: sealed})
		idx.Secrets[name] = meta
		iv, _ := json.Marshal(idx)
		var ops []coord.Op
		if iexists {
			ops = append(ops, coord.PutOp(idxKey, iv, ie.Version))
		} else {
			ops = append(ops, coord.CreateOp(idxKey, iv, coord.Persistent))
		}
		if verr == nil {
			ops = append(ops, coord.PutOp(valKey, val, ve.Version))
		} else {
			ops = append(ops, coord.CreateOp(valKey, val, coord.Persistent))
		}
		if _, err := s.Txn(ctx, ops...); err != nil {
			if errors.Is(err, coord.ErrExists) || errors.Is(err, coord.ErrNotFound) {
				err = fmt.Errorf("%w: %w", coord.ErrConflict, err)
			}
			return fmt.Errorf("store tenant %s's secret %s: %w", tenant, name, err)
		}
		changed = true
		return nil
	})
	if err != nil {
		return cluster.SecretMeta{}, false, busy(err, "tenant "+tenant+"'s secrets")
	}
	return meta, changed, nil
}

// openSealed opens a stored SealedSecret of the tenant's secret name.
func openSealed(ring *keyring.Keyring, tenant, name string, stored []byte) ([]byte, cluster.SealedSecret, error) {
	var ss cluster.SealedSecret
	if err := json.Unmarshal(stored, &ss); err != nil {
		return nil, ss, fmt.Errorf("tenant %s's secret %s is not readable: %w", tenant, name, err)
	}
	v, err := ring.Open(ss.Key, ss.Sealed, SecretAAD(tenant, name, ss.Version))
	if err != nil {
		return nil, ss, fmt.Errorf("tenant %s's secret %s: %w", tenant, name, err)
	}
	return v, ss, nil
}

// OpenSecret reads and opens the tenant's secret name: its value and version. The caller
// clears the value once it is sent on.
func OpenSecret(ctx context.Context, s coord.KV, ring *keyring.Keyring, tenant, name string) ([]byte, int64, error) {
	if ring == nil {
		return nil, 0, ErrSecretsOff
	}
	key, err := keyOf(cluster.SecretKey(tenant, name))
	if err != nil {
		return nil, 0, err
	}
	e, err := s.Get(ctx, key)
	if errors.Is(err, coord.ErrNotFound) {
		return nil, 0, fmt.Errorf("%w: tenant %s has no secret %s (deleted? set it with `stormdock secret set %s %s --from-file FILE`)", api.ErrNotFound, tenant, name, tenant, name)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read tenant %s's secret %s: %w", tenant, name, err)
	}
	v, ss, err := openSealed(ring, tenant, name, e.Value)
	if err != nil {
		return nil, 0, err
	}
	return v, ss.Version, nil
}

// DeleteSecret removes the tenant's secret name, unless a job of the tenant names it (the
// job would be left with a worker that cannot start).
func DeleteSecret(ctx context.Context, s coord.KV, tenant, name string) error {
	if err := checkSecretName(name); err != nil {
		return err
	}
	idxKey, err := keyOf(cluster.SecretIndexKey(tenant))
	if err != nil {
		return err
	}
	valKey, err := keyOf(cluster.SecretKey(tenant, name))
	if err != nil {
		return err
	}
	err = coord.Retry(ctx, func() error {
		if _, _, err := ReadTenant(ctx, s, tenant); err != nil {
			return err
		}
		idx, ie, _, err := readSecretIndex(ctx, s, tenant)
		if err != nil {
			return err
		}
		if _, ok := idx.Secrets[name]; !ok {
			return fmt.Errorf("%w: tenant %s has no secret %s (see `stormdock secret list %s`)", api.ErrNotFound, tenant, name, tenant)
		}
		users, err := jobsNaming(ctx, s, tenant, name)
		if err != nil {
			return err
		}
		if len(users) > 0 {
			return fmt.Errorf("%w: tenant %s's secret %s is named by job %s: take it out of their specs (`stormdock job update`) or kill them first",
				api.ErrConflict, tenant, name, joinNames(users))
		}
		delete(idx.Secrets, name)
		iv, _ := json.Marshal(idx)
		ops := []coord.Op{coord.PutOp(idxKey, iv, ie.Version)}
		if _, err := s.Get(ctx, valKey); err == nil {
			ops = append(ops, coord.DeleteOp(valKey, coord.AnyVersion))
		}
		// The index's version check makes a submit that named the secret meanwhile (it
		// writes the index too: secretsOp) conflict: read the jobs again.
		if _, err := s.Txn(ctx, ops...); err != nil {
			if errors.Is(err, coord.ErrNotFound) {
				err = fmt.Errorf("%w: %w", coord.ErrConflict, err)
			}
			return fmt.Errorf("delete tenant %s's secret %s: %w", tenant, name, err)
		}
		return nil
	})
	return busy(err, "tenant "+tenant+"'s secrets")
}

func joinNames(names []string) string {
	const show = 5
	out := ""
	for i, n := range names {
		if i == show {
			return out + fmt.Sprintf(" and %d more", len(names)-show)
		}
		if i > 0 {
			out += ", "
		}
		out += n
	}
	return out
}

// jobsNaming lists the tenant's jobs whose spec names the secret (in secrets or as
// outputSecret).
func jobsNaming(ctx context.Context, s coord.KV, tenant, name string) ([]string, error) {
	names, err := s.Children(ctx, cluster.JobsKey)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	slices.Sort(names)
	var out []string
	for _, job := range names {
		rec, _, err := ReadJob(ctx, s, job)
		if errors.Is(err, api.ErrNotFound) || errors.Is(err, api.ErrBadInput) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if rec.Spec.Tenant == tenant && (slices.Contains(rec.Spec.Secrets, name) || rec.Spec.OutputSecret == name) {
			out = append(out, job)
		}
	}
	return out, nil
}

// ListSecrets lists the tenant's secrets, by name, without values.
func ListSecrets(ctx context.Context, s coord.KV, tenant string) ([]api.SecretView, error) {
	if _, _, err := ReadTenant(ctx, s, tenant); err != nil {
		return nil, err
	}
	idx, _, _, err := readSecretIndex(ctx, s, tenant)
	if err != nil {
		return nil, err
	}
	out := []api.SecretView{}
	for _, name := range sortedKeys(idx.Secrets) {
		m := idx.Secrets[name]
		out = append(out, api.SecretView{Tenant: tenant, Name: name, Version: m.Version, Size: m.Size,
			Created: m.Created, Updated: m.Updated, UpdatedBy: m.UpdatedBy})
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// secretsOp checks that the spec's tenant has every secret the spec names and returns the
// op that goes into the job's transaction: a write of the tenant's index as it was read,
// so that a delete of one of them meanwhile (which checks the jobs, then writes the index)
// conflicts with it. It returns nil when the spec names no secret.
func secretsOp(ctx context.Context, s coord.KV, spec *cluster.JobSpec) (coord.Op, bool, error) {
	want := spec.Secrets
	if spec.OutputSecret != "" {
		want = append(slices.Clip(want), spec.OutputSecret)
	}
	if len(want) == 0 {
		return coord.Op{}, false, nil
	}
	idx, e, exists, err := readSecretIndex(ctx, s, spec.Tenant)
	if err != nil {
		return coord.Op{}, false, err
	}
	var missing []string
	for _, n := range want {
		if _, ok := idx.Secrets[n]; !ok && !slices.Contains(missing, n) {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return coord.Op{}, false, fmt.Errorf("%w: job %s: tenant %s has no secret %s: set it with `stormdock secret set %s %s --from-file FILE` (a job names only its own tenant's secrets)",
			api.ErrBadInput, spec.Name, spec.Tenant, joinNames(missing), spec.Tenant, missing[0])
	}
	if !exists {
		return coord.Op{}, false, nil // unreachable: a name was found
	}
	key, _ := cluster.SecretIndexKey(spec.Tenant)
	return coord.PutOp(key, e.Value, e.Version), true, nil
}

// RewrapSecrets seals again, with ring's active key, every secret sealed with another one
// (same value, same version: no worker sees a change), so that an old key can then leave
// every master's keyring. It returns how many it sealed again and how many already were
// sealed with the active key.
func RewrapSecrets(ctx context.Context, s coord.KV, ring *keyring.Keyring) (rewrapped, current int, err error) {
	if ring == nil {
		return 0, 0, fmt.Errorf("%w: %w", api.ErrConflict, ErrSecretsOff)
	}
	tenants, err := s.Children(ctx, cluster.SecretsKey)
	if errors.Is(err, coord.ErrNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("list secrets: %w", err)
	}
	slices.Sort(tenants)
	for _, tenant := range tenants {
		ik, err := cluster.SecretIndexKey(tenant)
		if err != nil {
			continue
		}
		names, err := s.Children(ctx, ik)
		if err != nil {
			if errors.Is(err, coord.ErrNotFound) {
				continue
			}
			return rewrapped, current, fmt.Errorf("list tenant %s's secrets: %w", tenant, err)
		}
		slices.Sort(names)
		for _, name := range names {
			key, err := cluster.SecretKey(tenant, name)
			if err != nil {
				continue
			}
			done, gone := false, false
			_, err = coord.Update(ctx, s, key, func(cur []byte, exists bool) ([]byte, error) {
				done = false
				if gone = !exists; gone {
					return nil, errSkip
				}
				v, ss, err := openSealed(ring, tenant, name, cur)
				if err != nil {
					return nil, err
				}
				defer clear(v)
				if ss.Key == ring.Active() {
					return nil, errSkip
				}
				id, sealed, err := ring.Seal(v, SecretAAD(tenant, name, ss.Version))
				if err != nil {
					return nil, err
				}
				done = true
				return json.Marshal(cluster.SealedSecret{Version: ss.Version, Key: id, Sealed: sealed})
			})
			switch {
			case errors.Is(err, errSkip):
				if !gone {
					current++
				}
			case err != nil:
				return rewrapped, current, fmt.Errorf("rewrap: %w", busy(err, "tenant "+tenant+"'s secrets"))
			case done:
				rewrapped++
			}
		}
	}
	return rewrapped, current, nil
}

// errSkip ends a coord.Update that has nothing to write.
var errSkip = errors.New("nothing to write")
