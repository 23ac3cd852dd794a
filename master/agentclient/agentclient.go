// Package agentclient is how masters reach the agents' signed endpoint (workers' logs, job
// metrics): requests signed with the cluster's agent key, over TLS pinned to each agent's
// certificate as its node record publishes it.
package agentclient

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// maxIdle bounds the idle connections a master keeps to agents, per transport.
const maxIdle = 512

// maxSessions bounds the TLS sessions kept to resume (one per agent address, some 1 KB each
// with the agent's certificate): more than the agents of the largest cluster, since a
// master pulls them in turn and an LRU smaller than that would evict each before its reuse.
const maxSessions = 25000

// ErrNoEndpoint: the node's record says of no endpoint the master can reach.
var ErrNoEndpoint = errors.New("no agent endpoint")

// Client signs requests to agents and holds the transports to them.
type Client struct {
	store coord.KV

	mu   sync.Mutex
	key  []byte
	pins map[string]string // TLS agents' certificate hashes, by address

	plain, tls *http.Transport
	// sessions resume the TLS sessions of agents dialled again (a master keeps maxIdle
	// connections open, far fewer than the agents it pulls each interval): a resumption
	// skips the signature and the certificate's parsing on both sides. The pin is checked
	// on resumptions too (tls.Config.VerifyConnection runs for every connection).
	sessions tls.ClientSessionCache
}

// New returns a client that reads (or makes, at its first use) the agent key in store.
func New(store coord.KV) *Client {
	c := &Client{store: store, pins: map[string]string{}, sessions: tls.NewLRUClientSessionCache(maxSessions)}
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	base := func() *http.Transport {
		// At most maxIdle connections kept open in all: a master pulls every agent's
		// metrics each interval, and one idle connection per agent would cost some 25 KB
		// each at ten thousand agents. Beyond them a pull dials again (tens of
		// microseconds).
		return &http.Transport{Proxy: nil, DialContext: dialer.DialContext, TLSHandshakeTimeout: 5 * time.Second,
			ResponseHeaderTimeout: 10 * time.Second, MaxIdleConnsPerHost: 2, MaxIdleConns: maxIdle, IdleConnTimeout: time.Minute}
	}
	c.plain = base()
	c.tls = base()
	// One transport for every TLS agent: each connection checks the certificate pinned for
	// the address it dials (the name check is replaced by the pin: the certificate is the
	// agent's own, self-signed).
	c.tls.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c.mu.Lock()
		want := c.pins[addr]
		c.mu.Unlock()
		if want == "" {
			return nil, fmt.Errorf("%w: no certificate known for %s", ErrNoEndpoint, addr)
		}
		raw, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cfg := api.PinnedTLS(want)
		cfg.ClientSessionCache = c.sessions
		conn := tls.Client(raw, cfg)
		if err := conn.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, err
		}
		return conn, nil
	}
	return c
}

// Key reads the agent key, making it at the first use.
func (c *Client) Key(ctx context.Context) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.key != nil {
		return c.key, nil
	}
	for range 3 {
		e, err := c.store.Get(ctx, cluster.AgentKeyKey)
		if err == nil {
			key, err := hex.DecodeString(string(e.Value))
			if err != nil || len(key) < 16 {
				return nil, fmt.Errorf("the agent key at %s is not readable", cluster.AgentKeyKey)
			}
			c.key = key
			return key, nil
		}
		if !errors.Is(err, coord.ErrNotFound) {
			return nil, fmt.Errorf("read the agent key: %w", err)
		}
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		if _, err := c.store.Create(ctx, cluster.AgentKeyKey, []byte(hex.EncodeToString(key)), coord.Persistent); err == nil {
			c.key = key
			return key, nil
		} else if !errors.Is(err, coord.ErrExists) {
			return nil, fmt.Errorf("store the agent key: %w", err)
		}
	}
	return nil, errors.New("the agent key keeps changing")
}

// Transport is the transport to the agent at addr (its node's advertised address) with
// endpoint ep: over TLS it trusts the certificate ep names, and no other.
func (c *Client) Transport(addr string, ep *cluster.LogsEndpoint) *http.Transport {
	if !ep.TLS {
		return c.plain
	}
	c.mu.Lock()
	if len(c.pins) > 100000 {
		c.pins = map[string]string{} // nodes come and go: start over now and then
	}
	c.pins[net.JoinHostPort(addr, strconv.Itoa(ep.Port))] = ep.CertSHA256
	c.mu.Unlock()
	return c.tls
}

// URL is the base URL of the node's agent endpoint (scheme://host:port), or why there is
// none.
func URL(rec cluster.NodeRecord) (string, error) {
	switch {
	case rec.Logs == nil:
		return "", fmt.Errorf("%w: the agent of node %s serves no endpoint (it runs without --logs-listen, or predates it)", ErrNoEndpoint, rec.Node.ID)
	case rec.Node.Addr == "":
		// Guessing would reach the master's own host, not the node's.
		return "", fmt.Errorf("%w: node %s advertises no address: restart its agent with --advertise-addr (agents set one by default)", ErrNoEndpoint, rec.Node.ID)
	}
	scheme := "http"
	if rec.Logs.TLS {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(rec.Node.Addr, strconv.Itoa(rec.Logs.Port)), nil
}

// Get makes a GET of uri (path and query) on the node's agent, signed for that request
// alone.
func (c *Client) Get(ctx context.Context, rec cluster.NodeRecord, uri string) (*http.Response, error) {
	base, err := URL(rec)
	if err != nil {
		return nil, err
	}
	key, err := c.Key(ctx)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+uri, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+api.SignAgentRequest(key, http.MethodGet, uri, time.Now(), api.AgentTokenTTL))
	return (&http.Client{Transport: c.Transport(rec.Node.Addr, rec.Logs)}).Do(req)
}

// CloseIdleConnections closes the connections kept to agents.
func (c *Client) CloseIdleConnections() {
	c.plain.CloseIdleConnections()
	c.tls.CloseIdleConnections()
}
