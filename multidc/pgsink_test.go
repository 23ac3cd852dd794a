package multidc

import (
	"context"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/pgtest"
	"github.com/stormdock/stormdock/internal/pki"
	"github.com/stormdock/stormdock/internal/testenv"
)

// pgURL is a sink URL for the superuser on a test server.
func pgURL(addr, db, table string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?table=%s&sslmode=disable", pgtest.Superuser, addr, db, table)
}

// pgRow is one row of a sink table.
type pgRow struct {
	offset, epoch int64
	link          string
}

// pgRows reads a sink table in offset order, with SQL.
func pgRows(t testing.TB, s *pgtest.Server, db, table string) []pgRow {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := s.Admin(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, `SELECT "offset", epoch, link FROM `+table+` ORDER BY "offset"`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []pgRow
	for rows.Next() {
		var r pgRow
		if err := rows.Scan(&r.offset, &r.epoch, &r.link); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkPGRows checks that the table holds offsets 0..n-1 once each, in order, and that the
// epochs never go back: a fenced router's write never committed after a newer one's.
func checkPGRows(t testing.TB, rows []pgRow, n int64) {
	t.Helper()
	if int64(len(rows)) != n {
		t.Errorf("table holds %d rows, want %d", len(rows), n)
	}
	var epoch int64
	for i, r := range rows {
		if r.offset != int64(i) {
			t.Fatalf("row %d holds offset %d: an offset missing or twice", i, r.offset)
		}
		if r.epoch < epoch {
			t.Fatalf("offset %d written at epoch %d after epoch %d: a fenced router's write committed", r.offset, r.epoch, epoch)
		}
		epoch = r.epoch
	}
}

func openPG(t testing.TB, raw, job string, mod func(*FencingOptions)) *PGSink {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := FencingOptions{Job: job, Router: "test", Logger: testenv.Logger(t, slog.LevelWarn)}
	if mod != nil {
		mod(&opts)
	}
	s, err := OpenPGSink(ctx, raw, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A new router's opening fences the old one off: its writes fail and nothing of them
// commits; the new one continues where the table stands.
func TestPGSinkFencesTheOldRouter(t *testing.T) {
	srv := pgtest.Shared(t)
	db := srv.NewDB(t)
	raw := pgURL(srv.Addr(), db, "out")
	ctx := context.Background()

	a := openPG(t, raw, "wc", nil)
	if last, _ := a.LastOffset(ctx); last != -1 || a.Epoch() != 1 {
		t.Fatalf("a new table: last %d, epoch %d; want -1 and 1", last, a.Epoch())
	}
	if err := a.Write(ctx, recs("dc-a", 0, 10)); err != nil {
		t.Fatal(err)
	}
	b := openPG(t, raw, "wc", nil)
	if last, _ := b.LastOffset(ctx); last != 9 || b.Epoch() != 2 {
		t.Fatalf("after a takeover: last %d, epoch %d; want 9 and 2", last, b.Epoch())
	}
	// The takeover ended the old router's session: its first write may fail for that; the
	// router retries, and then learns it is fenced off.
	err := a.Write(ctx, recs("dc-a", 10, 20))
	if err != nil && !errors.Is(err, ErrFenced) {
		err = a.Write(ctx, recs("dc-a", 10, 20))
	}
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("the fenced router's write: %v; want ErrFenced", err)
	}
	if err := b.Write(ctx, recs("dc-b", 10, 20)); err != nil {
		t.Fatal(err)
	}
	rows := pgRows(t, srv, db, "out")
	checkPGRows(t, rows, 20)
	if rows[9].epoch != 1 || rows[10].epoch != 2 || rows[10].link != "dc-b" {
		t.Errorf("rows 9 and 10: %+v %+v; want epoch 1 then 2 from dc-b", rows[9], rows[10])
	}

	// Another job's router refuses the table, and takes nothing over.
	if _, err := OpenPGSink(ctx, raw, FencingOptions{Job: "other"}); err == nil || !strings.Contains(err.Error(), "is the output of job wc") {
		t.Errorf("another job's router: %v", err)
	}
	if err := b.Write(ctx, recs("dc-b", 20, 21)); err != nil {
		t.Errorf("the leader after another job's refused attempt: %v", err)
	}
}

// Every bad table is refused with what it must look like, and is left as it was.
func TestPGSinkRefusesTablesOfAnotherShape(t *testing.T) {
	srv := pgtest.Shared(t)
	db := srv.NewDB(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name, ddl, want string
	}{
		{"int_offset", `("offset" int PRIMARY KEY, link text, epoch bigint, record jsonb)`, `column "offset" is integer, not bigint`},
		{"json_record", `("offset" bigint PRIMARY KEY, link text, epoch bigint, record json)`, `column "record" is json, not jsonb`},
		{"no_epoch", `("offset" bigint PRIMARY KEY, link text, record jsonb)`, `it has no column "epoch"`},
		{"no_key", `("offset" bigint, link text, epoch bigint, record jsonb)`, `column "offset" is not its primary key`},
		{"extra_not_null", `("offset" bigint PRIMARY KEY, link text, epoch bigint, record jsonb, owner text NOT NULL)`, `column "owner" is NOT NULL without a default`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv.Exec(t, db, "CREATE TABLE "+tc.name+" "+tc.ddl)
			_, err := OpenPGSink(ctx, pgURL(srv.Addr(), db, tc.name), FencingOptions{Job: "wc"})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `it must look like CREATE TABLE "`+tc.name+`" ("offset" bigint PRIMARY KEY`) {
				t.Fatalf("got %v; want %q and the table it must be", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("the error is more than one line: %q", err)
			}
		})
	}
	// A table with rows that no router wrote.
	srv.Exec(t, db, `CREATE TABLE foreign_rows ("offset" bigint PRIMARY KEY, link text, epoch bigint, record jsonb)`)
	srv.Exec(t, db, `INSERT INTO foreign_rows VALUES (0, 'x', 0, '{}')`)
	if _, err := OpenPGSink(ctx, pgURL(srv.Addr(), db, "foreign_rows"), FencingOptions{Job: "wc"}); err == nil || !strings.Contains(err.Error(), "holds rows that no router of job wc wrote") {
		t.Errorf("a table with foreign rows: %v", err)
	}
	if rows := pgRows(t, srv, db, "foreign_rows"); len(rows) != 1 {
		t.Errorf("the foreign table changed: %v", rows)
	}
	// A table of the right shape with extra columns is taken.
	srv.Exec(t, db, `CREATE TABLE extra (note text, "offset" bigint PRIMARY KEY, link text, epoch bigint, record jsonb, at timestamptz DEFAULT now())`)
	s := openPG(t, pgURL(srv.Addr(), db, "extra"), "wc", nil)
	if err := s.Write(ctx, recs("dc-a", 0, 3)); err != nil {
		t.Fatal(err)
	}
}

func TestPGSinkUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(20*time.Second))
	defer cancel()
	port := testenv.FreePort(t)
	_, err := OpenPGSink(ctx, pgURL(fmt.Sprintf("127.0.0.1:%d", port), "app", "out"), FencingOptions{Job: "wc"})
	if err == nil || !strings.Contains(err.Error(), "cannot connect") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("an unreachable database: %v", err)
	}
}

