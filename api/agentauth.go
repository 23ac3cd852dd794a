package api

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Masters reach agents (for workers' logs) with requests signed by a key both read from
// the store (cluster.AgentKeyKey): the token is an HMAC of the request's method, path and
// query and of its expiry, so that a token read off the wire opens that one request, for a
// minute at most, and nothing else. Agents need no tenant tokens: the master checked the
// caller before it signed.

// AgentTokenTTL is how long a signed request stays valid; agents refuse tokens that claim
// more than AgentTokenMaxTTL (clocks of masters and agents may differ by a little).
const (
	AgentTokenTTL    = time.Minute
	AgentTokenMaxTTL = 5 * time.Minute
)

// ErrAgentToken: a request to an agent carries no valid signature.
var ErrAgentToken = errors.New("invalid agent request signature")

func agentMAC(key []byte, method, uri string, exp int64) string {
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s\n%s\n%d", method, uri, exp)
	return hex.EncodeToString(mac.Sum(nil))
}

// SignAgentRequest is the token for method on uri (path and query), valid until now+ttl.
func SignAgentRequest(key []byte, method, uri string, now time.Time, ttl time.Duration) string {
	exp := now.Add(ttl).Unix()
	return "sda1." + strconv.FormatInt(exp, 10) + "." + agentMAC(key, method, uri, exp)
}

// VerifyAgentRequest checks a token made by SignAgentRequest.
func VerifyAgentRequest(key []byte, method, uri, token string, now time.Time) error {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] != "sda1" {
		return fmt.Errorf("%w: malformed", ErrAgentToken)
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return fmt.Errorf("%w: malformed expiry", ErrAgentToken)
	}
	switch t := time.Unix(exp, 0); {
	case now.After(t):
		return fmt.Errorf("%w: expired %s ago (are the clocks of master and agent apart?)", ErrAgentToken, now.Sub(t).Round(time.Second))
	case t.Sub(now) > AgentTokenMaxTTL:
		return fmt.Errorf("%w: valid for longer than %s", ErrAgentToken, AgentTokenMaxTTL)
	}
	if !hmac.Equal([]byte(parts[2]), []byte(agentMAC(key, method, uri, exp))) {
		return fmt.Errorf("%w: signature does not match", ErrAgentToken)
	}
	return nil
}
