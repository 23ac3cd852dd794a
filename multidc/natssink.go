package multidc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/stormdock/stormdock/cluster"
)

// NATSSink publishes a mirrored job's records to a subject of a JetStream stream, one message
// per record (the FileSink line as the body), exactly once by construction. Every message
// carries a message id (JOB:OFFSET, which JetStream de-duplicates) and the subject's last
// sequence as the router last left it (Nats-Expected-Last-Subject-Sequence): the server
// stores a message only if nobody published to the subject since. A router that takes the
// sink over (OpenNATSSink) publishes a fence message of its own with a new epoch on the
// subject, so every later publish of an earlier router is refused. The last message on the
// subject says where the sink stands (its Stormdock-Delivered header), so a new router
// continues there, and a batch whose acknowledgements were lost is neither published twice
// nor skipped. Consumers skip the fence messages (header Stormdock-Kind: fence, no body).
type NATSSink struct {
	out  cluster.NATSOutput
	opts FencingOptions
	log  *slog.Logger

	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream

	epoch     int64
	delivered int64
	lastSeq   uint64 // the stream sequence of the subject's last message, as this router left it
}

// Headers of the sink's messages.
const (
	HeaderKind      = "Stormdock-Kind" // "record" or "fence"
	HeaderJobName   = "Stormdock-Job"
	HeaderEpoch     = "Stormdock-Epoch"
	HeaderDelivered = "Stormdock-Delivered" // a record's offset; for a fence, the offset delivered before it
)

// Kinds of the sink's messages.
const (
	KindRecord = "record"
	KindFence  = "fence"
)

// natsDuplicates is the de-duplication window of a stream the router makes.
const natsDuplicates = 2 * time.Minute

// OpenNATSSink connects, finds (or makes) the stream that takes the subject, and takes the
// sink over with a fence message of a new epoch.
func OpenNATSSink(ctx context.Context, raw string, opts FencingOptions) (*NATSSink, error) {
	out, err := cluster.ParseNATSOutput(raw)
	if err != nil {
		return nil, fmt.Errorf("multidc: nats sink: %w", err)
	}
	opts = opts.withDefaults()
	s := &NATSSink{out: out, opts: opts}
	s.log = opts.Logger.With("sink", s.String())
	if err := s.connect(ctx); err != nil {
		return nil, err
	}
	if err := s.findStream(ctx); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.takeOver(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// String names the sink without credentials.
func (s *NATSSink) String() string {
	u := ""
	if s.out.User != "" {
		u = s.out.User + "@"
	}
	tls := ""
	if s.out.TLS {
		tls = "?tls=true"
	}
	return "nats://" + u + strings.Join(s.out.Servers, ",") + "/" + s.out.Subject + tls
}

// Epoch is the fencing epoch this router holds.
func (s *NATSSink) Epoch() int64 { return s.epoch }

type natsDialer struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

func (d natsDialer) Dial(network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return d.dial(ctx, network, addr)
}

func (s *NATSSink) connect(ctx context.Context) error {
	urls := make([]string, len(s.out.Servers))
	for i, a := range s.out.Servers {
		urls[i] = "nats://" + a
	}
	opts := []nats.Option{
		nats.Name(appName(s.opts.Job)),
		nats.Timeout(5 * time.Second),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100 * time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				s.log.Warn("nats sink: disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { s.log.Info("nats sink: reconnected", "server", nc.ConnectedAddr()) }),
	}
	if s.out.TLS {
		// nats.Secure makes TLS a requirement: a server that offers none is refused before
		// any credential is sent, never fallen back to.
		opts = append(opts, nats.Secure(&tls.Config{RootCAs: s.opts.RootCAs, MinVersion: tls.VersionTLS12}))
	}
	if s.opts.Password != nil {
		pw, err := s.opts.Password()
		if err != nil {
			return fmt.Errorf("multidc: nats sink %s: read its password: %w", s, err)
		}
		secret := strings.TrimRight(string(pw), "\r\n")
		if s.out.User != "" {
			opts = append(opts, nats.UserInfo(s.out.User, secret))
		} else {
			opts = append(opts, nats.Token(secret))
		}
	}
	if s.opts.Dial != nil {
		opts = append(opts, nats.SetCustomDialer(natsDialer{s.opts.Dial}))
	}
	nc, err := nats.Connect(strings.Join(urls, ","), opts...)
	if errors.Is(err, nats.ErrSecureConnWanted) {
		return fmt.Errorf("multidc: nats sink %s: cannot connect: the server offers no TLS, which tls=true requires (nothing was sent): %w", s, err)
	}
	if err != nil {
		return fmt.Errorf("multidc: nats sink %s: cannot connect: %w", s, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return fmt.Errorf("multidc: nats sink %s: %w", s, err)
	}
	s.nc, s.js = nc, js
	return nil
}

// findStream finds the stream that takes the subject; when none does, it makes one (named
// ?stream= or after the subject).
func (s *NATSSink) findStream(ctx context.Context) error {
	name, err := s.js.StreamNameBySubject(ctx, s.out.Subject)
	switch {
	case err == nil && s.out.Stream != "" && name != s.out.Stream:
		return fmt.Errorf("multidc: nats sink %s: subject %s is taken by stream %s, not %s: name that stream or another subject",
			s, s.out.Subject, name, s.out.Stream)
	case errors.Is(err, jetstream.ErrStreamNotFound):
		name = s.out.Stream
		if name == "" {
			name = strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(s.out.Subject))
		}
		st, err := s.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{s.out.Subject},
			Duplicates: natsDuplicates, Storage: jetstream.FileStorage})
		if err != nil {
			return fmt.Errorf("multidc: nats sink %s: no stream takes subject %s and making stream %s failed: %w (make one that takes it)",
				s, s.out.Subject, name, err)
		}
		s.log.Info("nats sink: made stream", "stream", name)
		s.stream = st
		return nil
	case err != nil:
		return fmt.Errorf("multidc: nats sink %s: find the stream of subject %s: %w (is JetStream on? nats-server -js)", s, s.out.Subject, err)
	}
	st, err := s.js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("multidc: nats sink %s: stream %s: %w", s, name, err)
	}
	s.stream = st
	return nil
}

