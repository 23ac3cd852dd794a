package agents

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/isolation"
)

// Tenant secrets on the node. When the agent starts a worker whose assignment names
// secrets (cluster.WorkerAssignment.Secrets: names and versions, never values), it asks the
// leading master for their values with a request signed by the node's key and opens the
// sealed answer with it (api/nodeauth.go; over TLS, the master's certificate pinned, when
// its API is https://). It writes them as files of the worker's secrets directory,
// STORMDOCK_SECRETS_DIR/NAME, mode 0400, owned by the worker's uid, in a directory 0500 of
// that uid that no one else may enter; a docker worker gets it bind-mounted read-only at
// /run/secrets. The values are in the agent's memory only while it writes them. A worker
// whose secrets cannot be fetched (no leading master, a secret its tenant lacks) waits,
// its state saying why, and never starts without them. A new version reaches a running
// worker as a file replaced atomically, then SIGHUP, without a restart. The directory goes
// with the worker: removed when it stops for good, and swept at start for workers gone
// while the agent was down.
//
// The directory is a sibling of the worker's lease directory (LEASES/ID.secrets), not in
// it: the lease directory is the worker's own, where it could put a symlink in place of a
// directory the agent writes below; the leases directory is the agent's.

// EnvSecretsDir names a worker's secrets directory (its tenant secrets as files).
const EnvSecretsDir = "STORMDOCK_SECRETS_DIR"

// containerSecretsDir is where a docker worker sees its secrets directory (read-only).
const containerSecretsDir = "/run/secrets"

// secretsSuffix marks a worker's secrets directory in the leases directory.
const secretsSuffix = ".secrets"

// secretsFetchTimeout bounds one request to the master.
const secretsFetchTimeout = 15 * time.Second

// secretsDir is where the agent keeps worker id's secrets.
func (a *Agent) secretsDir(id string) string { return filepath.Join(a.leasesDir(), id+secretsSuffix) }

// secretsPath is where a worker sees its secrets directory.
func (a *Agent) secretsPath(id, mode string) string {
	if mode == cluster.IsolationDocker {
		return containerSecretsDir
	}
	return a.secretsDir(id)
}

// workerFiles guards a worker's secrets directory between the goroutines that write it
// (a start, a rotation) and the loop that removes it: once gone, nothing writes it again.
type workerFiles struct {
	mu   sync.Mutex
	gone bool
}

// remove removes the worker's secrets directory for good.
func (f *workerFiles) remove(a *Agent, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gone = true
	return a.removeSecrets(id)
}

func (a *Agent) removeSecrets(id string) error {
	if err := os.RemoveAll(a.secretsDir(id)); err != nil {
		return fmt.Errorf("remove secrets of %s: %w", id, err)
	}
	return nil
}

// errSecretsGone: the worker's directory went (it was stopped) while its secrets were on
// their way.
var errSecretsGone = errors.New("the worker was stopped")

// deliverSecrets fetches worker id's secrets (the assignment wa names them) from the
// leading master and writes them in its directory for user u (nil: the agent's own). It
// returns the refs written: the versions the master had, which may be newer than wa's.
func (a *Agent) deliverSecrets(ctx context.Context, f *workerFiles, id string, wa cluster.WorkerAssignment, u *isolation.User) (refs []cluster.SecretRef, err error) {
	start := time.Now()
	got, err := a.fetchSecrets(ctx, wa.Key)
	if err != nil {
		return nil, err
	}
	fetched := time.Now()
	defer func() {
		if err == nil {
			a.log.Debug("secrets delivered", "worker", id, "secrets", len(refs), "fetch", fetched.Sub(start), "write", time.Since(fetched), "took", time.Since(start))
		}
	}()
	defer func() {
		for _, s := range got {
			clear(s.Value)
		}
	}()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gone {
		return nil, errSecretsGone
	}
	return a.writeSecrets(id, got, u)
}

