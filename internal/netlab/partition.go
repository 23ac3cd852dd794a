package netlab

import (
	"context"
	"fmt"
	"strings"
)

// Cut partitions the host from every other host but except: everything in or out through its
// eth0 is dropped, in both directions, from inside the host's own namespace, so nothing else
// of the machine changes. Established connections hang as across a real partition (no reset
// is sent). The drops are in the mangle table, PREROUTING for what comes in and POSTROUTING
// for what goes out: the filter table's OUTPUT chain misses packets that were re-routed from
// loopback to eth0, POSTROUTING sees every packet that leaves. Cutting a cut host replaces its
// exceptions (and any Reject or CutFrom rules).
func (h *Host) Cut(ctx context.Context, except ...*Host) error {
	var b strings.Builder
	b.WriteString("*mangle\n")
	for _, p := range except {
		fmt.Fprintf(&b, "-A PREROUTING -i eth0 -s %s -j ACCEPT\n", p.addr)
	}
	b.WriteString("-A PREROUTING -i eth0 -j DROP\n")
	for _, p := range except {
		fmt.Fprintf(&b, "-A POSTROUTING -o eth0 -d %s -j ACCEPT\n", p.addr)
	}
	b.WriteString("-A POSTROUTING -o eth0 -j DROP\nCOMMIT\n*filter\nCOMMIT\n")
	if err := h.restore(ctx, b.String()); err != nil {
		return fmt.Errorf("netlab: cut %s: %w", h.name, err)
	}
	h.mu.Lock()
	h.cut = true
	h.mu.Unlock()
	h.lab.logf("netlab: %s cut (still reaching %v)", h.name, hostNames(except))
	return nil
}

// Reject cuts the host as Cut does, but loudly, as a firewall with REJECT rules does: its
// kernel refuses what comes in with TCP resets (ICMP port unreachable for anything else),
// and what goes out fails at once with "connection refused" rather than timing out. To
// whoever tries, a rejecting host looks like one where nothing listens, and the host sees
// every other as such. The rules are in the filter table (REJECT is not allowed in mangle),
// INPUT and OUTPUT on eth0; mangle's POSTROUTING still drops what leaves by another path.
// Cutting a cut host replaces its rules, Heal removes them.
func (h *Host) Reject(ctx context.Context, except ...*Host) error {
	var b strings.Builder
	b.WriteString("*mangle\n")
	for _, p := range except {
		fmt.Fprintf(&b, "-A POSTROUTING -o eth0 -d %s -j ACCEPT\n", p.addr)
	}
	b.WriteString("-A POSTROUTING -o eth0 -p tcp --tcp-flags RST RST -j ACCEPT\n")
	b.WriteString("-A POSTROUTING -o eth0 -p icmp -j ACCEPT\n")
	b.WriteString("-A POSTROUTING -o eth0 -j DROP\nCOMMIT\n*filter\n")
	for _, chain := range []struct{ name, dir, who string }{{"INPUT", "-i", "-s"}, {"OUTPUT", "-o", "-d"}} {
		for _, p := range except {
			fmt.Fprintf(&b, "-A %s %s eth0 %s %s -j ACCEPT\n", chain.name, chain.dir, chain.who, p.addr)
		}
		if chain.name == "OUTPUT" {
			// The refusals themselves leave through OUTPUT.
			b.WriteString("-A OUTPUT -o eth0 -p tcp --tcp-flags RST RST -j ACCEPT\n")
			b.WriteString("-A OUTPUT -o eth0 -p icmp -j ACCEPT\n")
		}
		fmt.Fprintf(&b, "-A %s %s eth0 -p tcp -j REJECT --reject-with tcp-reset\n", chain.name, chain.dir)
		fmt.Fprintf(&b, "-A %s %s eth0 -j REJECT\n", chain.name, chain.dir)
	}
	b.WriteString("COMMIT\n")
	if err := h.restore(ctx, b.String()); err != nil {
		return fmt.Errorf("netlab: reject %s: %w", h.name, err)
	}
	h.mu.Lock()
	h.cut = true
	h.mu.Unlock()
	h.lab.logf("netlab: %s cut, rejecting (still reaching %v)", h.name, hostNames(except))
	return nil
}

// CutFrom cuts the host off from peers alone, both ways, silently (dropped, as Cut does):
// an asymmetric partition, in which the host and each of peers still reach everyone else.
// A ZooKeeper follower cut from its leader, say, while its clients still reach it. The
// drops are added to whatever cut the host has; Heal removes them all.
func (h *Host) CutFrom(ctx context.Context, peers ...*Host) error {
	if len(peers) == 0 {
		return nil
	}
	var b strings.Builder
	for _, p := range peers {
		fmt.Fprintf(&b, "-I PREROUTING -i eth0 -s %s -j DROP\n", p.addr)
		fmt.Fprintf(&b, "-I POSTROUTING -o eth0 -d %s -j DROP\n", p.addr)
	}
	if err := h.restoreNoFlush(ctx, "*mangle\n"+b.String()+"COMMIT\n"); err != nil {
		return fmt.Errorf("netlab: cut %s from %v: %w", h.name, hostNames(peers), err)
	}
	h.mu.Lock()
	h.cut = true
	h.mu.Unlock()
	h.lab.logf("netlab: %s cut from %v", h.name, hostNames(peers))
	return nil
}

func hostNames(hs []*Host) []string {
	names := make([]string, len(hs))
	for i, p := range hs {
		names[i] = p.name
	}
	return names
}

// Heal removes the host's cut: its mangle and filter tables are the lab's alone, and are
// emptied.
func (h *Host) Heal(ctx context.Context) error {
	if err := h.restore(ctx, "*mangle\nCOMMIT\n*filter\nCOMMIT\n"); err != nil {
		return fmt.Errorf("netlab: heal %s: %w", h.name, err)
	}
	h.mu.Lock()
	h.cut = false
	h.mu.Unlock()
	h.lab.logf("netlab: %s healed", h.name)
	return nil
}

// IsCut reports whether the host is cut now.
func (h *Host) IsCut() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cut
}

// restore replaces the tables named in rules, in the host's namespace, in one transaction.
func (h *Host) restore(ctx context.Context, rules string) error {
	return h.iptablesRestore(ctx, rules)
}

// restoreNoFlush adds rules to the tables named, keeping what they hold.
func (h *Host) restoreNoFlush(ctx context.Context, rules string) error {
	return h.iptablesRestore(ctx, rules, "--noflush")
}

func (h *Host) iptablesRestore(ctx context.Context, rules string, args ...string) error {
	cmd := h.CommandContext(ctx, "iptables-restore", args...)
	cmd.Stdin = strings.NewReader(rules)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables-restore: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
