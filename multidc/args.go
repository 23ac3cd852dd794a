package multidc

import (
	"errors"
	"flag"
	"fmt"
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

	Job   string
	Links []string // in order of preference; --links is comma-separated
	// TokenHash is the hash of the job's sender token (Config.TokenHash): not a secret.
	TokenHash string
	Sink      string // file:///PATH[?fsync=...] or http(s)://HOST/PATH (OpenSink)
	Listen    string

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
		HeartbeatTimeout:   600 * time.Millisecond,
		CheckpointInterval: 100 * time.Millisecond,
		BufferRecords:      8192,
		BufferBytes:        32 << 20,
	}
}

// flags binds the flags of `stormdock router` to a's fields, with their defaults.
// --links goes through links, split by Parse.
func (a *RouterArgs) flags(links *string) *flag.FlagSet {
	d := DefaultRouterArgs()
	fs := cmdline.NewFlagSet(RouterCommand)
	fs.StringVar(&a.Store, "store", d.Store, "coordination store `URL`: zk://HOST:PORT[,HOST:PORT]/CHROOT, file:///PATH or mem://NAME (required; env STORMDOCK_STORE)")
	fs.DurationVar(&a.SessionTimeout, "session-timeout", d.SessionTimeout, "store session timeout: how fast a lost process is noticed")
	fs.StringVar(&a.StoreCredentialsFile, "store-credentials-file", d.StoreCredentialsFile, "`FILE` holding USER:PASS for ZooKeeper digest ACLs (env STORMDOCK_STORE_CREDENTIALS_FILE, or USER:PASS in STORMDOCK_STORE_CREDENTIALS)")
	fs.StringVar(&a.Job, "job", d.Job, "the mirrored `JOB` (required)")
	fs.StringVar(&a.TokenHash, "token-hash", d.TokenHash, "`HEX` SHA-256 of the job's sender token: requests without the token are refused (required)")
	fs.StringVar(links, "links", strings.Join(d.Links, ","), "the job's `LINKS`, comma-separated, in order of preference (required)")
	fs.StringVar(&a.Sink, "sink", d.Sink, "output `URL`: file:///PATH[?fsync=checkpoint|always|never] or http(s)://HOST/PATH (required)")
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
	dur("heartbeat-timeout", a.HeartbeatTimeout, d.HeartbeatTimeout)
	dur("close-grace", a.CloseGrace, d.CloseGrace)
	dur("checkpoint-interval", a.CheckpointInterval, d.CheckpointInterval)
	num("buffer-records", a.BufferRecords, d.BufferRecords)
	num("buffer-bytes", a.BufferBytes, d.BufferBytes)
	return args
}

// Parse sets a from a command line of `stormdock router` after the subcommand's name, the
// flags it leaves out from DefaultRouterArgs. --store, --job, --links and --sink are
// required; --links is split at commas, blanks trimmed and empty names dropped. A positional
// argument gives ErrRouterArgs, -h or --help flag.ErrHelp. On error a is left as it was.
func (a *RouterArgs) Parse(args []string) error {
	var p RouterArgs
	var links string
	fs := p.flags(&links)
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
	*a = p
	return nil
}

// RouterUsage lists the flags of `stormdock router`, for its help.
func RouterUsage() string {
	var a RouterArgs
	var links string
	return cmdline.Usage(a.flags(&links))
}
