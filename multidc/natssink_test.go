package multidc

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/stormdock/stormdock/internal/natstest"
	"github.com/stormdock/stormdock/internal/pki"
	"github.com/stormdock/stormdock/internal/testenv"
)

// natsSubject is a subject of the test's own on a shared server.
func natsSubject() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "t" + hex.EncodeToString(b) + ".out"
}

func openNATS(t testing.TB, raw, job, router string) *NATSSink {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := OpenNATSSink(ctx, raw, FencingOptions{Job: job, Router: router, Logger: testenv.Logger(t, slog.LevelWarn)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// jsMsg is one message of a sink subject, as the server holds it.
type jsMsg struct {
	seq    uint64
	kind   string
	epoch  int64
	offset int64
	link   string
}

// readSubject reads every message of the subject from the server's own view of the stream.
func readSubject(t testing.TB, srv *natstest.Server, subject string) []jsMsg {
	t.Helper()
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name, err := js.StreamNameBySubject(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []jsMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject != subject {
			continue
		}
		e, _ := strconv.ParseInt(m.Header.Get(HeaderEpoch), 10, 64)
		d, _ := strconv.ParseInt(m.Header.Get(HeaderDelivered), 10, 64)
		jm := jsMsg{seq: seq, kind: m.Header.Get(HeaderKind), epoch: e, offset: d}
		if jm.kind == KindRecord {
			var line sinkLine
			if err := json.Unmarshal(m.Data, &line); err != nil || line.Offset != d {
				t.Fatalf("message %d: %q (%v): not the record of offset %d", seq, m.Data, err, d)
			}
			jm.link = line.Link
		}
		out = append(out, jm)
	}
	return out
}

// checkSubject checks that the records on the subject are offsets 0..n-1 once each and in
// order, and that no record was published at an epoch older than a fence before it.
func checkSubject(t testing.TB, msgs []jsMsg, n int64) (fences int) {
	t.Helper()
	var next, epoch int64
	for _, m := range msgs {
		switch m.kind {
		case KindFence:
			if m.epoch <= epoch {
				t.Fatalf("fence %d at sequence %d after epoch %d", m.epoch, m.seq, epoch)
			}
			epoch = m.epoch
			fences++
		case KindRecord:
			if m.offset != next {
				t.Fatalf("record of offset %d at sequence %d, want %d: an offset missing or twice", m.offset, m.seq, next)
			}
			if m.epoch != epoch {
				t.Fatalf("offset %d published at epoch %d after the fence of epoch %d: a fenced router's publish was stored", m.offset, m.epoch, epoch)
			}
			next++
		default:
			t.Fatalf("message %d of kind %q", m.seq, m.kind)
		}
	}
	if next != n {
		t.Errorf("%d records on the subject, want %d", next, n)
	}
	return fences
}

func TestNATSSinkFencesTheOldRouter(t *testing.T) {
	srv := natstest.Shared(t)
	subject := natsSubject()
	raw := srv.URL() + "/" + subject
	ctx := context.Background()
	a := openNATS(t, raw, "wc", "a")
	if a.Epoch() != 1 {
		t.Fatalf("epoch %d on a new subject", a.Epoch())
	}
	if err := a.Write(ctx, recs("dc-a", 0, 10)); err != nil {
		t.Fatal(err)
	}
	b := openNATS(t, raw, "wc", "b")
	if last, _ := b.LastOffset(ctx); last != 9 || b.Epoch() != 2 {
		t.Fatalf("after a takeover: last %d, epoch %d; want 9 and 2", last, b.Epoch())
	}
	if err := a.Write(ctx, recs("dc-a", 10, 20)); !errors.Is(err, ErrFenced) {
		t.Fatalf("the fenced router's publish: %v; want ErrFenced", err)
	}
	if err := b.Write(ctx, recs("dc-b", 10, 20)); err != nil {
		t.Fatal(err)
	}
	if f := checkSubject(t, readSubject(t, srv, subject), 20); f != 2 {
		t.Errorf("%d fences, want 2", f)
	}
	if _, err := OpenNATSSink(ctx, raw, FencingOptions{Job: "other", Router: "c"}); err == nil {
		t.Error("another job's router took the subject")
	}
	// A subject with messages of someone else's is refused.
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	foreign := natsSubject()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "F" + foreign[1:9], Subjects: []string{foreign}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, foreign, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenNATSSink(ctx, srv.URL()+"/"+foreign, FencingOptions{Job: "wc"}); err == nil {
		t.Error("a subject holding another publisher's messages was taken")
	}
}

// Records published whose acknowledgements never came are not published again.
func TestNATSSinkLostAcks(t *testing.T) {
	srv := natstest.Shared(t)
	subject := natsSubject()
	s := openNATS(t, srv.URL()+"/"+subject, "wc", "a")
	ctx := context.Background()
	if err := s.Write(ctx, recs("dc-a", 0, 5)); err != nil {
		t.Fatal(err)
	}
	// Offsets 5-7 reach the stream as this router sent them, and the router hears nothing.
	for _, r := range recs("dc-a", 5, 8) {
		if _, err := s.js.PublishMsg(ctx, s.record(r), jetstream.WithMsgID(s.msgID(r.Offset))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Write(ctx, recs("dc-b", 5, 12)); err != nil {
		t.Fatal(err)
	}
	msgs := readSubject(t, srv, subject)
	checkSubject(t, msgs, 12)
	if msgs[6].link != "dc-a" || msgs[9].link != "dc-b" { // [0] is the fence
		t.Errorf("offsets 5 and 8 from %s and %s; want dc-a (published before) and dc-b", msgs[6].link, msgs[9].link)
	}
}

// The server is killed and restarted again and again while batches are published and
// retried as the router does: every offset is on the subject once.
func TestNATSSinkServerRestarts(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	subject := "out"
	s := openNATS(t, srv.URL()+"/"+subject, "wc", "a")
	s.opts.WriteTimeout = 2 * time.Second
	const total = 3000
	writeThroughRestarts(t, s, total, srv.Restart)
	checkSubject(t, readSubject(t, srv, subject), total)
}

// The password (or token) comes from the function the router is given and appears in no
// error; the URL holds none.
func TestNATSSinkPassword(t *testing.T) {
	const pw = "tok-77d1-secret"
	ctx := context.Background()
	for _, user := range []string{"", "router"} {
		srv := natstest.Start(t, natstest.Options{User: user, Password: pw})
		raw := srv.URL() + "/out"
		if user != "" {
			raw = "nats://" + user + "@" + srv.Addr() + "/out"
		}
		good := func() ([]byte, error) { return []byte(pw + "\n"), nil }
		s, err := OpenNATSSink(ctx, raw, FencingOptions{Job: "wc", Router: "a", Password: good})
		if err != nil {
			t.Fatalf("user %q: %v", user, err)
		}
		if err := s.Write(ctx, recs("dc-a", 0, 3)); err != nil {
			t.Fatal(err)
		}
		s.Close()
		for _, bad := range []func() ([]byte, error){nil, func() ([]byte, error) { return []byte("wrong"), nil }} {
			_, err := OpenNATSSink(ctx, raw, FencingOptions{Job: "wc", Router: "b", Password: bad})
			if err == nil || strings.Contains(err.Error(), pw) {
				t.Errorf("user %q, a missing or wrong password: %v", user, err)
			}
		}
	}
}

// TestNATSSinkTLS: with ?tls=true the sink speaks TLS to a nats-server that serves only
// TLS, verifies its certificate against the CA it is given, sends the user's password over
// it, and writes exactly once through a takeover; with another CA, the system's roots, or
// a server without TLS it does not connect (and never falls back to a plain connection).
func TestNATSSinkTLS(t *testing.T) {
	const pw = "tls-pw-5c1e-secret"
	srv := natstest.Start(t, natstest.Options{TLS: true, User: "router", Password: pw})
	subject := natsSubject()
	raw := "nats://router@" + srv.Addr() + "/" + subject + "?tls=true"
	good := func() ([]byte, error) { return []byte(pw + "\n"), nil }
	ctx := context.Background()
	open := func(raw, router string, roots *x509.CertPool, password func() ([]byte, error)) (*NATSSink, error) {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return OpenNATSSink(cctx, raw, FencingOptions{Job: "wc", Router: router, Password: password, RootCAs: roots, Logger: testenv.Logger(t, slog.LevelWarn)})
	}
	a, err := open(raw, "a", srv.RootCAs(), good)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.String() != raw {
		t.Errorf("the sink calls itself %s, want %s", a, raw)
	}
	if st, err := a.nc.TLSConnectionState(); err != nil || !st.HandshakeComplete || len(st.VerifiedChains) == 0 {
		t.Fatalf("not a verified TLS connection: %v", err)
	}
	if err := a.Write(ctx, recs("dc-a", 0, 10)); err != nil {
		t.Fatal(err)
	}
	b, err := open(raw, "b", srv.RootCAs(), good)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := a.Write(ctx, recs("dc-a", 10, 15)); !errors.Is(err, ErrFenced) {
		t.Fatalf("the fenced router's publish over TLS: %v; want ErrFenced", err)
	}
	if err := b.Write(ctx, recs("dc-b", 10, 20)); err != nil {
		t.Fatal(err)
	}
	if fences := checkSubject(t, readSubject(t, srv, subject), 20); fences != 2 {
		t.Errorf("%d fences, want 2", fences)
	}

	otherPEM, _, err := pki.NewCA("not the server's CA")
	if err != nil {
		t.Fatal(err)
	}
	other := x509.NewCertPool()
	other.AppendCertsFromPEM(otherPEM)
	bad := func() ([]byte, error) { return []byte("wrong"), nil }
	for _, tc := range []struct {
		what, raw string
		roots     *x509.CertPool
		password  func() ([]byte, error)
		want      string
	}{
		{"another CA", raw, other, good, "certificate signed by unknown authority"},
		{"the system's roots", raw, nil, good, "x509: certificate signed by unknown authority"},
		{"a wrong password", raw, srv.RootCAs(), bad, "uthorization"},
		{"a server without TLS", natstest.Shared(t).URL() + "/" + natsSubject() + "?tls=true", srv.RootCAs(), good, "the server offers no TLS, which tls=true requires"},
	} {
		s, err := open(tc.raw, "c", tc.roots, tc.password)
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

// TestNATSSinkFenceDuringPipeline: a takeover while the old router pipelines a large batch.
// The new router's fence lands between two of its publishes; none of the old router's
// publishes after the fence may be stored (60-minute chaos: a fenced router's 30 offsets
// followed the fence, each expecting only the subject's sequence before it).
func TestNATSSinkFenceDuringPipeline(t *testing.T) {
	srv := natstest.Shared(t)
	ctx := context.Background()
	for round := range 5 {
		subject := natsSubject()
		raw := srv.URL() + "/" + subject
		a := openNATS(t, raw, "wc", "a")
		if err := a.Write(ctx, recs("dc-a", 0, 1)); err != nil {
			t.Fatal(err)
		}
		written := make(chan struct{})
		done := make(chan error, 1)
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		go func() {
			next := int64(1)
			for {
				err := a.Write(wctx, recs("dc-a", next, next+500))
				if err != nil {
					done <- err
					return
				}
				next += 500
				if next == 501 {
					close(written)
				}
			}
		}()
		<-written
		b := openNATS(t, raw, "wc", "b")
		select {
		case err := <-done:
			if !errors.Is(err, ErrFenced) {
				t.Fatalf("round %d: the old router's write: %v; want ErrFenced", round, err)
			}
		case <-time.After(testenv.Timeout(30 * time.Second)):
			stop()
			<-done
			checkSubject(t, readSubject(t, srv, subject), 0) // says which publish followed the fence
			t.Fatalf("round %d: the old router is never fenced: its publishes after the fence are stored", round)
		}
		last, err := b.LastOffset(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Write(ctx, recs("dc-b", last+1, last+101)); err != nil {
			t.Fatal(err)
		}
		checkSubject(t, readSubject(t, srv, subject), last+101)
	}
}
