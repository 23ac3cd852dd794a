package api

import (
	"bytes"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestNodeRequestSignature: a node's signature holds for its method, path and body until it
// expires, and for nothing else; another node's key does not make it.
func TestNodeRequestSignature(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	otherPub, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	now := time.Now()
	body := []byte(`{"node":"n1","workers":[{"job":"j","worker":0}]}`)
	auth := SignNodeRequest(priv, "POST", NodeSecretsPath("n1"), body, now, NodeTokenTTL)
	if err := VerifyNodeRequest(pub, "POST", NodeSecretsPath("n1"), body, auth, now); err != nil {
		t.Fatalf("a good signature: %v", err)
	}
	for name, tc := range map[string]struct {
		pub          []byte
		method, path string
		body         []byte
		auth         string
		at           time.Time
	}{
		"other path":       {pub, "POST", NodeSecretsPath("n2"), body, auth, now},
		"other method":     {pub, "GET", NodeSecretsPath("n1"), body, auth, now},
		"other body":       {pub, "POST", NodeSecretsPath("n1"), []byte(`{"node":"n1","workers":[{"job":"k","worker":0}]}`), auth, now},
		"expired":          {pub, "POST", NodeSecretsPath("n1"), body, auth, now.Add(2 * NodeTokenTTL)},
		"other node's key": {otherPub, "POST", NodeSecretsPath("n1"), body, auth, now},
		"signed by another": {pub, "POST", NodeSecretsPath("n1"), body,
			SignNodeRequest(otherPriv, "POST", NodeSecretsPath("n1"), body, now, NodeTokenTTL), now},
		"too long":  {pub, "POST", NodeSecretsPath("n1"), body, SignNodeRequest(priv, "POST", NodeSecretsPath("n1"), body, now, time.Hour), now},
		"bearer":    {pub, "POST", NodeSecretsPath("n1"), body, "Bearer x", now},
		"malformed": {pub, "POST", NodeSecretsPath("n1"), body, "Node sdn1.x.y", now},
		"no key":    {nil, "POST", NodeSecretsPath("n1"), body, auth, now},
	} {
		if err := VerifyNodeRequest(tc.pub, tc.method, tc.path, tc.body, tc.auth, tc.at); !errors.Is(err, ErrNodeSignature) {
			t.Errorf("%s: %v, want ErrNodeSignature", name, err)
		}
	}
}

// TestSealForNode: what the master seals for a node opens with that node's key, for that
// request alone.
func TestSealForNode(t *testing.T) {
	priv, _ := ecdh.X25519().GenerateKey(rand.Reader)
	other, _ := ecdh.X25519().GenerateKey(rand.Reader)
	req := []byte(`{"node":"n1"}`)
	plain := []byte(`{"workers":[{"key":{"job":"j","worker":0},"secrets":[{"name":"db","version":1,"value":"aHVudGVyMg=="}]}]}`)
	sealed, err := SealForNode(priv.PublicKey().Bytes(), "n1", req, plain)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("aHVudGVyMg")) || bytes.Contains(sealed, []byte("hunter2")) {
		t.Fatal("the sealed answer holds the value")
	}
	got, err := OpenForNode(priv, "n1", req, sealed)
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("open: %q %v", got, err)
	}
	for name, open := range map[string]func() ([]byte, error){
		"other node's key": func() ([]byte, error) { return OpenForNode(other, "n1", req, sealed) },
		"other node name":  func() ([]byte, error) { return OpenForNode(priv, "n2", req, sealed) },
		"other request":    func() ([]byte, error) { return OpenForNode(priv, "n1", []byte(`{"node":"n1","x":1}`), sealed) },
	} {
		if v, err := open(); err == nil || v != nil {
			t.Errorf("%s: opened %q", name, v)
		} else if !strings.Contains(err.Error(), "does not open") {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := SealForNode([]byte("short"), "n1", req, plain); err == nil {
		t.Error("sealed to a key that is not one")
	}
}
