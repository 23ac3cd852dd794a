package multidc

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stormdock/stormdock/internal/cmdline"
)

// RouterCommand is the name of the stormdock subcommand that runs a mirrored job's output
// router. The master writes its command line into the job's router worker with
// RouterArgs.Args; the subcommand reads it with RouterArgs.Parse.
const RouterCommand = "router"

// ErrRouterArgs is Parse's error for positional arguments: the router takes flags only.
var ErrRouterArgs = errors.New("router takes no arguments")

// RouterArgs is the command line of `stormdock router`.
type RouterArgs struct {
	// Store, SessionTimeout and StoreCredentialsFile are the flags every stormdock process
	// that opens the store takes (--store, --session-timeout, --store-credentials-file).
	// The credentials themselves never go on the command line.
	Store                string
	SessionTimeout       time.Duration
	StoreCredentialsFile string
	// StoreCA, StoreCert and StoreKey name a zks:// store's TLS files (--store-ca,
	// --store-cert, --store-key); the agent gives them in the environment.
	StoreCA, StoreCert, StoreKey string

	Job   string
	Links []string // in order of preference; --links is comma-separated
	// TokenHash is the hash of the job's sender token (Config.TokenHash): not a secret.
	TokenHash string
	// LinkTokenHashes are the hashes of the links' sender tokens (Config.LinkTokenHashes);
	// --link-token-hashes is LINK=HEX,LINK=HEX.
	LinkTokenHashes map[string]string
	Sink            string // file:///SINKDIR/TENANT/PATH[?fsync=...], http(s)://HOST/PATH, postgres://..., nats://... (OpenSink)
	// SinkPasswordFile names the file holding the sink's password or token (a tenant
	// secret delivered to the router as a file); $VARIABLES in it are expanded from the
	// router's environment. The credential itself is never on the command line.
	SinkPasswordFile string
	// SinkDir confines a file sink below SinkDir/Tenant (SinkOptions); the agent gives it
	// (env STORMDOCK_SINK_DIR, STORMDOCK_TENANT).
	SinkDir string
	Tenant  string
	// DC is the data center the router runs in (Config.DC); the agent gives it (env
	// STORMDOCK_DC).
	DC     string
	Listen string
	// OutputSecret names the job's output secret (--output-secret), the sink's credentials:
	// the file SecretsDir/OutputSecret, which the agent delivers (env STORMDOCK_SECRETS_DIR
	// gives SecretsDir). See OutputCredential.
	OutputSecret string
	SecretsDir   string
	// TLSCert and TLSKey are the API's certificate and key (HTTPS); the agent issues them
	// from the router CA and names them in the environment (EnvRouterCert, EnvRouterKey).
	TLSCert, TLSKey string
	MaxBody         int64 // Config.MaxBody

	HeartbeatTimeout   time.Duration
	CloseGrace         time.Duration
	CheckpointInterval time.Duration
	BufferRecords      int64 // Limits.Window
	BufferBytes        int64 // Limits.Bytes
}

// DefaultRouterArgs returns the values of the flags a command line leaves out: start from
// it to build one.
func DefaultRouterArgs() RouterArgs {
	return RouterArgs{
		SessionTimeout:     2 * time.Second,
		Listen:             "127.0.0.1:7090",
		HeartbeatTimeout:   400 * time.Millisecond,
		CheckpointInterval: 100 * time.Millisecond,
		BufferRecords:      8192,
		BufferBytes:        32 << 20,
		MaxBody:            DefaultMaxBody,
	}
}

