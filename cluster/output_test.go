package cluster

import (
	"errors"
	"net"
	"strings"
	"testing"
)

func TestParsePostgresOutput(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want PostgresOutput
		err  string
	}{
		{raw: "postgres://app@db.example:5433/orders?table=out", want: PostgresOutput{Host: "db.example", Port: "5433", User: "app", DB: "orders", Table: "out"}},
		{raw: "postgresql://app@10.0.0.5/orders?table=sink.out&sslmode=verify-full", want: PostgresOutput{Host: "10.0.0.5", Port: "5432", User: "app", DB: "orders", Schema: "sink", Table: "out", SSLMode: "verify-full"}},
		{raw: "postgres://app:s3cret@db/orders?table=out", err: "a password is never written in the output URL"},
		{raw: "postgres://db/orders?table=out", err: "name the database role"},
		{raw: "postgres://app@/orders?table=out", err: "no host"},
		{raw: "postgres://app@db:99999/orders?table=out", err: "port"},
		{raw: "postgres://app@db/?table=out", err: "name the database"},
		{raw: "postgres://app@db/orders", err: "name the table"},
		{raw: "postgres://app@db/orders?table=Out", err: "lower-case identifier"},
		{raw: "postgres://app@db/orders?table=out;drop", err: "query"},
		{raw: "postgres://app@db/orders?table=out%3Bdrop", err: "lower-case identifier"},
		{raw: "postgres://app@db/orders?table=a.b.c", err: "lower-case identifier"},
		{raw: "postgres://app@db/orders?table=stormdock_fence", err: "the router's own"},
		{raw: "postgres://app@db/orders?table=out&sslmode=maybe", err: "sslmode"},
		{raw: "postgres://app@db/orders?table=out&password=x", err: "not a postgres sink parameter"},
		{raw: "postgres://app@db/orders?table=out&table=again", err: "given 2 times"},
		{raw: "postgres://app@db/orders?table=out#frag", err: "no #fragment"},
	} {
		got, err := ParsePostgresOutput(tc.raw)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.raw, err)
		case tc.err == "" && got != tc.want:
			t.Errorf("%s: %+v, want %+v", tc.raw, got, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want an error saying %q", tc.raw, err, tc.err)
		case err != nil && strings.Contains(err.Error(), "s3cret"):
			t.Errorf("%s: the error repeats the password: %v", tc.raw, err)
		}
	}
}

func TestParseNATSOutput(t *testing.T) {
	for _, tc := range []struct {
		raw     string
		servers []string
		subject string
		stream  string
		user    string
		tls     bool
		err     string
	}{
		{raw: "nats://10.0.0.9:4222/orders.out", servers: []string{"10.0.0.9:4222"}, subject: "orders.out"},
		{raw: "nats://a:4222,b:4223/out?stream=OUT", servers: []string{"a:4222", "b:4223"}, subject: "out", stream: "OUT"},
		{raw: "nats://router@nats/out", servers: []string{"nats:4222"}, subject: "out", user: "router"},
		{raw: "nats://router:tok-9x7@nats/out", err: "never written in the output URL"},
		{raw: "nats://nats:4222/", err: "name the subject"},
		{raw: "nats://nats:4222/orders.*", err: "no wildcards"},
		{raw: "nats://nats:4222/orders.>", err: "no wildcards"},
		{raw: "nats://nats:4222/a..b", err: "dot-separated"},
		{raw: "nats://nats:4222/out?stream=A.B", err: "stream="},
		{raw: "nats://nats:4222/out?queue=x", err: "not a nats sink parameter"},
		{raw: "nats:///out", err: "no host"},
		{raw: "nats://router@nats:4222/out?tls=true", servers: []string{"nats:4222"}, subject: "out", user: "router", tls: true},
		{raw: "nats://a,b/out?stream=OUT&tls=true", servers: []string{"a:4222", "b:4222"}, subject: "out", stream: "OUT", tls: true},
		{raw: "nats://nats/out?tls=false", servers: []string{"nats:4222"}, subject: "out"},
		{raw: "nats://nats/out?tls=1", err: "want tls=true"},
		{raw: "nats://nats/out?tls=true&tls=true", err: "given 2 times"},
		{raw: "nats://nats/out?secure=true", err: "they are stream=NAME and tls=true"},
	} {
		got, err := ParseNATSOutput(tc.raw)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.raw, err)
		case tc.err == "" && (strings.Join(got.Servers, ",") != strings.Join(tc.servers, ",") || got.Subject != tc.subject || got.Stream != tc.stream || got.User != tc.user || got.TLS != tc.tls):
			t.Errorf("%s: %+v", tc.raw, got)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want an error saying %q", tc.raw, err, tc.err)
		case err != nil && strings.Contains(err.Error(), "tok-9x7"):
			t.Errorf("%s: the error repeats the token: %v", tc.raw, err)
		}
	}
}

