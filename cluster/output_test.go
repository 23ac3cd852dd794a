package cluster

import (
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
	} {
		got, err := ParseNATSOutput(tc.raw)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.raw, err)
		case tc.err == "" && (strings.Join(got.Servers, ",") != strings.Join(tc.servers, ",") || got.Subject != tc.subject || got.Stream != tc.stream || got.User != tc.user):
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

func FuzzParseOutputs(f *testing.F) {
	for _, s := range []string{"postgres://app@db:5432/orders?table=out", "nats://a:4222,b/out?stream=S", "postgres://a:b@c/d?table=e", "nats://%zz/x"} {
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
		}
	})
}
