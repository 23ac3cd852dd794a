package e2e

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	bin "encoding/binary"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/pki"
	"github.com/stormdock/stormdock/internal/testenv"
)

// The audits of what a run leaves readable: every value in the store, and every byte that
// crossed loopback between the run's processes. Each takes a list of secrets the run made
// (tenant secrets' values, tokens, credentials, keys) and reports where one is in clear.

// secret is a value that must not be found, with a name for messages (never the value).
type secret struct {
	what  string
	value []byte
}

// keyFileSecrets are the key material of a PEM file (a private key's DER bytes, base64 as
// PEM and JSON write them) or of a keyring file (each key's base64), as secrets.
func keyFileSecrets(t *testing.T, what, file string) []secret {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	var out []secret
	for rest := b; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		out = append(out, secret{what + " (" + blk.Type + ")", []byte(base64.StdEncoding.EncodeToString(blk.Bytes))})
	}
	if len(out) > 0 {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && !strings.HasPrefix(f[0], "#") {
			out = append(out, secret{what + " key " + f[0], []byte(f[1])})
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s %s holds no key", what, file)
	}
	return out
}

// storeValues reads every entry of the store below root: its value by key.
func storeValues(t *testing.T, s coord.Store, root string) map[string][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := map[string][]byte{}
	var walk func(string)
	walk = func(k string) {
		if e, err := s.Get(ctx, k); err == nil {
			out[k] = e.Value
		}
		kids, err := s.Children(ctx, k)
		if err != nil {
			return
		}
		for _, c := range kids {
			walk(path.Join(k, c))
		}
	}
	walk(root)
	return out
}

// auditStore fails the test for every value of the store that holds one of secrets, or a
// private key anywhere but at the keys allowed (the ones the design keeps in the store,
// argued for in docs/security.md).
func auditStore(t *testing.T, values map[string][]byte, secrets []secret, allowKeys map[string]bool) {
	t.Helper()
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := values[k]
		for _, s := range secrets {
			if len(s.value) > 0 && bytes.Contains(v, s.value) {
				t.Errorf("store entry %s holds %s in clear", k, s.what)
			}
		}
		if bytes.Contains(v, []byte("PRIVATE KEY")) && !allowKeys[k] {
			t.Errorf("store entry %s holds a private key", k)
		}
	}
}

// capture is tcpdump writing the loopback's TCP traffic to a file, from before the run's
// processes start until stop.
type capture struct {
	cmd  *exec.Cmd
	file string
	once sync.Once
}

// startCapture starts tcpdump on lo, leaving out the ports of the machine's shared services
// (ZooKeeper on 2181, the registry on 5055), which the run does not use: its ZooKeeper, master,
// agents, routers and workers have ports of their own. With CI=true a missing tcpdump
// fails the test (scripts/test installs Debian's).
func startCapture(t *testing.T) *capture {
	t.Helper()
	bin, err := exec.LookPath("tcpdump")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("the wire audit needs tcpdump (Debian's tcpdump; scripts/test installs it)")
		}
		t.Skip("no tcpdump")
	}
	c := &capture{file: filepath.Join(t.TempDir(), "run.pcap")}
	// -U writes each packet as it comes, so that stop loses nothing; -s 0 whole packets.
	c.cmd = exec.Command(bin, "-i", "lo", "-U", "-s", "0", "-n", "-w", c.file, "tcp and not port 2181 and not port 5055")
	var errOut testenv.Buffer
	c.cmd.Stderr = &errOut
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.stop)
	testenv.EventuallyWith(t, "tcpdump listening", 30*time.Second, func() (bool, string) {
		return strings.Contains(errOut.String(), "listening on lo"), errOut.String()
	})
	return c
}

// stop ends tcpdump (the process this test started) and waits for it to write the rest.
func (c *capture) stop() {
	c.once.Do(func() {
		_ = c.cmd.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() {
			_ = c.cmd.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Kill()
			<-done
		}
	})
}

// flow is one direction of a TCP connection on loopback.
type flow struct{ src, dst uint16 }

// flows stops the capture and returns each flow's payload, in the order captured.
func (c *capture) flows(t *testing.T) map[flow][]byte {
	t.Helper()
	c.stop()
	b, err := os.ReadFile(c.file)
	if err != nil {
		t.Fatal(err)
	}
	out, err := parsePcap(b)
	if err != nil {
		t.Fatalf("capture %s: %v", c.file, err)
	}
	return out
}

