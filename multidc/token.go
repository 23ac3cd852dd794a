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

// Sender tokens. A router takes records only from the workers of its own job: every request
// but the read-only ones carries "Authorization: Bearer TOKEN", and the router compares the
// token's hash with the one it was started with (--token-hash). The token of a job is made
// when the job is submitted, as an HMAC of its name and submission time under the cluster's
// output key (cluster.OutputKeyKey, in the store): any master can make it again for the
// job's assignments, the job record keeps only its hash, and a job submitted again under the
// same name gets a new one. The agent writes a link worker's token to a file only that worker
// may read and names it in STORMDOCK_OUTPUT_TOKEN_FILE.

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

// authorized checks a request's bearer token against the router's token hash, counting
// failures per remote address (see api.FailLimiter).
//
// The check is cheap and comes first: workers share addresses (a node's, loopback here), and
// one that keeps failing must not lock its neighbours out, only itself get 429 and no log line.
func (r *Router) authorized(w http.ResponseWriter, req *http.Request) bool {
	token, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	reason := "missing"
	if ok && token != "" {
		h := api.HashToken(strings.TrimSpace(token))
		if subtle.ConstantTimeCompare([]byte(h), []byte(r.cfg.TokenHash)) == 1 {
			return true
		}
		reason = "invalid"
	}
	host := api.RemoteHost(req)
	if limited, wait := r.fails.Blocked(host); limited {
		r.m.authFailures.WithLabelValues("limited").Inc()
		w.Header().Set("Retry-After", fmt.Sprint(int(wait/time.Second)+1))
		api.Errorf(w, api.ErrRateLimited, fmt.Sprintf("too many failed token checks from %s: try again in %s", host, wait.Round(100*time.Millisecond)))
		return false
	}
	r.fails.Fail(host)
	r.m.authFailures.WithLabelValues(reason).Inc()
	r.log.Warn("sender token refused", "remote", req.RemoteAddr, "reason", reason, "path", req.URL.Path)
	writeError(w, fmt.Errorf("%w: %s sender token: only the workers of job %s may send to its router (the token is in the file $%s names)",
		api.ErrUnauthorized, reason, r.cfg.Job, EnvTokenFile))
	return false
}

// auth wraps a handler that needs the job's sender token.
func (r *Router) auth(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		if r.authorized(w, req) {
			h(w, req)
		}
	}
}