// The password comes from the function the router is given, read at every connect, and
// appears in no error.
func TestPGSinkPassword(t *testing.T) {
	const pw = "pw-0f4e-secret"
	srv := pgtest.Start(t, pgtest.Options{Password: pw})
	file := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(file, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fromFile := func() ([]byte, error) { return os.ReadFile(file) }
	raw := pgURL(srv.Addr(), "postgres", "out")
	ctx := context.Background()
	s := openPG(t, raw, "wc", func(o *FencingOptions) { o.Password = fromFile })
	if err := s.Write(ctx, recs("dc-a", 0, 2)); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PGPASSWORD", pw) // never taken from the environment
	for _, bad := range []func() ([]byte, error){nil, func() ([]byte, error) { return []byte("wrong"), nil }} {
		_, err := OpenPGSink(ctx, raw, FencingOptions{Job: "wc", Password: bad})
		if err == nil || !strings.Contains(err.Error(), "password authentication failed") {
			t.Errorf("a missing or wrong password: %v", err)
		}
		if err != nil && strings.Contains(err.Error(), pw) {
			t.Errorf("the error holds the password: %v", err)
		}
	}
	if _, err := OpenPGSink(ctx, "postgres://postgres:"+pw+"@"+srv.Addr()+"/postgres?table=out", FencingOptions{Job: "wc"}); err == nil || strings.Contains(err.Error(), pw) {
		t.Errorf("a password in the URL: %v", err)
	}
}

// TestPGSinkTLS: a server that takes TLS connections only, with a certificate of the test's
// CA: the router, given that CA, writes with verify-full and verify-ca, the role's password
// crossing only the verified channel; the system's roots, another CA, or sslmode=disable
// fail in one line that never holds the password.
func TestPGSinkTLS(t *testing.T) {
	const pw = "tls-pw-8d21-secret"
	srv := pgtest.Start(t, pgtest.Options{Password: pw, TLS: true})
	good := func() ([]byte, error) { return []byte(pw + "\n"), nil }
	url := func(mode string) string {
		return fmt.Sprintf("postgres://%s@%s/postgres?table=out&sslmode=%s", pgtest.Superuser, srv.Addr(), mode)
	}
	ctx := context.Background()
	var next int64
	for _, mode := range []string{"verify-full", "verify-ca"} {
		s := openPG(t, url(mode), "wc", func(o *FencingOptions) { o.Password, o.RootCAs = good, srv.RootCAs() })
		if err := s.Write(ctx, recs("dc-a", next, next+5)); err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		next += 5
		s.Close()
	}
	checkPGRows(t, pgRows(t, srv, "postgres", "out"), next)

	otherPEM, _, err := pki.NewCA("not the server's CA")
	if err != nil {
		t.Fatal(err)
	}
	other := x509.NewCertPool()
	other.AppendCertsFromPEM(otherPEM)
	for _, tc := range []struct {
		what, raw string
		roots     *x509.CertPool
		want      string
	}{
		{"another CA", url("verify-full"), other, "certificate signed by unknown authority"},
		{"another CA, verify-ca", url("verify-ca"), other, "certificate signed by unknown authority"},
		{"the system's roots", url("verify-full"), nil, "certificate signed by unknown authority"},
		{"no TLS", url("disable"), srv.RootCAs(), "no encryption"},
	} {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		s, err := OpenPGSink(cctx, tc.raw, FencingOptions{Job: "wc", Router: "c", Password: good, RootCAs: tc.roots, Logger: testenv.Logger(t, slog.LevelWarn)})
		cancel()
		if err == nil {
			s.Close()
			t.Errorf("%s: the sink opened", tc.what)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") || strings.Contains(msg, pw) {
			t.Errorf("%s: %q, want one line saying %q (and never the password)", tc.what, msg, tc.want)
		}
		t.Logf("%s: %v", tc.what, err)
	}
}

// loseAnswers is a TCP proxy to PostgreSQL that, while armed, forwards a batch's insert and
// the commit that ends it, then closes both connections instead of passing on the answer:
// the commit happened and the sink cannot know.
type loseAnswers struct {
	ln     net.Listener
	target string
	armed  atomic.Int32 // answers to lose
	lost   atomic.Int32
	mu     sync.Mutex
	conns  []net.Conn
}

func newLoseAnswers(t testing.TB, target string) *loseAnswers {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &loseAnswers{ln: ln, target: target}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	return p
}

func (p *loseAnswers) addr() string { return p.ln.Addr().String() }

func (p *loseAnswers) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(s, c); s.Close() }()
		go p.answers(s, c)
	}
}

