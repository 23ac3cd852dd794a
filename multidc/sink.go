package multidc

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/stormdock/stormdock/cluster"
)

// FencingOptions tune the fencing sinks (OpenPGSink, OpenNATSSink).
type FencingOptions struct {
	// Job is the job whose output the sink is: a table or a subject is one job's alone.
	Job string
	// Router names this router in the sink's fence (its row, its fence messages).
	Router string
	// Password returns the credential each time the sink connects: the database role's
	// password, the NATS user's password (or, without a user in the URL, the server's
	// token). The router reads it from a file it is given, anew at every connect so that a
	// rotated secret is used; nil: none.
	Password func() ([]byte, error)
	// RootCAs verifies the certificates of a sink spoken to over TLS (a nats sink with
	// tls=true, a postgres sink with sslmode=verify-full or verify-ca); nil: the system's
	// roots, which SSL_CERT_FILE and SSL_CERT_DIR point elsewhere (a private CA) for the
	// router's process.
	RootCAs *x509.CertPool
	// Dial, when set, makes the sink's connections (tests through a network lab).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// WriteTimeout bounds one batch's write, a connect included. Default 10 s.
	WriteTimeout time.Duration
	Logger       *slog.Logger
}

func (o FencingOptions) withDefaults() FencingOptions {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 10 * time.Second
	}
	return o
}

// urlError leaves out what url.Parse repeats of its input, which may hold a password.
func urlError(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}

// Sink is where the router delivers the active link's records. Write is called by one
// goroutine at a time with records in offset order, each batch starting right after the
// previous one; a Write that fails is retried with the same offsets (from whichever link is
// active by then), so a sink must leave nothing of a failed batch behind or tolerate the
// repeat. A Kafka sink would implement the same three methods.
type Sink interface {
	Write(ctx context.Context, recs []Record) error
	// Sync makes everything written so far durable; the router calls it before each
	// checkpoint, so that the checkpoint never runs ahead of the sink.
	Sync(ctx context.Context) error
	Close() error
}

// ErrSinkBroken wraps sink errors after which the sink cannot say what it holds (a failed
// write that could not be undone): the router stops, and a restarted router recovers.
var ErrSinkBroken = errors.New("multidc: sink broken")

// SinkOptions tune OpenSink.
type SinkOptions struct {
	Job string // named in HTTP sink requests, the job a fencing sink's table or subject is
	// Router names the router in a fencing sink (its fence row, its fence messages).
	Router string
	// Password returns the credential of a postgres:// or nats:// sink each time it
	// connects: the router reads it from a file it is given, never from the URL, the spec,
	// a log or the environment. nil: none.
	Password func() ([]byte, error)
	// SinkDir and Tenant confine a file sink below SINKDIR/<tenant>/ (see FileSink); without
	// a SinkDir, file sinks are refused.
	SinkDir string
	Tenant  string
	// Evidence is what the router's record says of its file sink (see SinkEvidence).
	Evidence *SinkEvidence
	// Credential is the job's output secret, the sink's credentials (nil: none).
	Credential *Credential
	// RootCAs: see FencingOptions.RootCAs.
	RootCAs *x509.CertPool
	Logger  *slog.Logger
}

// OpenSink opens the sink named by a job's output URL:
//
//	file:///SINKDIR/TENANT/PATH[?fsync=checkpoint|always|never]   see FileSink
//	http://HOST/PATH, https://HOST/PATH                 see HTTPSink
//	postgres://USER@HOST:PORT/DB?table=NAME             see PGSink (fencing)
//	nats://HOST:PORT/SUBJECT[?stream=NAME][&tls=true]   see NATSSink (fencing)
//
// Opening a fencing sink takes it over: every router that opened it before is fenced off.
func OpenSink(ctx context.Context, raw string, opts SinkOptions) (Sink, error) {
	u, err := CheckSink(raw)
	if err != nil {
		return nil, err
	}
	if opts.Password != nil || opts.Credential != nil {
		// Checked at submit too; again here, where the credential leaves the host.
		if err := cluster.CheckOutputSecretTransport(raw); err != nil {
			return nil, fmt.Errorf("multidc: sink: %w", err)
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	switch u.Scheme {
	case "file":
		policy := FsyncPolicy(u.Query().Get("fsync"))
		if policy == "" {
			policy = FsyncCheckpoint
		}
		return OpenFileSink(opts.SinkDir, opts.Tenant, u.Path, FileSinkOptions{Policy: policy, Evidence: opts.Evidence})
	case "postgres", "postgresql":
		return OpenPGSink(ctx, raw, FencingOptions{Job: opts.Job, Router: opts.Router, Password: opts.Password, RootCAs: opts.RootCAs, Logger: opts.Logger})
	case "nats":
		return OpenNATSSink(ctx, raw, FencingOptions{Job: opts.Job, Router: opts.Router, Password: opts.Password, RootCAs: opts.RootCAs, Logger: opts.Logger})
	}
	return NewHTTPSink(raw, HTTPSinkOptions{Job: opts.Job, Credential: opts.Credential, Logger: opts.Logger}), nil
}

// Fences reports whether the sink a job's output URL names fences off earlier routers when
// a router opens it (PostgreSQL, JetStream): its routers take over on evidence (see
// Config.TakeOver).
func Fences(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql" || u.Scheme == "nats")
}

// CheckSink checks a job's output URL without opening the sink (see OpenSink).
func CheckSink(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("multidc: sink: %w", urlError(err))
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" || u.Path == "" || u.Path[0] != '/' {
			return nil, fmt.Errorf("multidc: sink %q: want file:///ABSOLUTE/PATH", raw)
		}
		return u, nil
	case "http", "https":
		if u.Host == "" {
			return nil, fmt.Errorf("multidc: sink %q: no host", u.Redacted())
		}
		return u, nil
	case "postgres", "postgresql":
		if _, err := cluster.ParsePostgresOutput(raw); err != nil {
			return nil, fmt.Errorf("multidc: postgres sink: %w", err)
		}
		return u, nil
	case "nats":
		if _, err := cluster.ParseNATSOutput(raw); err != nil {
			return nil, fmt.Errorf("multidc: nats sink: %w", err)
		}
		return u, nil
	}
	return nil, fmt.Errorf("multidc: sink %q: want file://, http(s)://, postgres:// or nats://", u.Redacted())
}

// appendLine appends the sink line of r: {"offset":N,"link":"L","record":{...}} and "\n".
// Data was checked to be one JSON object when it arrived, so the line is valid JSON.
func appendLine(b []byte, r Record) []byte {
	b = append(b, `{"offset":`...)
	b = strconv.AppendInt(b, r.Offset, 10)
	b = append(b, `,"link":`...)
	b = strconv.AppendQuote(b, r.Link) // link names are plain ASCII (cluster.CheckName)
	b = append(b, `,"record":`...)
	b = append(b, r.Data...)
	return append(b, "}\n"...)
}
