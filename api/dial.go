package api

import (
	"context"
	"net"
	"net/http"
)

// WithDialer returns a copy of the client whose connections to the master are opened by dial:
// for a master reached through something other than this machine's own network (a host of a
// test network lab, a tunnel). Everything else of the client stays as it was.
func (c *Client) WithDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *Client {
	base, ok := c.http.Transport.(*http.Transport)
	if !ok || base == nil {
		base = http.DefaultTransport.(*http.Transport)
	}
	tr := base.Clone()
	tr.DialContext = dial
	hc := *c.http
	hc.Transport = tr
	cc := *c
	cc.http = &hc
	return &cc
}
