package desired

import (
	"fmt"

	"github.com/stormdock/stormdock/api"
)

// keyOf passes on a store key made by one of cluster's key builders, which refuse names
// that are not valid: the refusal is the caller's bad input (400), and nothing is read or
// written. Use it as keyOf(cluster.JobKey(name)).
func keyOf(key string, err error) (string, error) {
	if err != nil {
		return "", fmt.Errorf("%w: %w", api.ErrBadInput, err)
	}
	return key, nil
}
