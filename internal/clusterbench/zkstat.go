package clusterbench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// fourLetter sends a ZooKeeper four-letter command and returns the answer's key/value lines
// ("key\tvalue" for mntr, "key=value" for conf, "Key: value" for srvr).
// dial reaches the server (nil: net.Dialer; over TLS for a zks:// store).
func fourLetter(ctx context.Context, dial dialFunc, addr, cmd string) (map[string]string, error) {
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := dial(dctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, cmd); err != nil {
		return nil, err
	}
	out := map[string]string{}
	s := bufio.NewScanner(c)
	s.Buffer(make([]byte, 64<<10), 4<<20)
	lines := 0
	for s.Scan() {
		line := s.Text()
		lines++
		if strings.Contains(line, "is not executed because it is not in the whitelist") {
			return nil, fmt.Errorf("%s is not allowed: add 4lw.commands.whitelist=mntr,conf,srvr to zoo.cfg", cmd)
		}
		for _, sep := range []string{"\t", "=", ": "} {
			if k, v, ok := strings.Cut(line, sep); ok {
				out[strings.TrimSpace(k)] = strings.TrimSpace(v)
				break
			}
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	if lines == 0 {
		return nil, fmt.Errorf("%s: no answer (is 4lw.commands.whitelist=mntr,conf,srvr in zoo.cfg?)", cmd)
	}
	return out, nil
}

// zkSample is what the benchmark reads of the server at one moment.
type zkSample struct {
	at         time.Time
	writes     int64 // write requests the server completed (zk_cnt_updatelatency, or the zxid)
	nsWrites   int64 // of those, in the benchmark's namespace (its chroot's first segment)
	nsBytes    int64 // bytes written there
	znodes     int64
	dataBytes  int64
	watches    int64
	conns      int64
	ephemerals int64
}

func sampleZK(ctx context.Context, dial dialFunc, addr, namespace string) (zkSample, error) {
	m, err := fourLetter(ctx, dial, addr, "mntr")
	if err != nil {
		return zkSample{}, err
	}
	num := func(k string) int64 {
		n, _ := strconv.ParseInt(m[k], 10, 64)
		return n
	}
	s := zkSample{at: time.Now(), writes: num("zk_cnt_updatelatency"), znodes: num("zk_znode_count"),
		dataBytes: num("zk_approximate_data_size"), watches: num("zk_watch_count"),
		conns: num("zk_num_alive_connections"), ephemerals: num("zk_ephemerals_count")}
	if namespace != "" {
		s.nsWrites = num("zk_cnt_" + namespace + "_write_per_namespace")
		s.nsBytes = num("zk_sum_" + namespace + "_write_per_namespace")
	}
	if _, ok := m["zk_cnt_updatelatency"]; !ok {
		// Servers before 3.6 have no update counter: every write moves the zxid by one.
		srvr, err := fourLetter(ctx, dial, addr, "srvr")
		if err != nil {
			return zkSample{}, err
		}
		zxid, err := strconv.ParseInt(strings.TrimPrefix(srvr["Zxid"], "0x"), 16, 64)
		if err != nil {
			return zkSample{}, fmt.Errorf("srvr: zxid %q: %v", srvr["Zxid"], err)
		}
		s.writes = zxid & 0xffffffff
	}
	return s, nil
}

// Rates is ZooKeeper's write load over a span of the benchmark.
type Rates struct {
	Seconds float64 `json:"seconds"`
	// WritesPerSecond counts the server's write requests (a multi-op transaction is one),
	// session creation and closing included.
	WritesPerSecond float64 `json:"writesPerSecond"`
	// NamespaceWritesPerSecond and NamespaceBytesPerSecond are the writes under the
	// benchmark's chroot, and their bytes.
	NamespaceWritesPerSecond float64 `json:"namespaceWritesPerSecond"`
	NamespaceBytesPerSecond  float64 `json:"namespaceBytesPerSecond"`
}

func rates(a, b zkSample) Rates {
	d := b.at.Sub(a.at).Seconds()
	if d <= 0 {
		return Rates{}
	}
	return Rates{Seconds: round(d, 3), WritesPerSecond: round(float64(b.writes-a.writes)/d, 1),
		NamespaceWritesPerSecond: round(float64(b.nsWrites-a.nsWrites)/d, 1),
		NamespaceBytesPerSecond:  round(float64(b.nsBytes-a.nsBytes)/d, 0)}
}

// checkServer refuses a server that cannot hold the benchmark's sessions from one address,
// or does not answer the four-letter words it reads.
func checkServer(ctx context.Context, dial dialFunc, addr string, sessions int) error {
	conf, err := fourLetter(ctx, dial, addr, "conf")
	if err != nil {
		return fmt.Errorf("ZooKeeper at %s: %v", addr, err)
	}
	if v, ok := conf["maxClientCnxns"]; ok {
		n, _ := strconv.Atoi(v)
		if n > 0 && n < sessions {
			return fmt.Errorf("ZooKeeper at %s allows %d connections per client address (maxClientCnxns) and the benchmark opens %d from this one: set maxClientCnxns=0 in its zoo.cfg", addr, n, sessions)
		}
	}
	m, err := fourLetter(ctx, dial, addr, "mntr")
	if err != nil {
		return fmt.Errorf("ZooKeeper at %s: %v", addr, err)
	}
	// Each session is a connection, an open file of the server's (Unix servers say how
	// many they may open).
	maxFDs, _ := strconv.Atoi(m["zk_max_file_descriptor_count"])
	open, _ := strconv.Atoi(m["zk_open_file_descriptor_count"])
	if maxFDs > 0 && maxFDs-open < sessions+16 {
		return fmt.Errorf("ZooKeeper at %s may open %d files and has %d open: the benchmark's %d sessions do not fit; raise its ulimit -n, or share sessions among the nodes of a rack (--nodes-per-session)",
			addr, maxFDs, open, sessions)
	}
	return nil
}

type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)
