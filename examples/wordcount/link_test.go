package wordcount_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/examples/wordcount"
	"github.com/stormdock/stormdock/internal/natstest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/multidc"
)

// Two links of two workers each send the sample through a real router to a file sink; one
// link stops mid-stream. The sink holds every line's record exactly once, in order.
func TestLinksThroughRouter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := coord.NewServer(coord.ServerOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	store, err := srv.Connect(coord.Options{SessionTimeout: -1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	// The file sink below a sink dir, in its tenant's part, as the agent makes it.
	sinkDir := t.TempDir()
	if err := os.Mkdir(filepath.Join(sinkDir, "acme"), 0o750); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(sinkDir, "acme", "out.jsonl")
	sink, err := multidc.OpenSink(ctx, "file://"+out, multidc.SinkOptions{SinkDir: sinkDir, Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	const token = "sdo_wc"
	r, err := multidc.New(multidc.Config{Job: "wc", Links: []string{"dc-a", "dc-b"}, Store: store, Sink: sink,
		Listen: "127.0.0.1:0", Logger: quiet, TokenHash: api.HashToken(token)})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRouter := context.WithCancel(ctx)
	routerDone := make(chan error, 1)
	go func() { routerDone <- r.Run(rctx) }()
	defer func() { stopRouter(); <-routerDone }()

	const lines = 2000
	input := filepath.Join(t.TempDir(), "input.txt")
	var text strings.Builder
	for i := range lines {
		text.WriteString(strings.Repeat("storm dock ", i%5+1) + "\n")
	}
	if err := os.WriteFile(input, []byte(text.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	links := map[string][]context.CancelFunc{}
	done := make(chan error, 4)
	for _, link := range []string{"dc-a", "dc-b"} {
		for w := range 2 {
			wctx, stop := context.WithCancel(ctx)
			links[link] = append(links[link], stop)
			cfg := wordcount.Config{Input: input, OutputURL: r.URL(), OutputToken: token, Link: link, Job: "wc", Worker: w, Workers: 2, Rate: 1000, Logger: quiet}
			go func() { done <- wordcount.Run(wctx, cfg) }()
		}
	}
	// Stop the active link while it streams, once records flow: the router fails over to the
	// other.
	var st multidc.Status
	testenv.EventuallyWith(t, "an active link delivering", 10*time.Second, func() (bool, string) {
		var err error
		st, err = r.Status()
		return err == nil && st.Active != "" && st.Delivered >= 0, fmt.Sprintf("status %+v, %v", st, err)
	})
	if st.Delivered >= lines-1 {
		t.Fatalf("every line delivered before the active link could be stopped: %+v", st)
	}
	active := st.Active
	for _, stop := range links[active] {
		stop()
	}
	var offsets []int64
	testenv.EventuallyWith(t, "every line in the sink", 30*time.Second, func() (bool, string) {
		offsets = readOffsets(t, out)
		return len(offsets) >= lines, fmt.Sprintf("the sink has %d records", len(offsets))
	})
	for _, stops := range links {
		for _, stop := range stops {
			stop()
		}
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	}
	if len(offsets) != lines {
		t.Fatalf("sink has %d records, want %d", len(offsets), lines)
	}
	if b, _ := os.ReadFile(out); !strings.Contains(string(b), `"link":"dc-a"`) || !strings.Contains(string(b), `"link":"dc-b"`) {
		t.Errorf("the sink does not hold records of both links: no failover happened")
	}
	for i, off := range offsets {
		if off != int64(i) {
			t.Fatalf("sink record %d has offset %d: lost or repeated records", i, off)
		}
	}
}

func readOffsets(t *testing.T, path string) []int64 {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var rec struct {
			Offset int64 `json:"offset"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("sink line %q: %v", sc.Text(), err)
		}
		out = append(out, rec.Offset)
	}
	return out
}

// Two links of two workers each read the input from a JetStream stream (stream sequence N
// is offset N-1) and send through a real router into a JetStream sink; one link stops
// mid-stream. The sink subject, read from the server, holds every offset once, in order,
// with the record of its line, and a gap record where the input lost a message.
func TestLinksFromJetStream(t *testing.T) {
	srv := natstest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	name := fmt.Sprintf("WCIN%d", time.Now().UnixNano())
	in, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name)}})
	if err != nil {
		t.Fatal(err)
	}
	defer js.DeleteStream(context.Background(), name)
	const lines = 2000
	words := func(i int) string { return strings.Repeat("storm dock ", i%5+1) }
	for i := range lines {
		if _, err := js.PublishAsync(strings.ToLower(name), []byte(words(i))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publishing the input")
	}
	if err := in.DeleteMsg(ctx, 10); err != nil { // offset 9 is lost from the input
		t.Fatal(err)
	}

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cs, err := coord.NewServer(coord.ServerOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	store, err := cs.Connect(coord.Options{SessionTimeout: -1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	out := strings.ToLower(name) + ".out"
	sink, err := multidc.OpenSink(ctx, srv.URL()+"/"+out+"?stream="+name+"OUT", multidc.SinkOptions{Job: "wc", Router: "r", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer js.DeleteStream(context.Background(), name+"OUT")
	const token = "sdo_wc"
	r, err := multidc.New(multidc.Config{Job: "wc", Links: []string{"dc-a", "dc-b"}, Store: store, Sink: sink,
		Listen: "127.0.0.1:0", Logger: quiet, TokenHash: api.HashToken(token)})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRouter := context.WithCancel(ctx)
	routerDone := make(chan error, 1)
	go func() { routerDone <- r.Run(rctx) }()
	defer func() { stopRouter(); <-routerDone }()

	links := map[string][]context.CancelFunc{}
	done := make(chan error, 4)
	for _, link := range []string{"dc-a", "dc-b"} {
		for w := range 2 {
			wctx, stop := context.WithCancel(ctx)
			links[link] = append(links[link], stop)
			cfg := wordcount.Config{Input: srv.URL() + "/" + name, OutputURL: r.URL(), OutputToken: token, Link: link, Job: "wc",
				Worker: w, Workers: 2, Rate: 1000, Logger: quiet}
			go func() { done <- wordcount.Run(wctx, cfg) }()
		}
	}
	var st multidc.Status
	testenv.EventuallyWith(t, "an active link delivering", 10*time.Second, func() (bool, string) {
		var err error
		st, err = r.Status()
		return err == nil && st.Active != "" && st.Delivered >= 0, fmt.Sprintf("status %+v, %v", st, err)
	})
	for _, stop := range links[st.Active] {
		stop()
	}
	testenv.EventuallyWith(t, "every line delivered", 30*time.Second, func() (bool, string) {
		st, _ = r.Status()
		return st.Delivered == lines-1, fmt.Sprintf("delivered %d", st.Delivered)
	})
	for _, stops := range links {
		for _, stop := range stops {
			stop()
		}
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	}
	// The sink, from the server's own view of the stream.
	o, err := js.Stream(ctx, name+"OUT")
	if err != nil {
		t.Fatal(err)
	}
	info, err := o.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	next, perLink := int64(0), map[string]int{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := o.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(multidc.HeaderKind) == multidc.KindFence {
			continue
		}
		var line struct {
			Offset int64  `json:"offset"`
			Link   string `json:"link"`
			Record struct {
				Offset int64          `json:"offset"`
				Gap    bool           `json:"gap"`
				Counts map[string]int `json:"counts"`
			} `json:"record"`
		}
		if err := json.Unmarshal(m.Data, &line); err != nil {
			t.Fatalf("sink message %d: %v", seq, err)
		}
		if line.Offset != next || line.Record.Offset != next {
			t.Fatalf("sink message %d holds offset %d, want %d: lost or repeated", seq, line.Offset, next)
		}
		switch {
		case next == 9 && !line.Record.Gap:
			t.Errorf("offset 9, deleted from the input, is %+v; want a gap record", line.Record)
		case next != 9 && line.Record.Counts["storm"] != int(next%5+1):
			t.Errorf("offset %d counts %v, want storm %d", next, line.Record.Counts, next%5+1)
		}
		perLink[line.Link]++
		next++
	}
	if next != lines || len(perLink) != 2 {
		t.Errorf("the sink holds %d offsets from links %v; want %d from both", next, perLink, lines)
	}
}