// flags binds the flags of `stormdock router` to a's fields, with their defaults.
// --links goes through links, split by Parse.
func (a *RouterArgs) flags(links, linkHashes *string) *flag.FlagSet {
	d := DefaultRouterArgs()
	fs := cmdline.NewFlagSet(RouterCommand)
	fs.StringVar(&a.Store, "store", d.Store, "coordination store `URL`: zk://HOST:PORT[,HOST:PORT]/CHROOT (zks:// for TLS), file:///PATH or mem://NAME (required; env STORMDOCK_STORE)")
	fs.DurationVar(&a.SessionTimeout, "session-timeout", d.SessionTimeout, "store session timeout: how fast a lost process is noticed")
	fs.StringVar(&a.StoreCredentialsFile, "store-credentials-file", d.StoreCredentialsFile, "`FILE` holding USER:PASS for ZooKeeper digest ACLs (env STORMDOCK_STORE_CREDENTIALS_FILE, or USER:PASS in STORMDOCK_STORE_CREDENTIALS)")
	fs.StringVar(&a.StoreCA, "store-ca", d.StoreCA, "`FILE` (PEM) with the CA that signed the ZooKeeper servers' certificates, for a zks:// store (env STORMDOCK_STORE_CA)")
	fs.StringVar(&a.StoreCert, "store-cert", d.StoreCert, "client certificate `FILE` (PEM) for ZooKeeper servers that ask for one (env STORMDOCK_STORE_CERT)")
	fs.StringVar(&a.StoreKey, "store-key", d.StoreKey, "`FILE` (PEM) with the key of --store-cert (env STORMDOCK_STORE_KEY)")
	fs.StringVar(&a.Job, "job", d.Job, "the mirrored `JOB` (required)")
	fs.StringVar(&a.TokenHash, "token-hash", d.TokenHash, "`HEX` SHA-256 of the job's sender token: requests without the token are refused (required)")
	fs.StringVar(links, "links", strings.Join(d.Links, ","), "the job's `LINKS`, comma-separated, in order of preference (required)")
	fs.StringVar(linkHashes, "link-token-hashes", "", "`LINK=HEX,...` SHA-256 of each link's sender token: a link's records are taken with its own token only")
	fs.StringVar(&a.Sink, "sink", d.Sink, "output `URL`: file:///SINKDIR/TENANT/PATH[?fsync=checkpoint|always|never], http(s)://HOST/PATH, postgres://USER@HOST:PORT/DB?table=NAME or nats://HOST:PORT/SUBJECT[?tls=true] (required; with a credential, an encrypted one unless on loopback)")
	fs.StringVar(&a.SinkPasswordFile, "sink-password-file", d.SinkPasswordFile, "`FILE` holding the sink's password (postgres) or password or token (nats), read at every connect; $VARIABLES are expanded")
	fs.StringVar(&a.SinkDir, "sink-dir", d.SinkDir, "`DIR` below which file sinks live, as SINKDIR/TENANT/... (env STORMDOCK_SINK_DIR, set by the agent; none: file sinks refused)")
	fs.StringVar(&a.Tenant, "tenant", d.Tenant, "the job's `TENANT`, whose part of --sink-dir a file sink is in (env STORMDOCK_TENANT)")
	fs.StringVar(&a.DC, "dc", d.DC, "the data center `DC` the router runs in: a live link in another one is kept active, so that one data center's loss never takes the router and the active link at once (env STORMDOCK_DC, set by the agent)")
	fs.StringVar(&a.OutputSecret, "output-secret", d.OutputSecret, "the tenant secret `NAME` that holds the sink's credentials (an HTTP sink sends it as a bearer token)")
	fs.StringVar(&a.SecretsDir, "secrets-dir", d.SecretsDir, "`DIR` the router's secrets are files in (env STORMDOCK_SECRETS_DIR, set by the agent)")
	fs.StringVar(&a.TLSCert, "tls-cert", d.TLSCert, "`FILE` (PEM) with the API's certificate: it serves HTTPS (env STORMDOCK_ROUTER_CERT, set by the agent)")
	fs.StringVar(&a.TLSKey, "tls-key", d.TLSKey, "`FILE` (PEM) with the key of --tls-cert (env STORMDOCK_ROUTER_KEY)")
	fs.Int64Var(&a.MaxBody, "max-body", d.MaxBody, "`BYTES` a records request's body may hold (413 above)")
	fs.StringVar(&a.Listen, "listen", d.Listen, "`ADDR` of the ingest and status API")
	fs.DurationVar(&a.HeartbeatTimeout, "heartbeat-timeout", d.HeartbeatTimeout, "a link whose workers are silent this long fails over")
	fs.DurationVar(&a.CloseGrace, "close-grace", d.CloseGrace, "a worker whose connection closed and that is silent this long counts as dead (0: heartbeat-timeout/2, negative: off)")
	fs.DurationVar(&a.CheckpointInterval, "checkpoint-interval", d.CheckpointInterval, "how often the delivered offset is synced and saved")
	fs.Int64Var(&a.BufferRecords, "buffer-records", d.BufferRecords, "per link: how far ahead of the delivered offset records are held")
	fs.Int64Var(&a.BufferBytes, "buffer-bytes", d.BufferBytes, "per link: bytes of records held")
	return fs
}