// A spec's output is checked at submit with the same parsers: a password never comes back
// in the problem it reports.
func TestValidateOutputs(t *testing.T) {
	base := "name: m\ntenant: t\nworkers: 1\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [x]\nlinks: [dc-a, dc-b]\n"
	for _, tc := range []struct{ output, want string }{
		{"postgres://app@db:5432/orders?table=out", ""},
		{"nats://nats:4222/orders.out", ""},
		{"postgres://app:hunter2@db/orders?table=out", "output: postgres sink: a password is never written"},
		{"mysql://app:hunter2@db/orders", "must be a file://, http(s)://, postgres:// or nats:// URL"},
		{"https://user:hunter2@hook.example/in", "a password is never written"},
	} {
		_, err := ParseJobSpec([]byte(base + "output: " + tc.output + "\n"))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.output, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.output, err, tc.want)
		case err != nil && strings.Contains(err.Error(), "hunter2"):
			t.Errorf("%s: the problem repeats the password: %v", tc.output, err)
		}
	}
}

// TestOutputSecretTransport: a sink given the output secret gets it encrypted, or over
// loopback only; each refusal is one line that says what to change.
func TestOutputSecretTransport(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want string // "" accepted; else the refusal names it
	}{
		{"file:///out/x.jsonl", ""},
		{"https://hook.example/in", ""},
		{"https://10.0.0.7:8443/in", ""},
		{"http://127.0.0.1:8080/in", ""},
		{"http://127.9.9.9/in", ""},
		{"http://localhost:8080/in", ""},
		{"http://LOCALHOST/in", ""},
		{"http://[::1]:8080/in", ""},
		{"http://hook.example/in", "use https://"},
		{"http://10.0.0.7:8080/in", "use https://"},
		{"http://[::ffff:10.0.0.7]/in", "use https://"},
		{"http://localhost.hook.example/in", "use https://"},
		{"http://127.0.0.1.nip.io/in", "use https://"},
		{"postgres://app@db.example/orders?table=out&sslmode=require", ""},
		{"postgres://app@db.example/orders?table=out&sslmode=verify-ca", ""},
		{"postgres://app@db.example/orders?table=out&sslmode=verify-full", ""},
		{"postgres://app@127.0.0.1:5433/orders?table=out", ""},
		{"postgresql://app@localhost/orders?table=out&sslmode=disable", ""},
		{"postgres://app@db.example/orders?table=out", "no sslmode (the driver's prefer)"},
		{"postgres://app@db.example/orders?table=out&sslmode=prefer", "sslmode=prefer"},
		{"postgres://app@db.example/orders?table=out&sslmode=allow", "sslmode=allow"},
		{"postgres://app@10.0.0.5/orders?table=out&sslmode=disable", "add sslmode=verify-full"},
		{"nats://nats.example:4222/out?tls=true", ""},
		{"nats://router@a,b/out?stream=S&tls=true", ""},
		{"nats://127.0.0.1:4222/out", ""},
		{"nats://localhost,127.0.0.2:4223/out", ""},
		{"nats://[::1]:4223/out", ""},
		{"nats://nats.example:4222/out", "add ?tls=true"},
		{"nats://nats.example:4222/out?tls=false", "add ?tls=true"},
		{"nats://127.0.0.1:4222,10.0.0.9:4222/out", "at 10.0.0.9:4222 would"},
	} {
		err := CheckOutputSecretTransport(tc.raw)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.raw, err)
		case tc.want != "" && (!errors.Is(err, ErrSecretInClear) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want a refusal saying %q", tc.raw, err, tc.want)
		case err != nil && strings.Contains(err.Error(), "\n"):
			t.Errorf("%s: a refusal of more than one line: %q", tc.raw, err)
		}
	}
	// An output that does not parse is the parser's to report, not a refusal.
	for _, raw := range []string{"postgres://app:pw@db/orders?table=out", "nats://nats/out?tls=yes", "mysql://db/x", "%zz"} {
		if err := CheckOutputSecretTransport(raw); err == nil || errors.Is(err, ErrSecretInClear) {
			t.Errorf("%s: %v, want the URL's own problem", raw, err)
		}
	}
}

