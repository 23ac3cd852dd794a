package desired

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/keyring"
)

// SetTenantRegistryAuth stores a tenant's registry credentials (data in Docker's config.json
// format, checked by images.ParseAuth) below its record, replacing any, and returns the
// registry hosts they are for. Only what stormdock reads is kept (auths, by host), sealed
// with ring (cluster.SealedRegistryAuth) when the masters hold one, in clear otherwise.
// Errors never show a value of data.
func SetTenantRegistryAuth(ctx context.Context, s coord.KV, ring *keyring.Keyring, name string, data []byte) ([]string, error) {
	key, err := keyOf(cluster.TenantRegistryAuthKey(name))
	if err != nil {
		return nil, err
	}
	auth, err := images.ParseAuth(data, "tenant "+name+"'s registry credentials")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", api.ErrBadInput, err)
	}
	if _, _, err := ReadTenant(ctx, s, name); err != nil {
		return nil, err
	}
	val := auth.Marshal()
	if ring != nil {
		id, sealed, err := ring.Seal(val, RegistryAuthAAD(name))
		clear(val)
		if err != nil {
			return nil, err
		}
		val, _ = json.Marshal(cluster.SealedRegistryAuth{Hosts: auth.Hosts(), Key: id, Sealed: sealed})
	}
	_, err = coord.Update(ctx, s, key, func([]byte, bool) ([]byte, error) { return val, nil })
	if err != nil {
		return nil, busy(err, "tenant "+name)
	}
	return auth.Hosts(), nil
}

// RegistryAuthAAD is what a tenant's sealed registry credentials are bound to.
func RegistryAuthAAD(tenant string) []byte {
	return []byte("stormdock-registry-auth\x00v1\x00" + tenant)
}

// ClearTenantRegistryAuth removes a tenant's registry credentials; a tenant without any is
// left as it is.
func ClearTenantRegistryAuth(ctx context.Context, s coord.KV, name string) error {
	key, err := keyOf(cluster.TenantRegistryAuthKey(name))
	if err != nil {
		return err
	}
	if _, _, err := ReadTenant(ctx, s, name); err != nil {
		return err
	}
	if err := s.Delete(ctx, key, coord.AnyVersion); err != nil && !errors.Is(err, coord.ErrNotFound) {
		return fmt.Errorf("clear tenant %s's registry credentials: %w", name, err)
	}
	return nil
}

// TenantRegistryAuth reads a tenant's registry credentials, opening them with ring when they
// are sealed: nil when it has none.
func TenantRegistryAuth(ctx context.Context, s coord.KV, ring *keyring.Keyring, name string) (*images.Auth, error) {
	key, err := keyOf(cluster.TenantRegistryAuthKey(name))
	if err != nil {
		return nil, err
	}
	e, err := s.Get(ctx, key)
	if errors.Is(err, coord.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read tenant %s's registry credentials: %w", name, err)
	}
	return OpenRegistryAuth(ring, name, e.Value)
}

// OpenRegistryAuth reads a stored value of the tenant's registry credentials: sealed (opened
// with ring) or, as stores without a keyring keep them, Docker's config.json.
func OpenRegistryAuth(ring *keyring.Keyring, tenant string, val []byte) (*images.Auth, error) {
	what := "tenant " + tenant + "'s registry credentials"
	if sa, ok := cluster.ParseSealedRegistryAuth(val); ok {
		if ring == nil {
			return nil, fmt.Errorf("read %s: they are sealed, and %w", what, ErrSecretsOff)
		}
		plain, err := ring.Open(sa.Key, sa.Sealed, RegistryAuthAAD(tenant))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", what, err)
		}
		defer clear(plain)
		val = plain
	}
	a, err := images.ParseAuth(val, what)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	return a, nil
}

// TenantRegistryHosts says whether a tenant has registry credentials, and for which hosts,
// without opening them.
func TenantRegistryHosts(ctx context.Context, s coord.KV, name string) ([]string, bool, error) {
	key, err := keyOf(cluster.TenantRegistryAuthKey(name))
	if err != nil {
		return nil, false, err
	}
	e, err := s.Get(ctx, key)
	if errors.Is(err, coord.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read tenant %s's registry credentials: %w", name, err)
	}
	if sa, ok := cluster.ParseSealedRegistryAuth(e.Value); ok {
		return sa.Hosts, true, nil
	}
	a, err := images.ParseAuth(e.Value, "tenant "+name+"'s registry credentials")
	if err != nil {
		return nil, false, err
	}
	return a.Hosts(), true, nil
}

// SharedImages lists the shared repository prefixes.
func SharedImages(ctx context.Context, s coord.KV) ([]string, error) {
	e, err := s.Get(ctx, cluster.SharedImagesKey)
	if errors.Is(err, coord.ErrNotFound) {
		return []string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read shared images: %w", err)
	}
	var si cluster.SharedImages
	if err := json.Unmarshal(e.Value, &si); err != nil {
		return nil, fmt.Errorf("read shared images: %w", err)
	}
	if si.Prefixes == nil {
		si.Prefixes = []string{}
	}
	return si.Prefixes, nil
}

// ShareImages adds (share) or removes a repository prefix of the shared list and returns
// the list as stored. The prefix is checked and normalized by images.CheckPrefix; removing
// one that is not listed says so.
func ShareImages(ctx context.Context, s coord.KV, prefix string, share bool) ([]string, error) {
	p, err := images.CheckPrefix(prefix)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", api.ErrBadInput, err)
	}
	var out []string
	_, err = coord.Update(ctx, s, cluster.SharedImagesKey, func(cur []byte, exists bool) ([]byte, error) {
		var si cluster.SharedImages
		if exists && json.Unmarshal(cur, &si) != nil {
			si = cluster.SharedImages{}
		}
		has := slices.Contains(si.Prefixes, p)
		switch {
		case share && !has:
			si.Prefixes = append(si.Prefixes, p)
		case !share && !has:
			return nil, fmt.Errorf("%w: %s is not shared (see `stormdock image shared`)", api.ErrNotFound, p)
		case !share:
			si.Prefixes = slices.DeleteFunc(si.Prefixes, func(x string) bool { return x == p })
		}
		slices.Sort(si.Prefixes)
		if si.Prefixes == nil {
			si.Prefixes = []string{}
		}
		out = si.Prefixes
		return json.Marshal(si)
	})
	if err != nil {
		return nil, busy(err, "the shared images")
	}
	return out, nil
}