// parsePcap reads a classic pcap file (as tcpdump -w writes) of Ethernet or Linux cooked
// frames carrying IPv4 or IPv6, and returns every TCP flow's payload.
func parsePcap(b []byte) (map[flow][]byte, error) {
	if len(b) < 24 {
		return nil, fmt.Errorf("%d bytes: not a pcap file", len(b))
	}
	var bo bin.ByteOrder
	switch m := bin.LittleEndian.Uint32(b); m {
	case 0xa1b2c3d4, 0xa1b23c4d:
		bo = bin.LittleEndian
	case 0xd4c3b2a1, 0x4d3cb2a1:
		bo = bin.BigEndian
	default:
		return nil, fmt.Errorf("magic %#x: not a pcap file", m)
	}
	link := bo.Uint32(b[20:24])
	out := map[flow][]byte{}
	for off := 24; off+16 <= len(b); {
		n := int(bo.Uint32(b[off+8:]))
		off += 16
		if off+n > len(b) {
			break // cut short by the stop
		}
		frame := b[off : off+n]
		off += n
		var proto uint16
		switch link {
		case 1: // Ethernet
			if len(frame) < 14 {
				continue
			}
			proto, frame = bin.BigEndian.Uint16(frame[12:14]), frame[14:]
		case 113: // Linux cooked
			if len(frame) < 16 {
				continue
			}
			proto, frame = bin.BigEndian.Uint16(frame[14:16]), frame[16:]
		case 276: // Linux cooked v2
			if len(frame) < 20 {
				continue
			}
			proto, frame = bin.BigEndian.Uint16(frame[0:2]), frame[20:]
		default:
			return nil, fmt.Errorf("link type %d not read", link)
		}
		var tcp []byte
		switch proto {
		case 0x0800:
			if len(frame) < 20 || frame[9] != 6 {
				continue
			}
			ihl, total := int(frame[0]&0x0f)*4, int(bin.BigEndian.Uint16(frame[2:4]))
			if total > len(frame) || ihl > total {
				total = len(frame)
			}
			tcp = frame[min(ihl, total):total]
		case 0x86dd:
			if len(frame) < 40 || frame[6] != 6 {
				continue
			}
			tcp = frame[40:min(40+int(bin.BigEndian.Uint16(frame[4:6])), len(frame))]
		default:
			continue
		}
		if len(tcp) < 20 {
			continue
		}
		doff := int(tcp[12]>>4) * 4
		if doff > len(tcp) {
			continue
		}
		f := flow{bin.BigEndian.Uint16(tcp[0:2]), bin.BigEndian.Uint16(tcp[2:4])}
		out[f] = append(out[f], tcp[doff:]...)
	}
	return out, nil
}

// auditWire fails the test for every flow to or from one of the run's ports (ours reports
// whether a port is the run's) whose payload holds one of secrets; exclude lists ports whose
// flows are not checked (an external sink the run talks plain HTTP to). It returns how many
// bytes of the run's it checked.
func auditWire(t *testing.T, flows map[flow][]byte, ours func(port uint16) bool, exclude map[uint16]bool, secrets []secret) int {
	t.Helper()
	checked := 0
	for f, payload := range flows {
		if exclude[f.src] || exclude[f.dst] || !(ours(f.src) || ours(f.dst)) {
			continue
		}
		checked += len(payload)
		for _, s := range secrets {
			if len(s.value) > 0 && bytes.Contains(payload, s.value) {
				t.Errorf("%s crossed loopback in clear, port %d -> %d", s.what, f.src, f.dst)
			}
		}
	}
	return checked
}

