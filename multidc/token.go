package multidc

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// Sender tokens. A router takes records only from the workers of its own job, and a link's
// records only from that link's workers: every request but the read-only ones carries
// "Authorization: Bearer TOKEN", and the router compares the token's hash with those it was
// started with. A job has one token per link (LinkSenderToken: an HMAC of the job's name,
// the link and the submission time under the cluster's output key, cluster.OutputKeyKey in
// the store), which the link's workers present with their records and heartbeats
// (--link-token-hashes), and a token of its own (SenderToken, --token-hash), which no worker
// holds: the masters and operators present it to fail the job's output over. Any master can
// make the tokens again for the job's assignments, the job record keeps only their hashes,
// and a job submitted again under the same name gets new ones. The agent writes a link
// worker's token to a file only that worker may read and names it in
// STORMDOCK_OUTPUT_TOKEN_FILE.

// EnvSinkDir names, in a router's environment, the directory its file sink must lie below
// (the agent's --sink-dir; --sink-dir of `stormdock router`).
const EnvSinkDir = "STORMDOCK_SINK_DIR"

// EnvTokenFile names, in a link worker's environment, the file holding its sender token.
const EnvTokenFile = "STORMDOCK_OUTPUT_TOKEN_FILE"

// EnsureOutputKey reads the cluster's output key, making it when there is none.
func EnsureOutputKey(ctx context.Context, kv coord.KV) ([]byte, error) {
	for range 3 {
		e, err := kv.Get(ctx, cluster.OutputKeyKey)
		if err == nil {
			key, err := hex.DecodeString(string(e.Value))
			if err != nil || len(key) < 16 {
				return nil, fmt.Errorf("multidc: the output key at %s is not readable", cluster.OutputKeyKey)
			}
			return key, nil
		}
		if !errors.Is(err, coord.ErrNotFound) {
			return nil, fmt.Errorf("multidc: read the output key: %w", err)
		}
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		_, err = kv.Create(ctx, cluster.OutputKeyKey, []byte(hex.EncodeToString(key)), coord.Persistent)
		if err == nil {
			return key, nil
		}
		if !errors.Is(err, coord.ErrExists) {
			return nil, fmt.Errorf("multidc: store the output key: %w", err)
		}
		// Another master made it at the same moment: read theirs.
	}
	return nil, errors.New("multidc: the output key keeps changing")
}

// SenderToken is the sender token of the job submitted at submitted.
func SenderToken(key []byte, job string, submitted time.Time) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(job + "\n" + submitted.UTC().Format(time.RFC3339Nano)))
	return "sdo_" + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// LinkSenderToken is the sender token of link's workers of the job submitted at submitted:
// the router takes link's records with it, and no other link's. (Names hold no newline, so
// the MAC's input cannot be taken for SenderToken's or another link's.)
func LinkSenderToken(key []byte, job, link string, submitted time.Time) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(job + "\n" + link + "\n" + submitted.UTC().Format(time.RFC3339Nano)))
	return "sdl_" + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// LinkTokenHashes are the hashes of the link tokens of the job submitted at submitted, by
// link: what its record keeps (cluster.JobRecord.OutputLinkTokenHashes).
func LinkTokenHashes(key []byte, job string, links []string, submitted time.Time) map[string]string {
	out := make(map[string]string, len(links))
	for _, l := range links {
		out[l] = api.HashToken(LinkSenderToken(key, job, l, submitted))
	}
	return out
}

// JobSenderToken makes the sender token of a job from its record and the output key in the
// store: what an operator with the store's credentials presents to fail a job's output over.
func JobSenderToken(ctx context.Context, kv coord.KV, job string) (string, error) {
	jobKey, err := cluster.JobKey(job)
	if err != nil {
		return "", fmt.Errorf("multidc: %w", err)
	}
	e, err := kv.Get(ctx, jobKey)
	if err != nil {
		return "", fmt.Errorf("multidc: read job %s: %w", job, err)
	}
	var rec cluster.JobRecord
	if err := json.Unmarshal(e.Value, &rec); err != nil {
		return "", fmt.Errorf("multidc: read job %s: %w", job, err)
	}
	k, err := kv.Get(ctx, cluster.OutputKeyKey)
	if err != nil {
		return "", fmt.Errorf("multidc: read the output key: %w", err)
	}
	key, err := hex.DecodeString(string(k.Value))
	if err != nil {
		return "", fmt.Errorf("multidc: the output key at %s is not readable", cluster.OutputKeyKey)
	}
	return SenderToken(key, job, rec.Submitted), nil
}

