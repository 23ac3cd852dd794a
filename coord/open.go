package coord

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Defaults for Options.
const (
	DefaultSessionTimeout = 10 * time.Second
	DefaultConnectTimeout = 5 * time.Second
)

// Options configure a client.
type Options struct {
	// SessionTimeout is how long the session outlives a silent client (ZooKeeper negotiates
	// it within the server's 2..20 tickTime bounds). For embedded clients it arms a
	// keepalive: a client that stops sending them loses its session. 0 means the default;
	// for embedded clients a negative value means sessions never time out.
	SessionTimeout time.Duration
	// ConnectTimeout bounds Open's wait for the first session (ZooKeeper only).
	ConnectTimeout time.Duration
	// Credentials "user:pass": the client authenticates with them and every entry it
	// creates is writable and readable by these credentials only (ZooKeeper digest ACL).
	// Ignored by the embedded store.
	Credentials string
	// Logger receives the client's logs; nil means slog.Default().
	Logger *slog.Logger
	// Dialer replaces net.DialTimeout for ZooKeeper connections (proxies, fault injection).
	Dialer func(network, address string, timeout time.Duration) (net.Conn, error)
	// TLS names the PEM files of a zks:// store's TLS: the CA that signed the servers'
	// certificates, and the client certificate for servers that ask for one. Ignored by
	// zk:// and the embedded store.
	TLS TLSFiles
	// BufferSize sets a ZooKeeper client's send and receive buffers, and so the largest
	// request and answer it handles (ZooKeeper only). 0 keeps the zk library's 1.5 MiB each,
	// which a process holding thousands of sessions (simulated agents) cannot afford for
	// every one.
	BufferSize int

	tls *tls.Config // from TLS, set by Open for zks:// URLs
}

func (o Options) withDefaults() Options {
	if o.SessionTimeout == 0 {
		o.SessionTimeout = DefaultSessionTimeout
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Target is a parsed store URL.
//
//	zk://[user:pass@]host[:port][,host[:port]...][/chroot]   ZooKeeper ensemble, default port 2181
//	zks://[user:pass@]host[:port][,host[:port]...][/chroot]  the same over TLS (secureClientPort)
//	mem://                                                  a private in-memory store
//	mem://NAME                                              the process-wide in-memory store NAME
//	file:///abs/path/store.json                             in-process store persisted to a file
//
// mem://NAME and file:// URLs opened several times in one process share one embedded
// server, each Open being a client with its own session (a local cluster's master and
// agents). The server goes away when its last client closes.
type Target struct {
	Scheme      string   // "zk" (also for zks://), "mem" or "file"
	TLS         bool     // zk: zks://, the servers speak TLS
	Servers     []string // zk: host:port list
	Chroot      string   // zk: "" or a clean absolute path
	Name        string   // mem: "" for a private store
	Path        string   // file: absolute, cleaned
	Credentials string   // zk: "user:pass" from the URL's user info
}

// ParseURL parses a store URL (see Target).
func ParseURL(raw string) (Target, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return Target{}, fmt.Errorf("%w: store URL %q: want zk://, zks://, mem:// or file://", ErrInvalid, raw)
	}
	switch scheme {
	case "zk":
		return parseZKURL(raw, rest)
	case "zks":
		t, err := parseZKURL(raw, rest)
		t.TLS = err == nil
		return t, err
	case "mem":
		if strings.ContainsAny(rest, "/?#@:") {
			return Target{}, fmt.Errorf("%w: store URL %q: mem://NAME takes a plain name", ErrInvalid, raw)
		}
		return Target{Scheme: "mem", Name: rest}, nil
	case "file":
		u, err := url.Parse(raw)
		if err != nil {
			return Target{}, fmt.Errorf("%w: store URL %q: %v", ErrInvalid, raw, err)
		}
		if u.Host != "" && u.Host != "localhost" {
			return Target{}, fmt.Errorf("%w: store URL %q: file URLs take no host (file:///abs/path)", ErrInvalid, raw)
		}
		if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return Target{}, fmt.Errorf("%w: store URL %q: unexpected query, fragment or user", ErrInvalid, raw)
		}
		if !strings.HasPrefix(u.Path, "/") || len(u.Path) < 2 || strings.HasSuffix(u.Path, "/") || strings.ContainsRune(u.Path, 0) {
			return Target{}, fmt.Errorf("%w: store URL %q: want an absolute file path", ErrInvalid, raw)
		}
		return Target{Scheme: "file", Path: filepath.Clean(u.Path)}, nil
	}
	return Target{}, fmt.Errorf("%w: store URL %q: unknown scheme %q", ErrInvalid, raw, scheme)
}