// answers relays the server's messages (each a type byte and a length) to the client, and
// drops the connection at the ReadyForQuery that follows an INSERT's CommandComplete while
// armed: by then the server has committed.
func (p *loseAnswers) answers(s, c net.Conn) {
	defer c.Close()
	defer s.Close()
	var held []byte
	hdr := make([]byte, 5)
	for {
		if _, err := io.ReadFull(s, hdr); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(hdr[1:])) - 4
		body := make([]byte, n)
		if _, err := io.ReadFull(s, body); err != nil {
			return
		}
		msg := append(append([]byte{}, hdr...), body...)
		switch {
		case hdr[0] == 'C' && strings.HasPrefix(string(body), "INSERT 0 ") && !strings.HasPrefix(string(body), "INSERT 0 0\x00") && p.armed.Load() > 0:
			held = msg
			continue
		case hdr[0] == 'Z' && held != nil:
			p.armed.Add(-1)
			p.lost.Add(1)
			return // committed; the client never hears of it
		}
		if _, err := c.Write(msg); err != nil {
			return
		}
	}
}

// A batch whose commit is never answered is not written again when the router retries it,
// nor when it retries a longer batch from the same offset.
func TestPGSinkLostCommitAnswer(t *testing.T) {
	srv := pgtest.Shared(t)
	db := srv.NewDB(t)
	proxy := newLoseAnswers(t, srv.Addr())
	ctx := context.Background()
	s := openPG(t, pgURL(proxy.addr(), db, "out"), "wc", nil)
	if err := s.Write(ctx, recs("dc-a", 0, 5)); err != nil {
		t.Fatal(err)
	}
	proxy.armed.Store(1)
	if err := s.Write(ctx, recs("dc-a", 5, 10)); err == nil {
		t.Fatal("a write whose answer was lost succeeded")
	}
	if proxy.lost.Load() != 1 {
		t.Fatalf("%d answers lost, want 1", proxy.lost.Load())
	}
	// The router retries the same offsets.
	if err := s.Write(ctx, recs("dc-b", 5, 10)); err != nil {
		t.Fatalf("the retry: %v", err)
	}
	proxy.armed.Store(1)
	if err := s.Write(ctx, recs("dc-a", 10, 12)); err == nil {
		t.Fatal("a write whose answer was lost succeeded")
	}
	// ... or a longer batch from the same offset: the part not yet written is written.
	if err := s.Write(ctx, recs("dc-a", 10, 20)); err != nil {
		t.Fatalf("the longer retry: %v", err)
	}
	rows := pgRows(t, srv, db, "out")
	checkPGRows(t, rows, 20)
	if rows[5].link != "dc-a" {
		t.Errorf("offset 5 from %s: the retry wrote it again", rows[5].link)
	}
}