// ReadTokenFile reads a sender token from the file named by STORMDOCK_OUTPUT_TOKEN_FILE;
// "" when the variable is not set.
func ReadTokenFile() (string, error) {
	path := os.Getenv(EnvTokenFile)
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("multidc: sender token (%s): %w", EnvTokenFile, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// principal is who a request's token names: the job itself (its own token: failovers, and
// any link's records for a job from before per-link tokens) or one of its links.
type principal struct {
	job  bool
	link string
}

// authorized checks a request's bearer token against the router's token hashes, counting
// failures per remote address (see api.FailLimiter).
//
// The check is cheap and comes first: workers share addresses (a node's, loopback here), and
// one that keeps failing must not lock its neighbours out, only itself get 429 and no log line.
func (r *Router) authorized(w http.ResponseWriter, req *http.Request) (principal, bool) {
	token, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	reason := "missing"
	if ok && token != "" {
		h := []byte(api.HashToken(strings.TrimSpace(token)))
		// Every hash is compared, so that the time taken says nothing of which matched.
		var who principal
		found := false
		if subtle.ConstantTimeCompare(h, []byte(r.cfg.TokenHash)) == 1 {
			who, found = principal{job: true}, true
		}
		for _, l := range r.cfg.Links {
			if lh, ok := r.cfg.LinkTokenHashes[l]; ok && subtle.ConstantTimeCompare(h, []byte(lh)) == 1 {
				who, found = principal{link: l}, true
			}
		}
		if found {
			return who, true
		}
		reason = "invalid"
	}
	host := api.RemoteHost(req)
	if limited, wait := r.fails.Blocked(host); limited {
		r.m.authFailures.WithLabelValues("limited").Inc()
		w.Header().Set("Retry-After", fmt.Sprint(int(wait/time.Second)+1))
		api.Errorf(w, api.ErrRateLimited, fmt.Sprintf("too many failed token checks from %s: try again in %s", host, wait.Round(100*time.Millisecond)))
		return principal{}, false
	}
	r.fails.Fail(host)
	r.m.authFailures.WithLabelValues(reason).Inc()
	r.log.Warn("sender token refused", "remote", req.RemoteAddr, "reason", reason, "path", req.URL.Path)
	writeError(w, fmt.Errorf("%w: %s sender token: only the workers of job %s may send to its router (the token is in the file $%s names)",
		api.ErrUnauthorized, reason, r.cfg.Job, EnvTokenFile))
	return principal{}, false
}

// senderLink is the link whose records and heartbeats who may send: its own link, or, with
// the job's token on a router without link tokens (a job from before them), any ("").
func (r *Router) senderLink(who principal) (string, error) {
	switch {
	case who.link != "":
		return who.link, nil
	case len(r.cfg.LinkTokenHashes) == 0:
		return "", nil
	}
	return "", fmt.Errorf("%w: the job's own token is for failovers: a link's workers send with their link's token (the file $%s names)",
		api.ErrForbidden, EnvTokenFile)
}

// authLink wraps a handler of a link's records or heartbeats: it gets the link the token
// allows ("": any).
func (r *Router) authLink(h func(http.ResponseWriter, *http.Request, string)) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		who, ok := r.authorized(w, req)
		if !ok {
			return
		}
		link, err := r.senderLink(who)
		if err != nil {
			writeError(w, err)
			return
		}
		h(w, req, link)
	}
}

// authJob wraps a handler that needs the job's own token (a failover).
func (r *Router) authJob(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		who, ok := r.authorized(w, req)
		if !ok {
			return
		}
		if !who.job {
			writeError(w, fmt.Errorf("%w: link %s's token may send records, not fail the job over: ask the master (stormdock link failover)", api.ErrForbidden, who.link))
			return
		}
		h(w, req)
	}
}

// checkLink refuses a request for link from a sender allowed only allowed ("": any).
func (r *Router) checkLink(allowed, link string) error {
	if allowed != "" && link != allowed {
		return fmt.Errorf("%w: link %s's token cannot send for link %q: each link's workers send with their own link's token", api.ErrForbidden, allowed, link)
	}
	return nil
}