func parseZKURL(raw, rest string) (Target, error) {
	t := Target{Scheme: "zk"}
	hosts, path, _ := strings.Cut(rest, "/")
	if i := strings.LastIndexByte(hosts, '@'); i >= 0 {
		t.Credentials, hosts = hosts[:i], hosts[i+1:]
		user, _, ok := strings.Cut(t.Credentials, ":")
		if !ok || user == "" {
			return Target{}, fmt.Errorf("%w: store URL %q: credentials must be user:pass", ErrInvalid, redact(raw))
		}
	}
	if hosts == "" {
		return Target{}, fmt.Errorf("%w: store URL %q: no ZooKeeper server", ErrInvalid, redact(raw))
	}
	for _, h := range strings.Split(hosts, ",") {
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			host, port = h, "2181"
			if strings.Contains(h, ":") && !strings.HasPrefix(h, "[") {
				return Target{}, fmt.Errorf("%w: store URL %q: bad server %q", ErrInvalid, redact(raw), h)
			}
			host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || host == "" || strings.ContainsAny(host, "/?#@[] ") {
			return Target{}, fmt.Errorf("%w: store URL %q: bad server %q", ErrInvalid, redact(raw), h)
		}
		t.Servers = append(t.Servers, net.JoinHostPort(host, strconv.Itoa(n)))
	}
	if strings.ContainsAny(path, "?#") {
		return Target{}, fmt.Errorf("%w: store URL %q: unexpected query or fragment", ErrInvalid, redact(raw))
	}
	if path = strings.TrimSuffix(path, "/"); path != "" {
		t.Chroot = "/" + path
		if err := ValidateKey(t.Chroot); err != nil {
			return Target{}, fmt.Errorf("store URL %q: chroot: %w", redact(raw), err)
		}
	}
	return t, nil
}

// String formats the target as a URL, without credentials.
func (t Target) String() string {
	switch t.Scheme {
	case "zk":
		if t.TLS {
			return "zks://" + strings.Join(t.Servers, ",") + t.Chroot
		}
		return "zk://" + strings.Join(t.Servers, ",") + t.Chroot
	case "mem":
		return "mem://" + t.Name
	case "file":
		return (&url.URL{Scheme: "file", Path: t.Path}).String()
	}
	return ""
}

func redact(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	hosts, path, hasPath := strings.Cut(rest, "/")
	if i := strings.LastIndexByte(hosts, '@'); i >= 0 {
		hosts = "REDACTED@" + hosts[i+1:]
	}
	if hasPath {
		return scheme + "://" + hosts + "/" + path
	}
	return scheme + "://" + hosts
}

// Open connects a client to the store named by rawURL (see Target). For ZooKeeper it waits
// for a session for at most opts.ConnectTimeout (or until ctx is done).
func Open(ctx context.Context, rawURL string, opts Options) (Store, error) {
	t, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	switch t.Scheme {
	case "zk":
		if opts.Credentials == "" {
			opts.Credentials = t.Credentials
		}
		if t.TLS {
			cfg, err := opts.TLS.clientConfig()
			if err != nil {
				return nil, fmt.Errorf("store %s: %w", t, err)
			}
			opts.tls = cfg
		}
		// A failed open returns a nil Store, not a Store holding a nil *ZK: callers test
		// the result against nil (an agent that closed a nil *ZK crashed).
		s, err := OpenZK(ctx, t.Servers, t.Chroot, opts)
		if err != nil && t.TLS {
			var te *tlsError
			if errors.As(err, &te) {
				return nil, fmt.Errorf("store %s: %w", t, te)
			}
		}
		if err != nil {
			return nil, err
		}
		return s, nil
	default:
		s, err := OpenEmbedded(t, opts)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
}