// The database is killed (as a crash) and restarted again and again while batches are
// written and retried as the router does: every offset is in the table once.
func TestPGSinkDatabaseRestarts(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	raw := pgURL(srv.Addr(), "postgres", "out")
	s := openPG(t, raw, "wc", func(o *FencingOptions) { o.WriteTimeout = 5 * time.Second })
	const total = 3000
	writeThroughRestarts(t, s, total, srv.Restart)
	checkPGRows(t, pgRows(t, srv, "postgres", "out"), total)
}

// writeThroughRestarts writes offsets 0..total-1 to s in batches of random sizes, retrying
// a failed batch as the router does (the same offsets again, perhaps more of them), while
// the sink's server is restarted (restart) four times mid-stream.
func writeThroughRestarts(t *testing.T, s Sink, total int64, restart func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var written atomic.Int64
	done := make(chan error, 1)
	go func() {
		next := int64(0)
		for next < total {
			n := min(int64(1+rand.IntN(50)), total-next)
			batch := recs([]string{"dc-a", "dc-b"}[next%2], next, next+n)
			for {
				err := s.Write(ctx, batch)
				if err == nil {
					break
				}
				if errors.Is(err, ErrFenced) || errors.Is(err, ErrSinkBroken) || ctx.Err() != nil {
					done <- err
					return
				}
				// The retried batch may grow, but never past the stream's end: the
				// router has no records after total, and the row count checks that.
				batch = recs("dc-b", next, min(next+n+int64(rand.IntN(5)), total))
				n = int64(len(batch))
				time.Sleep(20 * time.Millisecond)
			}
			next += n
			written.Store(next)
		}
		done <- nil
	}()
	for range 4 {
		at := written.Load()
		testenv.Eventually(t, "batches written", 30*time.Second, func() bool { return written.Load() > at+100 || written.Load() >= total })
		if written.Load() >= total {
			break
		}
		restart()
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testenv.Timeout(90 * time.Second)):
		t.Fatalf("writes stuck at %d", written.Load())
	}
}