// writeSecrets makes the directory of worker id's secrets hold vals and nothing else.
func (a *Agent) writeSecrets(id string, vals []api.SecretValue, u *isolation.User) ([]cluster.SecretRef, error) {
	dir := a.secretsDir(id)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("secrets dir of %s: %w", id, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("secrets dir of %s: %w", id, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("secrets dir of %s: %s is not a directory", id, dir)
	}
	// The directory is in the agent's leases directory, which no worker can write: it is
	// no symlink planted by one. Once written it is the worker's, closed to everyone else.
	refs := make([]cluster.SecretRef, 0, len(vals))
	keep := map[string]bool{}
	for _, v := range vals {
		if err := cluster.CheckSecretName(v.Name); err != nil {
			return nil, fmt.Errorf("secrets of %s: the master sent %w", id, err)
		}
		if err := writeOwned(filepath.Join(dir, v.Name), v.Value, 0o400, u); err != nil {
			return nil, fmt.Errorf("secret %s of %s: %w", v.Name, id, err)
		}
		keep[v.Name] = true
		refs = append(refs, cluster.SecretRef{Name: v.Name, Version: v.Version})
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("secrets dir of %s: %w", id, err)
	}
	for _, e := range ents {
		if !keep[e.Name()] {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	uid, gid := ownerOf(u)
	if err := os.Lchown(dir, uid, gid); err != nil {
		return nil, chownError("secrets dir of "+id, uid, err)
	}
	mode := os.FileMode(0o500)
	if u == nil {
		mode = 0o700 // the agent's own: it writes there again without privileges
	}
	if err := os.Chmod(dir, mode); err != nil {
		return nil, fmt.Errorf("secrets dir of %s: %w", id, err)
	}
	return refs, nil
}

// fetchSecrets asks the leading master for the secrets of worker k of this node.
func (a *Agent) fetchSecrets(ctx context.Context, k cluster.WorkerKey) ([]api.SecretValue, error) {
	ns, err := a.askMaster(ctx, api.NodeSecretsRequest{Workers: []cluster.WorkerKey{k}})
	if err != nil {
		return nil, err
	}
	var out []api.SecretValue
	for _, w := range ns.Workers {
		if w.Key != k {
			continue
		}
		if w.Error != "" {
			ns.Wipe()
			return nil, errors.New(w.Error)
		}
		out = w.Secrets
	}
	if out == nil {
		ns.Wipe()
		return nil, fmt.Errorf("the leading master answered nothing for worker %s", k)
	}
	return out, nil
}

// askMaster sends the node's signed request to the leading master (as the store names it)
// and opens its sealed answer. The caller wipes what it holds once used.
func (a *Agent) askMaster(ctx context.Context, req api.NodeSecretsRequest) (*api.NodeSecrets, error) {
	if a.id == nil {
		return nil, errors.New("the agent has no node identity to ask for secrets with")
	}
	ctx, cancel := context.WithTimeout(ctx, secretsFetchTimeout)
	defer cancel()
	e, err := a.store.Get(ctx, cluster.MasterKey)
	if errors.Is(err, coord.ErrNotFound) {
		return nil, fmt.Errorf("no master leads (the store names none at %s): the worker waits for one", cluster.MasterKey)
	}
	if err != nil {
		return nil, fmt.Errorf("find the leading master: %w", err)
	}
	var mi cluster.MasterInfo
	if err := json.Unmarshal(e.Value, &mi); err != nil || mi.API == "" {
		return nil, fmt.Errorf("find the leading master: %s holds no API URL", cluster.MasterKey)
	}
	hc, err := a.masterClient(mi)
	if err != nil {
		return nil, err
	}
	node := a.cfg.Node.ID
	req.Node = node
	body, _ := json.Marshal(req)
	path := api.NodeSecretsPath(node)
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(mi.API, "/")+path, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("ask the leading master %s for secrets: %w", mi.API, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Authorization", api.SignNodeRequest(a.id.sign, http.MethodPost, path, body, time.Now(), api.NodeTokenTTL))
	resp, err := hc.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the leading master %s (%s) for secrets: %w", mi.ID, mi.API, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, fmt.Errorf("read the leading master's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the leading master %s: %w", mi.ID, api.ParseError(resp.StatusCode, data, resp.Status))
	}
	var rep api.NodeSecretsReply
	if err := json.Unmarshal(data, &rep); err != nil {
		return nil, fmt.Errorf("read the leading master's answer: %w", err)
	}
	plain, err := api.OpenForNode(a.id.seal, node, body, rep.Sealed)
	if err != nil {
		return nil, err
	}
	defer clear(plain)
	var ns api.NodeSecrets
	if err := json.Unmarshal(plain, &ns); err != nil {
		return nil, fmt.Errorf("read the leading master's answer: %w", err)
	}
	return &ns, nil
}

// tenantRegistryAuth opens a tenant's sealed registry credentials (stored, as read from the
// store) by asking the leading master, which alone holds the keyring; what it answered is
// kept in memory for as long as the store holds the same sealed value, and used while the
// master cannot be reached (as what the store last said is used while it cannot).
func (a *Agent) tenantRegistryAuth(ctx context.Context, tenant string, stored []byte) (*images.Auth, error) {
	a.mu.Lock()
	c, ok := a.regAuth[tenant]
	a.mu.Unlock()
	if ok && bytes.Equal(c.sealed, stored) {
		return c.auth, nil
	}
	ns, err := a.askMaster(ctx, api.NodeSecretsRequest{RegistryAuth: []string{tenant}})
	if err == nil {
		defer ns.Wipe()
		err = fmt.Errorf("the leading master answered nothing for tenant %s's registry credentials", tenant)
		for _, r := range ns.RegistryAuth {
			if r.Tenant != tenant {
				continue
			}
			var auth *images.Auth
			switch {
			case r.Error != "":
				err = errors.New(r.Error)
			case len(r.Config) == 0:
				err = nil
			default:
				auth, err = images.ParseAuth(r.Config, "tenant "+tenant+"'s registry credentials")
			}
			if err == nil {
				a.mu.Lock()
				if a.regAuth == nil {
					a.regAuth = map[string]openedAuth{}
				}
				a.regAuth[tenant] = openedAuth{sealed: bytes.Clone(stored), auth: auth}
				a.mu.Unlock()
				return auth, nil
			}
		}
	}
	if ok {
		a.log.Warn("using tenant registry credentials the master gave before", "tenant", tenant, "err", err)
		return c.auth, nil
	}
	return nil, fmt.Errorf("tenant %s's registry credentials: %w", tenant, err)
}

// openedAuth is a tenant's registry credentials as the master opened them, and the sealed
// value they were opened from.
type openedAuth struct {
	sealed []byte
	auth   *images.Auth
}

// masterClient is the HTTP client to the leading master as the store advertises it: over
// https://, it trusts the certificate the advertisement names and no other.
func (a *Agent) masterClient(mi cluster.MasterInfo) (*http.Client, error) {
	https := strings.HasPrefix(mi.API, "https://")
	if https && mi.CertSHA256 == "" {
		return nil, fmt.Errorf("the leading master %s serves %s but advertises no certificate to trust: upgrade it", mi.ID, mi.API)
	}
	id := mi.API + "|" + mi.CertSHA256
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.masterHTTP != nil && a.masterHTTPID == id {
		return a.masterHTTP, nil
	}
	if a.masterHTTP != nil {
		a.masterHTTP.CloseIdleConnections()
	}
	tr := &http.Transport{Proxy: nil, TLSHandshakeTimeout: 5 * time.Second, ResponseHeaderTimeout: secretsFetchTimeout,
		MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute}
	if https {
		tr.TLSClientConfig = api.PinnedTLS(mi.CertSHA256)
	}
	a.masterHTTP, a.masterHTTPID = &http.Client{Transport: tr, Timeout: secretsFetchTimeout}, id
	return a.masterHTTP, nil
}

// behind reports whether the delivered secrets lack one wanted, or hold an older version of
// one than wanted (a newer one, which the master had when it answered, is fine).
func behind(delivered, want []cluster.SecretRef) bool {
	if len(delivered) != len(want) {
		return true
	}
	for i, w := range want {
		if d := delivered[i]; d.Name != w.Name || d.Version < w.Version {
			return true
		}
	}
	return false
}

// secretsPresent reports whether worker id's secrets directory is there.
func (a *Agent) secretsPresent(id string) bool {
	fi, err := os.Lstat(a.secretsDir(id))
	return err == nil && fi.IsDir()
}

// secretsFailed records a start that did not happen because the worker's secrets could not
// be fetched: it waits and tries again with the start backoff, its state saying why. Not a
// crash: the master does not take a master or network outage for a crash loop.
func (r *run) secretsFailed(s *slot, seq int, err error) {
	r.notStarted(s, seq, "waiting for its secrets", "worker waits for its secrets", err)
}

// refreshSecrets gives a running worker the new versions of its secrets: each file replaced
// atomically, then SIGHUP, as a live configuration change; the worker is not restarted.
func (r *run) refreshSecrets(s *slot) {
	s.secretsBusy = true
	seq, files, id, wa, mode := s.seq, s.files, s.id, s.assign, s.mode
	u := r.a.userOf(wa, mode)
	ctx := r.ctx
	r.goOp(func() {
		refs, err := r.a.deliverSecrets(ctx, files, id, wa, u)
		r.post(func() {
			s.secretsBusy = false
			switch {
			case errors.Is(err, errSecretsGone):
				return
			case err != nil:
				s.secretsFailures++
				d := r.backoff(s.secretsFailures)
				s.secretsRetry = time.Now().Add(d)
				r.log.Warn("new versions of a running worker's secrets not delivered yet", "worker", id, "retry_in", d, "err", err)
				r.armRetry(false)
				return
			}
			s.secretsFailures, s.secretsRetry = 0, time.Time{}
			s.delivered = refs
			if err := r.a.writeRecord(s.id, s.record()); err != nil {
				r.log.Warn("write worker record", "worker", s.id, "err", err)
			}
			r.log.Info("secrets rotated", "worker", id, "secrets", refNames(refs))
			if s.seq != seq || s.state != cluster.WorkerRunning || s.busy {
				return // a worker being started reads the files as they are now
			}
			r.signalLive(s)
		})
	})
}

// refNames lists the names of refs (never values), for logs.
func refNames(refs []cluster.SecretRef) []string {
	out := make([]string, len(refs))
	for i, r := range refs {
		out[i] = r.Name
	}
	return out
}

// identityRecord is the node's identity for its record (nil before Run loaded it).
func (a *Agent) identityRecord() *cluster.NodeIdentity {
	if a.id == nil {
		return nil
	}
	return a.id.public()
}

// sweepSecrets removes the secrets directories of workers that are gone (kept lists the
// ones the drivers still run): the agent was down when they ended.
func (a *Agent) sweepSecrets(kept map[string]bool) {
	ents, err := os.ReadDir(a.leasesDir())
	if err != nil {
		return
	}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), secretsSuffix)
		if ok && !kept[id] {
			if err := a.removeSecrets(id); err != nil {
				a.log.Warn("sweep secrets of a worker that is gone", "worker", id, "err", err)
			} else {
				a.log.Info("swept the secrets of a worker that ended while the agent was down", "worker", id)
			}
		}
	}
}
