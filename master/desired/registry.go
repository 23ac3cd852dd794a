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
)

// SetTenantRegistryAuth stores a tenant's registry credentials (data in Docker's config.json
// format, checked by images.ParseAuth) below its record, replacing any, and returns the
// registry hosts they are for. Only what stormdock reads is kept (auths, by host). Errors
// never show a value of data.
func SetTenantRegistryAuth(ctx context.Context, s coord.KV, name string, data []byte) ([]string, error) {
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
	_, err = coord.Update(ctx, s, key, func([]byte, bool) ([]byte, error) { return val, nil })
	if err != nil {
		return nil, busy(err, "tenant "+name)
	}
	return auth.Hosts(), nil
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

// TenantRegistryAuth reads a tenant's registry credentials: nil when it has none.
func TenantRegistryAuth(ctx context.Context, s coord.KV, name string) (*images.Auth, error) {
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
	a, err := images.ParseAuth(e.Value, "tenant "+name+"'s registry credentials")
	if err != nil {
		return nil, fmt.Errorf("read tenant %s's registry credentials: %w", name, err)
	}
	return a, nil
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
