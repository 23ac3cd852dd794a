package api

import (
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/hpke"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/stormdock/stormdock/cluster"
)

// Agents fetch their workers' secrets from the leading master (POST /v1/nodes/{id}/secrets).
// The node proves who it is by signing the request with its Ed25519 key, whose public half
// is in its node record (cluster.NodeIdentity; only the cluster can write the store), over
// the method, the path, an expiry and the body's digest: a request read off the wire opens
// nothing else and ages out within a minute. The master answers only for workers it
// assigned to that node, and seals the answer (HPKE: X25519, HKDF-SHA256, AES-256-GCM) to
// the node's X25519 key, bound to the node and to the request: only the node opens it, over
// TLS or not, and an answer replayed for another request does not open.

// NodeTokenTTL is how long a node's signed request stays valid; masters refuse one that
// claims longer than NodeTokenMaxTTL.
const (
	NodeTokenTTL    = time.Minute
	NodeTokenMaxTTL = 5 * time.Minute
)

// ErrNodeSignature: a node's request carries no valid signature.
var ErrNodeSignature = errors.New("invalid node request signature")

// NodeSecretsPath is the route of a node's secrets request.
func NodeSecretsPath(node string) string { return "/v1/nodes/" + node + "/secrets" }

// NodeSecretsRequest asks for the secrets of workers of the node, and for the registry
// credentials of tenants whose images it pulls.
type NodeSecretsRequest struct {
	Node    string              `json:"node"`
	Workers []cluster.WorkerKey `json:"workers,omitempty"`
	// RegistryAuth names tenants: the master answers for those with a worker (or an image
	// to pre-pull) in the node's assignment.
	RegistryAuth []string `json:"registryAuth,omitempty"`
}

// NodeSecretsReply carries the sealed NodeSecrets.
type NodeSecretsReply struct {
	Sealed []byte `json:"sealed"`
}

// NodeSecrets is what a NodeSecretsReply seals: each worker's secrets, or why it gets none.
type NodeSecrets struct {
	Workers      []WorkerSecrets      `json:"workers"`
	RegistryAuth []TenantRegistryAuth `json:"registryAuth,omitempty"`
}

// TenantRegistryAuth is a tenant's registry credentials (Docker's config.json; none when it
// has none), or why the node gets none.
type TenantRegistryAuth struct {
	Tenant string `json:"tenant"`
	Config []byte `json:"config,omitempty"`
	Error  string `json:"error,omitempty"`
}

// WorkerSecrets are one worker's secrets by name.
type WorkerSecrets struct {
	Key     cluster.WorkerKey `json:"key"`
	Secrets []SecretValue     `json:"secrets,omitempty"`
	// Error says why the worker gets none (not assigned to the node, a secret its tenant
	// lacks): one line, which the worker's state shows while it waits.
	Error string `json:"error,omitempty"`
}

// SecretValue is a secret with its value.
type SecretValue struct {
	Name    string `json:"name"`
	Version int64  `json:"version"`
	Value   []byte `json:"value"`
}

// Wipe overwrites the values it holds: what a caller does once they are written where they
// go, so that they stay in memory no longer than needed.
func (n *NodeSecrets) Wipe() {
	for _, w := range n.Workers {
		for _, s := range w.Secrets {
			clear(s.Value)
		}
	}
	for _, r := range n.RegistryAuth {
		clear(r.Config)
	}
}

func nodeSigned(method, path string, exp int64, body []byte) []byte {
	sum := sha256.Sum256(body)
	return fmt.Appendf(nil, "sdn1\n%s\n%s\n%d\n%x", method, path, exp, sum)
}

// SignNodeRequest is the Authorization value of a node's request: "Node sdn1.EXP.SIG".
func SignNodeRequest(key ed25519.PrivateKey, method, path string, body []byte, now time.Time, ttl time.Duration) string {
	exp := now.Add(ttl).Unix()
	sig := ed25519.Sign(key, nodeSigned(method, path, exp, body))
	return "Node sdn1." + strconv.FormatInt(exp, 10) + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// VerifyNodeRequest checks an Authorization value made by SignNodeRequest with the key whose
// public half is pub.
func VerifyNodeRequest(pub []byte, method, path string, body []byte, auth string, now time.Time) error {
	tok, ok := strings.CutPrefix(auth, "Node ")
	if !ok {
		return fmt.Errorf("%w: none", ErrNodeSignature)
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || parts[0] != "sdn1" {
		return fmt.Errorf("%w: malformed", ErrNodeSignature)
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return fmt.Errorf("%w: malformed expiry", ErrNodeSignature)
	}
	switch t := time.Unix(exp, 0); {
	case now.After(t):
		return fmt.Errorf("%w: expired %s ago (are the clocks of master and node apart?)", ErrNodeSignature, now.Sub(t).Round(time.Second))
	case t.Sub(now) > NodeTokenMaxTTL:
		return fmt.Errorf("%w: valid for longer than %s", ErrNodeSignature, NodeTokenMaxTTL)
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(pub) != ed25519.PublicKeySize || !ed25519.Verify(ed25519.PublicKey(pub), nodeSigned(method, path, exp, body), sig) {
		return fmt.Errorf("%w: signature does not match the node's key", ErrNodeSignature)
	}
	return nil
}

var (
	sealKEM  = hpke.DHKEM(ecdh.X25519())
	sealKDF  = hpke.HKDFSHA256()
	sealAEAD = hpke.AES256GCM()
)

func sealInfo(node string, request []byte) []byte {
	sum := sha256.Sum256(request)
	return fmt.Appendf(nil, "stormdock node secrets v1\x00%s\x00%x", node, sum)
}

// SealForNode seals plaintext to the node's X25519 public key (its NodeIdentity.Seal), bound
// to the node and the request body it answers.
func SealForNode(pub []byte, node string, request, plaintext []byte) ([]byte, error) {
	pk, err := sealKEM.NewPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("node %s's sealing key: %w", node, err)
	}
	return hpke.Seal(pk, sealKDF, sealAEAD, sealInfo(node, request), plaintext)
}

// OpenForNode opens what SealForNode sealed for the node, with its X25519 private key.
func OpenForNode(priv *ecdh.PrivateKey, node string, request, sealed []byte) ([]byte, error) {
	k, err := hpke.NewDHKEMPrivateKey(priv)
	if err != nil {
		return nil, err
	}
	out, err := hpke.Open(k, sealKDF, sealAEAD, sealInfo(node, request), sealed)
	if err != nil {
		return nil, fmt.Errorf("the master's answer does not open with node %s's key (sealed for another key, or another request): %w", node, err)
	}
	return out, nil
}
