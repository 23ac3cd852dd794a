package httpapi

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/master/desired"
)

// The API of rollouts: update, rollback, restart, pause, resume, promote and history.

func (a *API) updateJob(w http.ResponseWriter, r *http.Request) {
	var req api.UpdateRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	name := r.PathValue("name")
	if req.DryRun {
		noteDryRun(r)
	}
	rec, _, err := desired.ReadJob(r.Context(), a.store, name)
	if err == nil {
		err = mayUse(principalOf(r.Context()), rec.Spec.Tenant)
	}
	if err != nil {
		failErr(w, err)
		return
	}
	spec, err := cluster.ParseJobSpec([]byte(req.Spec))
	if err != nil {
		failErr(w, fmt.Errorf("%w: %w", api.ErrBadInput, err))
		return
	}
	if err := a.m.CheckSinkDir(spec); err != nil {
		failErr(w, err)
		return
	}
	if err := a.m.CheckSecrets(spec); err != nil {
		failErr(w, err)
		return
	}
	if err := a.m.CheckScaling(spec); err != nil {
		failErr(w, err)
		return
	}
	// Only a changed image is resolved: the registry is asked outside the store's retries,
	// and an update that keeps the image keeps its digest. A dry run asks no registry.
	var pin *cluster.ImagePin
	if !req.DryRun && (spec.Image != rec.Spec.Image || spec.IsolationMode() != rec.Spec.IsolationMode()) {
		pin = a.m.PinImage(r.Context(), spec, 0)
	}
	check := pin
	if check == nil && rec.Image != nil && rec.Image.Generation == rec.Generation {
		check = rec.Image // the same image, pinned for the running generation
	}
	if err := a.m.CheckImageCommand(r.Context(), spec, check); err != nil {
		failErr(w, err)
		return
	}
	out, changed, err := desired.UpdateJob(r.Context(), a.store, name, desired.Change{Spec: spec, Pin: pin, Policy: req.Policy,
		Who: principalOf(r.Context()).String(), DryRun: req.DryRun})
	if err != nil {
		// Problems found against the running job (its tenant, its links) get their lines
		// in the spec as sent.
		cluster.Locate([]byte(req.Spec), &cluster.JobSpec{}, err)
		failErr(w, err)
		return
	}
	if changed && !req.DryRun {
		a.log.Info("job updated", "job", name, "generation", out.Generation, "rollout", out.Rollout.ID, "by", out.Rollout.Policy.By,
			"maxParallel", out.Rollout.Policy.MaxParallel)
	}
	var changes []api.SpecChange
	if changed {
		changes = specDiff(rec.Spec, out.Spec)
	}
	reply(w, http.StatusOK, api.UpdateReply{Job: out, Changed: changed, Changes: changes, DryRun: req.DryRun})
}

// jobSpec answers a job's spec as YAML: the current generation's, or with ?generation=N an
// earlier one's from its history.
func (a *API) jobSpec(w http.ResponseWriter, r *http.Request) {
	rec, h, ok := a.readHistory(w, r)
	if !ok {
		return
	}
	gen, spec := rec.Generation, rec.Spec
	if s := r.URL.Query().Get("generation"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			fail(w, api.ErrBadInput, "generation must be a generation (1 or more), not %q", s)
			return
		}
		g, ok := h.Find(n)
		if !ok {
			fail(w, api.ErrNotFound, "job %s has no generation %d in its history (see `stormdock job history %s`)", rec.Spec.Name, n, rec.Spec.Name)
			return
		}
		gen, spec = n, g.Spec
	}
	text, err := cluster.FormatJobSpec(spec)
	if err != nil {
		failErr(w, err)
		return
	}
	reply(w, http.StatusOK, api.JobSpecText{Job: rec.Spec.Name, Generation: gen, Spec: string(text)})
}