// TestParsePcap: the parser finds the payloads tcpdump wrote for a TCP exchange on lo.
func TestParsePcap(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pcap  []byte
		flows map[flow]string
	}{
		{"empty", append(pcapHeader(1), nil...), map[flow]string{}},
		{"ethernet ipv4", append(pcapHeader(1), pcapRecord(ethIPv4TCP(40000, 2281, "hello"))...), map[flow]string{{40000, 2281}: "hello"}},
		{"two segments", append(append(pcapHeader(1), pcapRecord(ethIPv4TCP(1, 2, "sec"))...), pcapRecord(ethIPv4TCP(1, 2, "ret"))...),
			map[flow]string{{1, 2}: "secret"}},
	} {
		got, err := parsePcap(tc.pcap)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(got) != len(tc.flows) {
			t.Errorf("%s: %d flows, want %d", tc.name, len(got), len(tc.flows))
		}
		for f, want := range tc.flows {
			if string(got[f]) != want {
				t.Errorf("%s: flow %v = %q, want %q", tc.name, f, got[f], want)
			}
		}
	}
	if _, err := parsePcap([]byte("not a capture at all, really")); err == nil {
		t.Error("parsed junk")
	}
}

func pcapHeader(link uint32) []byte {
	b := make([]byte, 24)
	bin.LittleEndian.PutUint32(b[0:], 0xa1b2c3d4)
	bin.LittleEndian.PutUint16(b[4:], 2)
	bin.LittleEndian.PutUint16(b[6:], 4)
	bin.LittleEndian.PutUint32(b[16:], 262144)
	bin.LittleEndian.PutUint32(b[20:], link)
	return b
}

func pcapRecord(frame []byte) []byte {
	h := make([]byte, 16)
	bin.LittleEndian.PutUint32(h[8:], uint32(len(frame)))
	bin.LittleEndian.PutUint32(h[12:], uint32(len(frame)))
	return append(h, frame...)
}

func ethIPv4TCP(src, dst uint16, payload string) []byte {
	eth := make([]byte, 14)
	bin.BigEndian.PutUint16(eth[12:], 0x0800)
	ip := make([]byte, 20)
	ip[0], ip[9] = 0x45, 6
	tcp := make([]byte, 20)
	bin.BigEndian.PutUint16(tcp[0:], src)
	bin.BigEndian.PutUint16(tcp[2:], dst)
	tcp[12] = 5 << 4
	bin.BigEndian.PutUint16(ip[2:], uint16(20+20+len(payload)))
	return append(append(append(eth, ip...), tcp...), payload...)
}

