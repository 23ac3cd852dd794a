package cluster

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// A mirrored job's output (JobSpec.Output) is a URL: file:///SINKDIR/TENANT/PATH,
// http(s)://HOST/PATH, postgres://USER@HOST:PORT/DB?table=NAME or
// nats://HOST:PORT/SUBJECT[?tls=true]. The database and broker forms are parsed here, at submit and
// where the router opens them, so that both read them alike. Credentials are never part of
// the URL: a password in it is refused.

// PostgresOutput is a postgres:// output: the rows go to Table (in Schema) of database DB.
type PostgresOutput struct {
	Host, Port string
	User, DB   string
	Schema     string // "" for the role's search path (public)
	Table      string
	SSLMode    string // "" for the driver's default (prefer)
}

// NATSOutput is a nats:// output: records are published to Subject, into the JetStream
// stream that takes it (or Stream, made when none does).
type NATSOutput struct {
	Servers []string // HOST:PORT each
	User    string   // "" for token or no authentication
	Subject string
	Stream  string
	// TLS (?tls=true): the router speaks TLS to the servers and verifies their
	// certificates; without it the connection is plain.
	TLS bool
}

// sqlIdent is what a postgres sink's schema and table may be called: lower-case, unquoted
// identifiers, so that no quoting rule separates what the operator reads from what the
// router writes.
var sqlIdent = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// dbName is a database or role name the sink URL may carry.
var dbName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$`)

var sslModes = []string{"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}

// ParsePostgresOutput parses postgres://USER@HOST[:PORT]/DB?table=[SCHEMA.]NAME[&sslmode=MODE].
func ParsePostgresOutput(raw string) (PostgresOutput, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return PostgresOutput{}, fmt.Errorf("not a URL: %v", urlErr(err))
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return PostgresOutput{}, fmt.Errorf("not a postgres:// URL")
	}
	var o PostgresOutput
	if u.User != nil {
		if _, has := u.User.Password(); has {
			return o, fmt.Errorf("a password is never written in the output URL (nor in the spec, a log or the environment): give it to the routers as the job's output secret")
		}
		o.User = u.User.Username()
	}
	if o.User == "" || !dbName.MatchString(o.User) {
		return o, fmt.Errorf("name the database role before the host: postgres://USER@HOST:PORT/DB?table=NAME")
	}
	if err := hostPort(u.Host, "5432", &o.Host, &o.Port); err != nil {
		return o, err
	}
	o.DB = strings.TrimPrefix(u.Path, "/")
	if o.DB == "" || !dbName.MatchString(o.DB) {
		return o, fmt.Errorf("name the database as the URL's path: postgres://USER@HOST:PORT/DB?table=NAME")
	}
	if u.Fragment != "" || u.RawFragment != "" {
		return o, fmt.Errorf("a postgres sink URL has no #fragment")
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return o, fmt.Errorf("query: %v", err)
	}
	for k, vs := range q {
		if len(vs) != 1 {
			return o, fmt.Errorf("?%s= is given %d times", k, len(vs))
		}
		switch k {
		case "table":
		case "sslmode":
			if !slices.Contains(sslModes, vs[0]) {
				return o, fmt.Errorf("sslmode=%q: want one of %s", vs[0], strings.Join(sslModes, ", "))
			}
			o.SSLMode = vs[0]
		default:
			return o, fmt.Errorf("?%s= is not a postgres sink parameter (they are table and sslmode)", k)
		}
	}
	t := q.Get("table")
	if schema, table, ok := strings.Cut(t, "."); ok {
		o.Schema, t = schema, table
		if !sqlIdent.MatchString(o.Schema) {
			return o, fmt.Errorf("table=%q: the schema must be a lower-case identifier ([a-z_][a-z0-9_]*)", q.Get("table"))
		}
	}
	if !sqlIdent.MatchString(t) {
		return o, fmt.Errorf("table=%q: name the table, a lower-case identifier ([a-z_][a-z0-9_]*, optionally SCHEMA.NAME)", q.Get("table"))
	}
	if strings.HasPrefix(t, "stormdock_") {
		return o, fmt.Errorf("table=%q: names beginning stormdock_ are the router's own", t)
	}
	o.Table = t
	return o, nil
}

// natsToken is one token of a NATS subject or a stream name: no wildcards, no blanks.
var natsToken = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ParseNATSOutput parses nats://[USER@]HOST:PORT[,HOST:PORT...]/SUBJECT[?stream=NAME][&tls=true].
func ParseNATSOutput(raw string) (NATSOutput, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return NATSOutput{}, fmt.Errorf("not a URL: %v", urlErr(err))
	}
	if u.Scheme != "nats" {
		return NATSOutput{}, fmt.Errorf("not a nats:// URL")
	}
	var o NATSOutput
	if u.User != nil {
		if _, has := u.User.Password(); has {
			return o, fmt.Errorf("a password or token is never written in the output URL (nor in the spec, a log or the environment): give it to the routers as the job's output secret")
		}
		o.User = u.User.Username()
		if !dbName.MatchString(o.User) {
			return o, fmt.Errorf("user %q: want letters, digits, _ . -", o.User)
		}
	}
	for _, hp := range strings.Split(u.Host, ",") {
		var h, p string
		if err := hostPort(hp, "4222", &h, &p); err != nil {
			return o, err
		}
		o.Servers = append(o.Servers, net.JoinHostPort(h, p))
	}
	o.Subject = strings.TrimPrefix(u.Path, "/")
	if o.Subject == "" {
		return o, fmt.Errorf("name the subject as the URL's path: nats://HOST:PORT/SUBJECT")
	}
	for _, tok := range strings.Split(o.Subject, ".") {
		if !natsToken.MatchString(tok) {
			return o, fmt.Errorf("subject %q: want dot-separated tokens of letters, digits, _ and - (no wildcards)", o.Subject)
		}
	}
	if u.Fragment != "" {
		return o, fmt.Errorf("a nats sink URL has no #fragment")
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return o, fmt.Errorf("query: %v", err)
	}
	for k, vs := range q {
		if len(vs) != 1 {
			return o, fmt.Errorf("?%s= is given %d times", k, len(vs))
		}
		switch k {
		case "stream":
			if !natsToken.MatchString(vs[0]) {
				return o, fmt.Errorf("stream=%q: want letters, digits, _ and -", vs[0])
			}
			o.Stream = vs[0]
		case "tls":
			switch vs[0] {
			case "true":
				o.TLS = true
			case "false":
			default:
				return o, fmt.Errorf("tls=%q: want tls=true (or false)", vs[0])
			}
		default:
			return o, fmt.Errorf("?%s= is not a nats sink parameter (they are stream=NAME and tls=true)", k)
		}
	}
	return o, nil
}

// hostName is a DNS name a sink URL may give as its host.
var hostName = regexp.MustCompile(`^[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})$`)

// hostPort splits HOST[:PORT] with a default port; the host must be there.
func hostPort(hp, defPort string, host, port *string) error {
	if hp == "" {
		return fmt.Errorf("no host: name the server as HOST:PORT")
	}
	h, p, err := net.SplitHostPort(hp)
	if err != nil {
		h, p = strings.Trim(hp, "[]"), defPort
	}
	if h == "" {
		return fmt.Errorf("no host in %q: name the server as HOST:PORT", hp)
	}
	// A host goes into a connection string (host=%s) and a server list: a name or an
	// address, nothing that could end the value.
	if net.ParseIP(h) == nil && !hostName.MatchString(h) {
		return fmt.Errorf("host %q: want a DNS name or an IP address", h)
	}
	if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q: want 1 to 65535", p)
	}
	*host, *port = h, p
	return nil
}

// urlErr leaves out what url.Parse repeats of the input: it may hold a password.
func urlErr(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}

// ErrSecretInClear is what CheckOutputSecretTransport reports: the sink would be sent the
// job's output secret unencrypted across a network.
var ErrSecretInClear = errors.New("the output secret would cross the network in clear")

// CheckOutputSecretTransport checks that a sink given the job's output secret (an HTTP
// bearer token, a role's password, a NATS password or token) receives it only encrypted:
// https://, postgres with sslmode=require, verify-ca or verify-full, nats with tls=true. A
// sink whose every host is loopback (localhost, 127.0.0.0/8, ::1) is exempt: the router
// talks to its own host and nothing crosses a network; a file sink needs no rule. The master
// checks it at submit and the router again before it reads the secret, so that neither a
// spec nor a hand-made command line sends it in clear. A refusal wraps ErrSecretInClear;
// any other error is the URL's own problem.
func CheckOutputSecretTransport(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("not a URL: %v", urlErr(err))
	}
	switch u.Scheme {
	case "file", "https":
		return nil
	case "http":
		if u.Host == "" || loopbackHost(u.Hostname()) {
			return nil
		}
		return fmt.Errorf("%w: http://%s would get it as a bearer token over plain HTTP: use https://", ErrSecretInClear, u.Host)
	case "postgres", "postgresql":
		o, err := ParsePostgresOutput(raw)
		if err != nil {
			return err
		}
		switch o.SSLMode {
		case "require", "verify-ca", "verify-full":
			return nil
		}
		if loopbackHost(o.Host) {
			return nil
		}
		mode := "sslmode=" + o.SSLMode
		if o.SSLMode == "" {
			mode = "no sslmode (the driver's prefer)"
		}
		return fmt.Errorf("%w: the postgres sink at %s with %s may send the role's password unencrypted: add sslmode=verify-full (or require, verify-ca) to the output URL", ErrSecretInClear, net.JoinHostPort(o.Host, o.Port), mode)
	case "nats":
		o, err := ParseNATSOutput(raw)
		if err != nil {
			return err
		}
		if o.TLS {
			return nil
		}
		var remote []string
		for _, s := range o.Servers {
			if h, _, _ := net.SplitHostPort(s); !loopbackHost(h) {
				remote = append(remote, s)
			}
		}
		if len(remote) == 0 {
			return nil
		}
		return fmt.Errorf("%w: the nats sink at %s would get the password or token over plain NATS: add ?tls=true to the output URL (the servers must serve TLS)", ErrSecretInClear, strings.Join(remote, ","))
	}
	return fmt.Errorf("%q is not a sink URL (file://, http(s)://, postgres:// or nats://)", u.Redacted())
}

// loopbackHost reports whether host names this machine's loopback interface.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
