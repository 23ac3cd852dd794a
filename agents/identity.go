package agents

import (
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/atomicfile"
)

// A node's identity: an Ed25519 key its agent signs requests to the masters with, and an
// X25519 key the masters seal its workers' secrets to (api/nodeauth.go). Both are made at
// the agent's first start and kept in its state directory (identityFile, 0600, the agent's
// alone); their public halves go into the node record, which only the cluster can write.
// A node whose state directory is lost gets new keys at its next start.

// identityFile holds the node's private keys (PKCS #8, PEM).
const identityFile = "node.identity"

type identity struct {
	sign ed25519.PrivateKey
	seal *ecdh.PrivateKey
}

// public is the node's identity as its record shows it.
func (id *identity) public() *cluster.NodeIdentity {
	return &cluster.NodeIdentity{Sign: id.sign.Public().(ed25519.PublicKey), Seal: id.seal.PublicKey().Bytes()}
}

// loadIdentity reads the node's keys from dir, making them when there are none.
func loadIdentity(dir string) (*identity, error) {
	p := filepath.Join(dir, identityFile)
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return newIdentity(p)
	}
	if err != nil {
		return nil, fmt.Errorf("agent: node identity: %w", err)
	}
	id := &identity{}
	for rest := b; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("agent: node identity %s: %w (remove it: the agent makes new keys)", p, err)
		}
		switch k := k.(type) {
		case ed25519.PrivateKey:
			id.sign = k
		case *ecdh.PrivateKey:
			if k.Curve() == ecdh.X25519() {
				id.seal = k
			}
		}
	}
	if id.sign == nil || id.seal == nil {
		return nil, fmt.Errorf("agent: node identity %s lacks a key (remove it: the agent makes new keys)", p)
	}
	return id, nil
}

func newIdentity(p string) (*identity, error) {
	_, sign, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("agent: node identity: %w", err)
	}
	seal, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("agent: node identity: %w", err)
	}
	var out []byte
	for _, k := range []any{sign, seal} {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			return nil, fmt.Errorf("agent: node identity: %w", err)
		}
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})...)
	}
	if err := atomicfile.WriteFile(p, out, 0o600); err != nil {
		return nil, fmt.Errorf("agent: node identity: %w", err)
	}
	return &identity{sign: sign, seal: seal}, nil
}