// A job whose output secret would cross a network in clear is refused at submit (and at
// an update: the same Validate), with the output field named.
func TestValidateOutputSecretTransport(t *testing.T) {
	base := "name: m\ntenant: t\nworkers: 1\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [x]\nlinks: [dc-a, dc-b]\noutputSecret: sinkpass\n"
	for _, tc := range []struct{ output, want string }{
		{"https://hook.example/in", ""},
		{"http://127.0.0.1:9000/in", ""},
		{"postgres://app@db:5432/orders?table=out&sslmode=verify-full", ""},
		{"nats://nats:4222/orders.out?tls=true", ""},
		{"file:///out/x.jsonl", ""},
		{"http://hook.example/in", "output: the output secret would cross the network in clear: http://hook.example would get it as a bearer token over plain HTTP: use https://"},
		{"postgres://app@db:5432/orders?table=out", "output: the output secret would cross the network in clear: the postgres sink at db:5432 with no sslmode"},
		{"nats://nats:4222/orders.out", "output: the output secret would cross the network in clear: the nats sink at nats:4222 would get the password or token over plain NATS: add ?tls=true"},
		// A broken output is reported once, as the output's own problem.
		{"nats://nats:4222/orders.out?tls=maybe", "output: nats sink: tls=\"maybe\""},
	} {
		_, err := ParseJobSpec([]byte(base + "output: " + tc.output + "\n"))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.output, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.output, err, tc.want)
		case err != nil && strings.Count(err.Error(), "output:") > 1:
			t.Errorf("%s: reported more than once: %v", tc.output, err)
		}
		// Without an output secret there is nothing to leak: the same outputs are taken.
		if _, err := ParseJobSpec([]byte(strings.Replace(base, "outputSecret: sinkpass\n", "", 1) + "output: " + tc.output + "\n")); err != nil && !strings.Contains(tc.output, "maybe") {
			t.Errorf("%s without an output secret: %v", tc.output, err)
		}
	}
}

func FuzzParseOutputs(f *testing.F) {
	for _, s := range []string{"postgres://app@db:5432/orders?table=out", "nats://a:4222,b/out?stream=S", "postgres://a:b@c/d?table=e", "nats://%zz/x",
		"nats://router@a:4222,b/out?stream=S&tls=true", "nats://127.0.0.1/out?tls=false", "http://[::1]:80/in", "postgres://app@localhost/d?table=e&sslmode=disable"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if o, err := ParsePostgresOutput(raw); err == nil {
			if !sqlIdent.MatchString(o.Table) || o.Schema != "" && !sqlIdent.MatchString(o.Schema) || !dbName.MatchString(o.User) || !dbName.MatchString(o.DB) {
				t.Errorf("%q parsed to %+v: a name that is not a plain identifier", raw, o)
			}
			if strings.ContainsAny(o.Host+o.Port+o.SSLMode, " '\"\\=") {
				t.Errorf("%q parsed to %+v: a value that would break a connection string", raw, o)
			}
		}
		if o, err := ParseNATSOutput(raw); err == nil {
			if o.Subject == "" || strings.ContainsAny(o.Subject, "*> \t") || len(o.Servers) == 0 {
				t.Errorf("%q parsed to %+v", raw, o)
			}
			// A credential reaches a nats sink in clear only over loopback.
			if CheckOutputSecretTransport(raw) == nil && !o.TLS {
				for _, s := range o.Servers {
					if h, _, _ := net.SplitHostPort(s); !loopbackHost(h) {
						t.Errorf("%q: a plain connection to %s is let through", raw, s)
					}
				}
			}
		}
		if o, err := ParsePostgresOutput(raw); err == nil && CheckOutputSecretTransport(raw) == nil && !loopbackHost(o.Host) &&
			o.SSLMode != "require" && o.SSLMode != "verify-ca" && o.SSLMode != "verify-full" {
			t.Errorf("%q: sslmode %q to %s is let through", raw, o.SSLMode, o.Host)
		}
	})
}