// Args is the command line of `stormdock router` for a, after the subcommand's name. The
// store, job, links, sink and listen address are always written; the other flags only when
// they differ from DefaultRouterArgs. Parse reads it back.
func (a RouterArgs) Args() []string {
	d := DefaultRouterArgs()
	args := []string{"--store", a.Store, "--job", a.Job, "--links", strings.Join(a.Links, ","), "--sink", a.Sink, "--listen", a.Listen}
	if a.TokenHash != d.TokenHash {
		args = append(args, "--token-hash", a.TokenHash)
	}
	if len(a.LinkTokenHashes) > 0 {
		var kv []string
		for _, l := range slices.Sorted(maps.Keys(a.LinkTokenHashes)) {
			kv = append(kv, l+"="+a.LinkTokenHashes[l])
		}
		args = append(args, "--link-token-hashes", strings.Join(kv, ","))
	}
	if a.SinkDir != d.SinkDir {
		args = append(args, "--sink-dir", a.SinkDir)
	}
	if a.SinkPasswordFile != d.SinkPasswordFile {
		args = append(args, "--sink-password-file", a.SinkPasswordFile)
	}
	if a.Tenant != d.Tenant {
		args = append(args, "--tenant", a.Tenant)
	}
	if a.DC != d.DC {
		args = append(args, "--dc", a.DC)
	}
	if a.OutputSecret != d.OutputSecret {
		args = append(args, "--output-secret", a.OutputSecret)
	}
	if a.SecretsDir != d.SecretsDir {
		args = append(args, "--secrets-dir", a.SecretsDir)
	}
	dur := func(name string, v, def time.Duration) {
		if v != def {
			args = append(args, "--"+name, v.String())
		}
	}
	num := func(name string, v, def int64) {
		if v != def {
			args = append(args, "--"+name, strconv.FormatInt(v, 10))
		}
	}
	dur("session-timeout", a.SessionTimeout, d.SessionTimeout)
	if a.StoreCredentialsFile != d.StoreCredentialsFile {
		args = append(args, "--store-credentials-file", a.StoreCredentialsFile)
	}
	for _, f := range [][2]string{{"store-ca", a.StoreCA}, {"store-cert", a.StoreCert}, {"store-key", a.StoreKey}} {
		if f[1] != "" {
			args = append(args, "--"+f[0], f[1])
		}
	}
	dur("heartbeat-timeout", a.HeartbeatTimeout, d.HeartbeatTimeout)
	dur("close-grace", a.CloseGrace, d.CloseGrace)
	dur("checkpoint-interval", a.CheckpointInterval, d.CheckpointInterval)
	num("buffer-records", a.BufferRecords, d.BufferRecords)
	num("buffer-bytes", a.BufferBytes, d.BufferBytes)
	num("max-body", a.MaxBody, d.MaxBody)
	return args
}

// Parse sets a from a command line of `stormdock router` after the subcommand's name, the
// flags it leaves out from DefaultRouterArgs. --store, --job, --links and --sink are
// required; --links is split at commas, blanks trimmed and empty names dropped. A positional
// argument gives ErrRouterArgs, -h or --help flag.ErrHelp. On error a is left as it was.
func (a *RouterArgs) Parse(args []string) error {
	var p RouterArgs
	var links, linkHashes string
	fs := p.flags(&links, &linkHashes)
	if err := cmdline.Parse(fs, args, "store", "job", "links", "sink"); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w, got %q", ErrRouterArgs, fs.Args())
	}
	for _, l := range strings.Split(links, ",") {
		if l = strings.TrimSpace(l); l != "" {
			p.Links = append(p.Links, l)
		}
	}
	for _, kv := range strings.Split(linkHashes, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		l, h, ok := strings.Cut(kv, "=")
		if !ok || l == "" || h == "" {
			return fmt.Errorf("--link-token-hashes: %q: want LINK=HEX", kv)
		}
		if p.LinkTokenHashes == nil {
			p.LinkTokenHashes = map[string]string{}
		}
		p.LinkTokenHashes[l] = h
	}
	*a = p
	return nil
}

// RouterUsage lists the flags of `stormdock router`, for its help.
func RouterUsage() string {
	var a RouterArgs
	var links, linkHashes string
	return cmdline.Usage(a.flags(&links, &linkHashes))
}
