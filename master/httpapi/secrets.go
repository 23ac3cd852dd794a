package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/master/desired"
)

// Tenant secrets through the API: set (the body is the value, never echoed), list (names,
// versions, sizes, who and when: never values), delete; the admin for every tenant, a
// tenant's token for its own. And the nodes' side: an agent's signed request for its
// workers' secrets, answered sealed to the node (master.NodeSecrets).

// mayUseSecrets answers 403 unless the caller may manage the tenant's secrets.
func mayUseSecrets(w http.ResponseWriter, r *http.Request, tenant string) bool {
	p := principalOf(r.Context())
	if p.admin || p.tenant == tenant {
		return true
	}
	fail(w, api.ErrForbidden, "the token of tenant %s cannot manage tenant %s's secrets", p.tenant, tenant)
	return false
}

func (a *API) setSecret(w http.ResponseWriter, r *http.Request) {
	tenant, name := r.PathValue("name"), r.PathValue("secret")
	noteObject(r, "secret/"+tenant+"/"+name)
	if !mayUseSecrets(w, r, tenant) {
		return
	}
	value, ok := readBody(w, r)
	if !ok {
		return
	}
	defer clear(value)
	ring, err := a.m.Keyring()
	if err != nil {
		failErr(w, fmt.Errorf("%w: the masters' keyring: %v", api.ErrInternal, err))
		return
	}
	meta, changed, err := desired.SetSecret(r.Context(), a.store, ring, tenant, name, value, principalOf(r.Context()).String())
	if err != nil {
		failErr(w, err)
		return
	}
	a.log.Info("secret set", "tenant", tenant, "secret", name, "version", meta.Version, "size", meta.Size, "changed", changed)
	reply(w, http.StatusOK, api.SecretSetReply{Changed: changed, SecretView: api.SecretView{Tenant: tenant, Name: name,
		Version: meta.Version, Size: meta.Size, Created: meta.Created, Updated: meta.Updated, UpdatedBy: meta.UpdatedBy}})
}

func (a *API) deleteSecret(w http.ResponseWriter, r *http.Request) {
	tenant, name := r.PathValue("name"), r.PathValue("secret")
	noteObject(r, "secret/"+tenant+"/"+name)
	if !mayUseSecrets(w, r, tenant) {
		return
	}
	if err := desired.DeleteSecret(r.Context(), a.store, tenant, name); err != nil {
		failErr(w, err)
		return
	}
	a.log.Info("secret deleted", "tenant", tenant, "secret", name)
	reply(w, http.StatusOK, map[string]any{"tenant": tenant, "secret": name, "deleted": true})
}

// listSecrets lists the secrets of ?tenant=NAME, or of every tenant the caller may see.
func (a *API) listSecrets(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r.Context())
	var tenants []string
	if t := r.URL.Query().Get("tenant"); t != "" {
		if err := cluster.CheckName(t); err != nil {
			fail(w, api.ErrBadInput, "tenant: %v", err)
			return
		}
		if !mayUseSecrets(w, r, t) {
			return
		}
		tenants = []string{t}
	} else if p.admin {
		names, err := a.store.Children(r.Context(), cluster.TenantsKey)
		if err != nil {
			failErr(w, err)
			return
		}
		slices.Sort(names)
		tenants = names
	} else {
		tenants = []string{p.tenant}
	}
	out := []api.SecretView{}
	for _, t := range tenants {
		if cluster.CheckName(t) != nil {
			continue
		}
		ss, err := desired.ListSecrets(r.Context(), a.store, t)
		if errors.Is(err, api.ErrNotFound) && len(tenants) > 1 {
			continue // deleted meanwhile
		}
		if err != nil {
			failErr(w, err)
			return
		}
		out = append(out, ss...)
	}
	reply(w, http.StatusOK, out)
}

// rewrapSecrets seals every secret again with the masters' active key (admin only).
func (a *API) rewrapSecrets(w http.ResponseWriter, r *http.Request) {
	ring, err := a.m.Keyring()
	if err != nil {
		failErr(w, fmt.Errorf("%w: the masters' keyring: %v", api.ErrInternal, err))
		return
	}
	n, cur, err := desired.RewrapSecrets(r.Context(), a.store, ring)
	if err != nil {
		failErr(w, err)
		return
	}
	a.log.Info("secrets sealed again with the active key", "key", ring.Active(), "rewrapped", n, "current", cur)
	reply(w, http.StatusOK, api.SecretsRewrapReply{Key: ring.Active(), Rewrapped: n, Current: cur})
}

// nodeSecrets answers an agent's signed request for its workers' secrets. It needs no API
// token: the node signs with its own key (api/nodeauth.go). A failed signature counts
// against the address like a failed token.
func (a *API) nodeSecrets(w http.ResponseWriter, r *http.Request) {
	node := r.PathValue("id")
	status, result, names := http.StatusOK, "ok", 0
	defer func() {
		a.log.Info("audit", "principal", "node/"+node, "action", "POST /v1/nodes/{id}/secrets", "object", "node/"+node,
			"result", result, "status", status, "secrets", names, "remote", r.RemoteAddr)
	}()
	answer := func(err error) {
		status = api.Status(err)
		result = strconv.Itoa(status)
		failErr(w, err)
	}
	if err := cluster.CheckName(node); err != nil {
		answer(fmt.Errorf("%w: id in the path: %v", api.ErrBadInput, err))
		return
	}
	host := api.RemoteHost(r)
	if limited, wait := a.authFails.Blocked(host); limited {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
		answer(fmt.Errorf("%w: too many failed checks from %s: try again in %s", api.ErrRateLimited, host, wait.Round(100*time.Millisecond)))
		return
	}
	body, ok := readBody(w, r)
	if !ok {
		status, result = http.StatusBadRequest, "bad_body"
		return
	}
	sealed, n, err := a.m.NodeSecrets(r.Context(), node, body, r.Header.Get("Authorization"))
	if errors.Is(err, api.ErrUnauthorized) {
		a.authFails.Fail(host)
		a.metrics.authFailures.WithLabelValues("node").Inc()
		a.log.Warn("node signature refused", "remote", r.RemoteAddr, "node", node, "err", err)
	}
	if err != nil {
		answer(err)
		return
	}
	names = n
	reply(w, http.StatusOK, api.NodeSecretsReply{Sealed: sealed})
}