// natsState is where the subject stands, from its last message.
type natsState struct {
	job       string
	epoch     int64
	delivered int64
	seq       uint64 // 0: no message on the subject
}

func (s *NATSSink) last(ctx context.Context) (natsState, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.WriteTimeout)
	defer cancel()
	m, err := s.stream.GetLastMsgForSubject(ctx, s.out.Subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return natsState{delivered: -1}, nil
	}
	if err != nil {
		return natsState{}, fmt.Errorf("multidc: nats sink %s: read the subject's last message: %w", s, err)
	}
	st := natsState{job: m.Header.Get(HeaderJobName), seq: m.Sequence}
	e, err1 := strconv.ParseInt(m.Header.Get(HeaderEpoch), 10, 64)
	d, err2 := strconv.ParseInt(m.Header.Get(HeaderDelivered), 10, 64)
	if st.job == "" || err1 != nil || err2 != nil {
		return natsState{}, fmt.Errorf("%w: nats sink %s: the last message on subject %s (sequence %d) was not published by a stormdock router: the subject must be the job's alone",
			ErrSinkBroken, s, s.out.Subject, m.Sequence)
	}
	st.epoch, st.delivered = e, d
	return st, nil
}

// takeOver publishes a fence message of the next epoch right after the subject's last
// message; another publish in between makes it read again.
func (s *NATSSink) takeOver(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		st, err := s.last(ctx)
		if err != nil {
			return err
		}
		if st.job != "" && st.job != s.opts.Job {
			return fmt.Errorf("multidc: nats sink %s: subject %s is the output of job %s: name another subject", s, s.out.Subject, st.job)
		}
		epoch := st.epoch + 1
		m := nats.NewMsg(s.out.Subject)
		m.Header.Set(HeaderKind, KindFence)
		m.Header.Set(HeaderJobName, s.opts.Job)
		m.Header.Set(HeaderEpoch, strconv.FormatInt(epoch, 10))
		m.Header.Set(HeaderDelivered, strconv.FormatInt(st.delivered, 10))
		pctx, cancel := context.WithTimeout(ctx, s.opts.WriteTimeout)
		// The id names this router: another router bumping to the same epoch is no
		// duplicate of it.
		ack, err := s.js.PublishMsg(pctx, m, jetstream.WithMsgID(fmt.Sprintf("%s:fence:%d:%s", s.opts.Job, epoch, s.opts.Router)),
			jetstream.WithExpectLastSequencePerSubject(st.seq))
		cancel()
		if isWrongLastSeq(err) && attempt < 20 {
			continue // someone published meanwhile: read again
		}
		if err != nil {
			return fmt.Errorf("multidc: nats sink %s: publish the fence of epoch %d: %w", s, epoch, err)
		}
		s.epoch, s.delivered, s.lastSeq = epoch, st.delivered, ack.Sequence
		s.log.Info("nats sink: taken over", "epoch", epoch, "delivered", st.delivered, "stream", ack.Stream, "seq", ack.Sequence)
		return nil
	}
}