func (a *API) rollbackJob(w http.ResponseWriter, r *http.Request) {
	var req api.RollbackRequest
	if !decodeJSON(w, r, &req, true) {
		return
	}
	if req.To < 0 {
		fail(w, api.ErrBadInput, "--to must be a generation (1 or more)")
		return
	}
	if !a.mayUseJob(w, r) {
		return
	}
	name := r.PathValue("name")
	out, changed, err := desired.RollbackJob(r.Context(), a.store, name, desired.Change{To: req.To, Policy: req.Policy, Who: principalOf(r.Context()).String()})
	if err != nil {
		failErr(w, err)
		return
	}
	if changed {
		a.log.Info("job rolled back", "job", name, "generation", out.Generation, "rollout", out.Rollout.ID)
	}
	reply(w, http.StatusOK, api.UpdateReply{Job: out, Changed: changed})
}

func (a *API) restartJob(w http.ResponseWriter, r *http.Request) {
	var req api.RestartRequest
	if !decodeJSON(w, r, &req, true) {
		return
	}
	if !a.mayUseJob(w, r) {
		return
	}
	rec, err := desired.RestartJob(r.Context(), a.store, r.PathValue("name"), req.Workers, req.By, req.MaxParallel, principalOf(r.Context()).String())
	if err != nil {
		failErr(w, err)
		return
	}
	reply(w, http.StatusOK, rec)
}

// rolloutAction serves pause, resume and promote.
func (a *API) rolloutAction(action string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct{}
		if !decodeJSON(w, r, &req, true) {
			return
		}
		if !a.mayUseJob(w, r) {
			return
		}
		rec, err := desired.RolloutAction(r.Context(), a.store, r.PathValue("name"), action)
		if err != nil {
			failErr(w, err)
			return
		}
		a.log.Info("rollout "+action, "job", rec.Spec.Name, "rollout", rec.Rollout.ID, "state", rec.Rollout.State)
		reply(w, http.StatusOK, rec)
	}
}

// readHistory reads the job in the path and its history, answering 404 or 403 (and false)
// unless the caller may read them.
func (a *API) readHistory(w http.ResponseWriter, r *http.Request) (cluster.JobRecord, cluster.JobHistory, bool) {
	rec, h, err := desired.ReadHistory(r.Context(), a.store, r.PathValue("name"))
	if err == nil {
		err = mayUse(principalOf(r.Context()), rec.Spec.Tenant)
	}
	if err != nil {
		failErr(w, err)
		return rec, h, false
	}
	return rec, h, true
}

func (a *API) jobHistory(w http.ResponseWriter, r *http.Request) {
	rec, h, ok := a.readHistory(w, r)
	if !ok {
		return
	}
	out := api.JobHistory{Job: rec.Spec.Name, Current: rec.Generation, Generations: []api.GenerationView{}}
	var prev *cluster.GenerationRecord
	for i, g := range h.Generations {
		gv := api.GenerationView{Generation: g.Generation, At: g.At, Who: g.Who, Kind: g.Kind}
		if g.Image != nil {
			gv.Image = g.Image.Ref
		}
		if prev != nil {
			gv.Changes = specDiff(prev.Spec, g.Spec)
		}
		out.Generations = append(out.Generations, gv)
		prev = &h.Generations[i]
	}
	reply(w, http.StatusOK, out)
}

// specDiff lists the fields that differ between two specs, by path, in path order.
func specDiff(a, b cluster.JobSpec) []api.SpecChange {
	fa, fb := flatten(a), flatten(b)
	var out []api.SpecChange
	keys := maps.Clone(fa)
	maps.Copy(keys, fb)
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if fa[k] != fb[k] {
			out = append(out, api.SpecChange{Field: k, From: fa[k], To: fb[k]})
		}
	}
	return out
}

// flatten writes a spec as field path -> value, through its JSON form: objects by key
// (env.LEVEL), lists by index (command[1]).
func flatten(spec cluster.JobSpec) map[string]string {
	b, _ := json.Marshal(spec)
	var v any
	_ = json.Unmarshal(b, &v)
	out := map[string]string{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				p := k
				if path != "" {
					p = path + "." + k
				}
				walk(p, e)
			}
		case []any:
			for i, e := range x {
				walk(path+"["+strconv.Itoa(i)+"]", e)
			}
		case nil:
		case string:
			out[path] = x
		default:
			out[path] = fmt.Sprint(x)
		}
	}
	walk("", v)
	return out
}
