package httpapi

import (
	"net/http"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/master"
)

// What the package's tests (package httpapi_test, which runs on clustertest's cluster) read
// of its internals.

// PathParam finds the {name} wildcards of a route pattern.
var PathParam = pathParam

// MapCache is the console map's cache (mapCache) for the tests.
type MapCache struct{ c *mapCache }

func NewMapCache() *MapCache { return &MapCache{c: newMapCache()} }

// Build makes the map of m's mirrors as they are now.
func (c *MapCache) Build(m *master.Master) *MapBase { return &MapBase{b: c.c.build(m, m.Stamp())} }

// Touch makes the cache take node's record for changed.
func (c *MapCache) Touch(node string) { c.c.nodes[node].rev-- }

// MapBase is one map before it is encoded for a viewer.
type MapBase struct{ b *mapBase }

func (b *MapBase) DCs() []api.MapDC { return b.b.dcs }

// MapState is a map encoded for one viewer.
type MapState struct{ s *mapState }

// Encode encodes the base for the admin, or tenant, reusing prev's node entries.
func (b *MapBase) Encode(admin bool, tenant string, prev *MapState) *MapState {
	var p *mapState
	if prev != nil {
		p = prev.s
	}
	return &MapState{s: encodeState(b.b, principal{admin: admin, tenant: tenant}, p)}
}

// Forget drops node's entry from what a later Encode may reuse.
func (s *MapState) Forget(node string) { delete(s.s.drawn, node) }

// AfterLook makes f run between each request's look at the state and what it does with it
// (see blockHub.afterLook). Set it before any request.
func (a *API) AfterLook(f func(r *http.Request)) { a.block.afterLook = f }