func isWrongLastSeq(err error) bool {
	var ae *jetstream.APIError
	return errors.As(err, &ae) && (ae.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		ae.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// LastOffset is the last offset on the subject, as its last message says.
func (s *NATSSink) LastOffset(context.Context) (int64, error) { return s.delivered, nil }

// record makes a record's message.
func (s *NATSSink) record(r Record) *nats.Msg {
	m := nats.NewMsg(s.out.Subject)
	m.Data = appendLine(nil, r)
	m.Data = m.Data[:len(m.Data)-1] // no newline: a message is one record
	m.Header.Set(HeaderKind, KindRecord)
	m.Header.Set(HeaderJobName, s.opts.Job)
	m.Header.Set(HeaderEpoch, strconv.FormatInt(s.epoch, 10))
	m.Header.Set(HeaderDelivered, strconv.FormatInt(r.Offset, 10))
	return m
}

func (s *NATSSink) msgID(off int64) string { return s.opts.Job + ":" + strconv.FormatInt(off, 10) }

// Write publishes recs (consecutive offsets right after the last published), each expecting
// the subject's last sequence to be the previous one's.
func (s *NATSSink) Write(ctx context.Context, recs []Record) error {
	for range 20 {
		if len(recs) == 0 {
			return nil
		}
		if recs[0].Offset != s.delivered+1 {
			return fmt.Errorf("%w: nats sink %s: batch from offset %d after delivered offset %d", ErrSinkBroken, s, recs[0].Offset, s.delivered)
		}
		pctx, cancel := context.WithTimeout(ctx, s.opts.WriteTimeout)
		n, err := s.publish(pctx, recs)
		cancel()
		recs = recs[n:]
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("multidc: nats sink %s: publish: %w", s, err)
		}
		// Refused, or unanswered: the subject's last message says whether another router
		// took over, or how far this one got.
		st, rerr := s.last(ctx)
		if rerr != nil {
			return errors.Join(fmt.Errorf("multidc: nats sink %s: publish: %w", s, err), rerr)
		}
		switch {
		case st.epoch != s.epoch:
			return fmt.Errorf("%w (nats sink %s: epoch %d, this router's %d)", ErrFenced, s, st.epoch, s.epoch)
		case st.delivered < s.delivered:
			return fmt.Errorf("%w: nats sink %s: the subject's last record is offset %d, this router delivered %d: messages were removed",
				ErrSinkBroken, s, st.delivered, s.delivered)
		}
		// Ours, published further than acknowledged: skip what is there.
		skip := st.delivered - s.delivered
		s.delivered, s.lastSeq = st.delivered, st.seq
		recs = recs[min(int64(len(recs)), skip):]
	}
	return fmt.Errorf("multidc: nats sink %s: publishes keep being refused", s)
}

// publish publishes recs and returns how many were stored (or were duplicates of stored
// ones), in order, until the first failure. The first goes alone, the others are pipelined,
// each expecting its predecessor right before it: right unless others publish to the stream
// at the same time, and then refused and retried.
func (s *NATSSink) publish(ctx context.Context, recs []Record) (int, error) {
	ack, err := s.js.PublishMsg(ctx, s.record(recs[0]), jetstream.WithMsgID(s.msgID(recs[0].Offset)),
		jetstream.WithExpectLastSequencePerSubject(s.lastSeq))
	if err != nil {
		return 0, err
	}
	s.stored(recs[0], ack)
	futs := make([]jetstream.PubAckFuture, 0, len(recs)-1)
	for i, r := range recs[1:] {
		// The subject's sequence alone does not chain them: a fence published meanwhile
		// takes the sequence the first of them expected to follow, the first is refused,
		// and the rest, expecting one more each, would then follow the fence (chaos, 60
		// minutes: a fenced router's offsets kept after the fence of the next epoch). Each
		// also expects the stream's last message to be its predecessor, which a fence (or
		// any other message) breaks for all that follow.
		f, err := s.js.PublishMsgAsync(s.record(r), jetstream.WithMsgID(s.msgID(r.Offset)),
			jetstream.WithExpectLastSequencePerSubject(ack.Sequence+uint64(i)),
			jetstream.WithExpectLastMsgID(s.msgID(recs[i].Offset)))
		if err != nil {
			break
		}
		futs = append(futs, f)
	}
	n := 1
	var first error
	for i, f := range futs {
		select {
		case a := <-f.Ok():
			if first == nil {
				s.stored(recs[i+1], a)
				n++
			}
		case err := <-f.Err():
			if first == nil {
				first = err
			}
		case <-ctx.Done():
			return n, ctx.Err()
		}
	}
	if first == nil && n < len(recs) {
		first = fmt.Errorf("publish of offset %d not sent", recs[n].Offset)
	}
	return n, first
}

func (s *NATSSink) stored(r Record, ack *jetstream.PubAck) {
	s.delivered = r.Offset
	if ack.Sequence > s.lastSeq {
		s.lastSeq = ack.Sequence
	}
}

// Sync does nothing: an acknowledged message is stored.
func (s *NATSSink) Sync(context.Context) error { return nil }

// Close drains nothing (every write waited for its acknowledgements) and closes.
func (s *NATSSink) Close() error {
	if s.nc != nil {
		s.nc.Close()
	}
	return nil
}
