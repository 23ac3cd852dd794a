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
// exceptions.
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
	b.WriteString("-A POSTROUTING -o eth0 -j DROP\nCOMMIT\n")
	if err := h.restore(ctx, b.String()); err != nil {
		return fmt.Errorf("netlab: cut %s: %w", h.name, err)
	}
	h.mu.Lock()
	h.cut = true
	h.mu.Unlock()
	names := make([]string, len(except))
	for i, p := range except {
		names[i] = p.name
	}
	h.lab.logf("netlab: %s cut (still reaching %v)", h.name, names)
	return nil
}

// Heal removes the host's cut: its mangle table is the lab's alone, and is emptied.
func (h *Host) Heal(ctx context.Context) error {
	if err := h.restore(ctx, "*mangle\nCOMMIT\n"); err != nil {
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

// restore replaces the mangle table of the host's namespace in one transaction.
func (h *Host) restore(ctx context.Context, rules string) error {
	cmd := h.CommandContext(ctx, "iptables-restore")
	cmd.Stdin = strings.NewReader(rules)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables-restore: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
