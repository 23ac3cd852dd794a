package api

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
)

// AdminTokenFile is the name of the admin token's file in a master's data directory (and,
// for a provisioned cluster, in the operator's clusters/NAME directory).
const AdminTokenFile = "admin.token"

// MetricsTokenFile is the name of the scrape token's file in a master's data directory: the
// token /metrics answers to (with the admin token), and which no other route takes.
const MetricsTokenFile = "metrics.token"

// URLFile is the name of the file in a master's data directory that holds the URL its API
// is served at (https:// when it serves TLS): the CLI's master when none is given.
const URLFile = "api.url"

// NewToken returns a fresh random API token.
func NewToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return "sdt_" + base64.RawURLEncoding.EncodeToString(b)
}

// HashToken is what the store keeps of a token: the token itself is never stored.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}
