package httpapi

import (
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/stormdock/stormdock/api"
)

// recordEvent records an event of a controller outside the masters (the cluster
// autoscaler): admin only, of the kinds such a controller may record, about a cluster.
func (a *API) recordEvent(w http.ResponseWriter, r *http.Request) {
	var e api.Event
	if !decodeJSON(w, r, &e) {
		return
	}
	switch {
	case e.Kind != api.EventClusterAutoscaled && e.Kind != api.EventClusterAutoscaleRefused:
		fail(w, api.ErrBadInput, "kind %q: only %s and %s are recorded through the API", clipPath(e.Kind), api.EventClusterAutoscaled, api.EventClusterAutoscaleRefused)
		return
	case !strings.HasPrefix(e.Object, "cluster/") || len(e.Object) > 100:
		fail(w, api.ErrBadInput, "object %q: want cluster/NAME", clipPath(e.Object))
		return
	case len(e.Reason) > 1024 || !utf8.ValidString(e.Reason):
		fail(w, api.ErrBadInput, "reason: at most 1024 bytes of UTF-8")
		return
	}
	// Only what a controller may say: the rest (ids, times, jobs, principals) is the
	// master's.
	a.m.Emit(api.Event{Kind: e.Kind, Object: e.Object, Reason: e.Reason, Principal: principalOf(r.Context()).String()})
	w.WriteHeader(http.StatusNoContent)
}