// httpsAdmin is an admin client of the cluster's https:// master, trusting the CA its first
// start made in the data directory.
func httpsAdmin(t testing.TB, h *harness, url string) *api.Client {
	t.Helper()
	data := filepath.Join(h.Dir, "data")
	var pool *x509.CertPool
	testenv.Eventually(t, "the master's CA", 30*time.Second, func() bool {
		var err error
		pool, err = api.CAPool(filepath.Join(data, pki.CACertFile))
		return err == nil
	})
	clustertest.AdminClient(t, data, url) // waits for the token
	tok, _ := os.ReadFile(filepath.Join(data, api.AdminTokenFile))
	cl, err := api.NewClient(url, strings.TrimSpace(string(tok)), api.WithRootCAs(pool))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// auditSecrets runs, on the cluster of TestStoreOverTLS, what puts secrets in the store and
// on the wire: a tenant's token, its secrets (one read by a job, rotated, then the job rolled
// out to a new generation; one the output secret of a mirrored job whose routers post to an
// HTTP sink with it), its registry credentials. Then it audits the store (every value) and
// the captured traffic of the run's ports for each, and for the keys the processes hold
// (keyring, nodes' identities, the master's TLS key, the agent key, the router CA's key, the
// sender tokens). The HTTP sink is plain HTTP, outside the cluster: its flows are left out,
// and serve as the capture's control (the output secret is seen there, as sent).
func auditSecrets(t *testing.T, h *harness, wire *capture, cl *api.Client, masterURL, keyFile, input string) {
	ctx := context.Background()
	tok, err := cl.TenantToken(ctx, "e2e")
	if err != nil {
		t.Fatal(err)
	}
	pool, _ := api.CAPool(filepath.Join(h.Dir, "data", pki.CACertFile))
	tcl, err := api.NewClient(masterURL, tok, api.WithRootCAs(pool))
	if err != nil {
		t.Fatal(err)
	}
	v1, v2 := "audit-db-"+api.NewToken()[:20], "audit-db-rotated-"+api.NewToken()[:20]
	sinkPass := "audit-sink-" + api.NewToken()[:20]
	regUser, regPass := "e2e-user", "audit-registry-"+api.NewToken()[:16]
	for name, v := range map[string]string{"db": v1, "sinkpass": sinkPass} {
		if _, err := tcl.SetSecret(ctx, "e2e", name, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tcl.SetRegistryAuth(ctx, "e2e", []byte(fmt.Sprintf(`{"auths": {"127.0.0.1:5999": {"username": %q, "password": %q}}}`, regUser, regPass))); err != nil {
		t.Fatal(err)
	}
	// An HTTP sink of the test's own: what the routers post, with the output secret.
	var mu sync.Mutex
	var bearers []string
	lines := 0
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		bearers = append(bearers, r.Header.Get("Authorization"))
		lines += bytes.Count(body, []byte("\n"))
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(recv.Close)
	out := worldDir(t)
	for _, spec := range []string{fmt.Sprintf(`name: mirrorhttp
tenant: e2e
workers: 1
resources: {memory: 64Mi, cpu: 0.1}
command: [stormdock, worker, wordcount, --input, %s, --rate, '300']
links: [dc-a, dc-b]
output: %s/in
outputSecret: sinkpass
gracePeriod: 1s
`, input, recv.URL), fmt.Sprintf(`name: reader
tenant: e2e
workers: 1
resources: {memory: 32Mi, cpu: 0.05}
secrets: [db]
env: {ROUND: '1'}
command: [sh, -c, 'while :; do cat "$STORMDOCK_SECRETS_DIR/db" > %[1]s/seen.tmp && mv %[1]s/seen.tmp %[1]s/seen; sleep 0.2; done']
gracePeriod: 1s
`, out)} {
		if _, err := tcl.SubmitJob(ctx, []byte(spec)); err != nil {
			t.Fatal(err)
		}
	}
	seen := func(what, want string) {
		t.Helper()
		testenv.EventuallyWith(t, what, 60*time.Second, func() (bool, string) {
			b, _ := os.ReadFile(filepath.Join(out, "seen"))
			return string(b) == want, fmt.Sprintf("read %d bytes", len(b))
		})
	}
	seen("the reader reads its secret", v1)
	testenv.EventuallyWith(t, "the HTTP sink gets the output with the output secret", 90*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return lines > 0 && len(bearers) > 0, fmt.Sprintf("%d lines, %d requests", lines, len(bearers))
	})
	mu.Lock()
	for _, b := range bearers {
		if b != "Bearer "+sinkPass {
			t.Errorf("the HTTP sink got Authorization %q...; want the output secret", b[:min(len(b), 12)])
			break
		}
	}
	mu.Unlock()
	if _, err := tcl.SetSecret(ctx, "e2e", "db", []byte(v2)); err != nil {
		t.Fatal(err)
	}
	seen("the reader reads the rotated secret", v2)
	// A rollout: a new generation of the reader, with its secret.
	if _, err := tcl.UpdateJob(ctx, "reader", []byte(fmt.Sprintf(`name: reader
tenant: e2e
workers: 1
resources: {memory: 32Mi, cpu: 0.05}
secrets: [db]
env: {ROUND: '2'}
command: [sh, -c, 'rm -f %[1]s/seen; while :; do cat "$STORMDOCK_SECRETS_DIR/db" > %[1]s/seen.tmp && mv %[1]s/seen.tmp %[1]s/seen; sleep 0.2; done']
gracePeriod: 1s
`, out)), api.PolicyOverrides{}); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyWith(t, "the reader's generation 2 running", 60*time.Second, func() (bool, string) {
		st, err := cl.Job(ctx, "reader")
		return err == nil && len(st.Workers) == 1 && st.Workers[0].Generation == 2 && st.Workers[0].State == cluster.WorkerRunning,
			fmt.Sprintf("%+v %v", st.Workers, err)
	})
	seen("generation 2 reads the secret", v2)

	// What must not be in clear.
	data := filepath.Join(h.Dir, "data")
	admin, _ := os.ReadFile(filepath.Join(data, api.AdminTokenFile))
	metrics, _ := os.ReadFile(filepath.Join(data, api.MetricsTokenFile))
	secrets := []secret{
		{"tenant e2e's secret db", []byte(v1)}, {"tenant e2e's secret db, rotated", []byte(v2)},
		{"the output secret", []byte(sinkPass)}, {"tenant e2e's token", []byte(tok)},
		{"the admin token", bytes.TrimSpace(admin)}, {"the scrape token", bytes.TrimSpace(metrics)},
		{"tenant e2e's registry password", []byte(regPass)},
		{"tenant e2e's registry auth", []byte(base64.StdEncoding.EncodeToString([]byte(regUser + ":" + regPass)))},
	}
	secrets = append(secrets, keyFileSecrets(t, "the masters' keyring", keyFile)...)
	secrets = append(secrets, keyFileSecrets(t, "the master's TLS key", filepath.Join(data, pki.MasterKeyFile))...)
	secrets = append(secrets, keyFileSecrets(t, "the master CA's key", filepath.Join(data, pki.CAKeyFile))...)
	nodes := h.NodeRecords()
	for id := range nodes {
		secrets = append(secrets, keyFileSecrets(t, "node "+id+"'s identity", filepath.Join(h.StateDir(id), "node.identity"))...)
	}
	values := storeValues(t, h.Store, "/")
	auditStore(t, values, secrets, map[string]bool{cluster.RouterCAKey: true})
	t.Logf("store audit: %d entries", len(values))

	// On the wire also what the store keeps for the cluster's own processes: they send it
	// over TLS alone.
	wireSecrets := append([]secret(nil), secrets...)
	for _, k := range []string{cluster.AgentKeyKey, cluster.OutputKeyKey} {
		if v := values[k]; len(v) > 0 {
			wireSecrets = append(wireSecrets, secret{"the store's " + k, v})
		}
	}
	if rca := values[cluster.RouterCAKey]; len(rca) > 0 {
		for rest := rca; ; {
			var blk *pem.Block
			if blk, rest = pem.Decode(rest); blk == nil {
				break
			}
			if strings.Contains(blk.Type, "PRIVATE KEY") {
				wireSecrets = append(wireSecrets, secret{"the router CA's key", blk.Bytes})
			}
		}
	}
	for k, v := range values {
		if !strings.HasPrefix(k, cluster.AssignmentsKey+"/") {
			continue
		}
		var na cluster.NodeAssignment
		if json.Unmarshal(v, &na) == nil {
			for _, w := range na.Workers {
				if w.OutputToken != "" {
					wireSecrets = append(wireSecrets, secret{"the sender token of " + w.Key.String(), []byte(w.OutputToken)})
				}
			}
		}
	}
	// The run's ports: its ZooKeeper, its master, and every port an agent serves on
	// (workers' logs) or gave a worker (routers, link workers).
	ports := map[uint16]bool{}
	addPort := func(hostport string) {
		if i := strings.LastIndex(hostport, ":"); i >= 0 {
			var p int
			fmt.Sscan(strings.TrimRight(hostport[i+1:], "/"), &p)
			ports[uint16(p)] = true
		}
	}
	addPort(strings.SplitN(strings.TrimPrefix(h.StoreURL(), "zks://"), "/", 2)[0])
	addPort(strings.TrimPrefix(masterURL, "https://"))
	for _, rec := range h.NodeRecords() {
		if rec.Logs != nil {
			ports[uint16(rec.Logs.Port)] = true
		}
		for _, w := range rec.Workers {
			if w.Port > 0 {
				ports[uint16(w.Port)] = true
			}
		}
	}
	recvPort := uint16(recv.Listener.Addr().(*net.TCPAddr).Port)
	flows := wire.flows(t)
	checked := auditWire(t, flows, func(p uint16) bool { return ports[p] }, map[uint16]bool{recvPort: true}, wireSecrets)
	// The capture sees clear text where there is some: the test's own plain-HTTP sink got
	// the output secret as its routers sent it.
	control := false
	for f, payload := range flows {
		if f.dst == recvPort && bytes.Contains(payload, []byte("Bearer "+sinkPass)) {
			control = true
		}
	}
	if !control || checked < 100_000 {
		t.Errorf("the capture saw %d bytes of the run's %d ports, and the control (the output secret to the plain-HTTP sink) %v: it did not see the run",
			checked, len(ports), control)
	}
	t.Logf("wire audit: %d bytes of %d flows on the run's %d ports, %d secrets", checked, len(flows), len(ports), len(wireSecrets))
}
