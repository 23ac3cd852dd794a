package cluster

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want Bytes
		err  string
	}{
		{"256Mi", 256 << 20, ""},
		{"2Gi", 2 << 30, ""},
		{"1.5Gi", 3 << 29, ""},
		{"1G", 1e9, ""},
		{"64k", 64000, ""},
		{"1048576", 1 << 20, ""},
		{" 4Ki ", 4096, ""},
		{"", 0, "empty"},
		{"-1Mi", 0, "negative"},
		{"12MB", 0, "unknown unit"},
		{"lots", 0, "not a number"},
		{"0x10", 0, "not a number"},
		{"9999999Pi", 0, "too large"},
		{"NaN", 0, "not a number"},
	}
	for _, tc := range tests {
		got, err := ParseBytes(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseBytes(%q) error = %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestBytesString(t *testing.T) {
	for b, want := range map[Bytes]string{0: "0", 256 << 20: "256Mi", 2 << 30: "2Gi", 1000: "1000", 1536: "1536"} {
		if got := b.String(); got != want {
			t.Errorf("Bytes(%d).String() = %q, want %q", int64(b), got, want)
		}
	}
}

func TestParseCPU(t *testing.T) {
	tests := []struct {
		in   string
		want CPU
		err  bool
	}{
		{"0.5", 500, false}, {"2", 2000, false}, {"500m", 500, false}, {"0.0015", 2, false},
		{"", 0, true}, {"-1", 0, true}, {"1.5m", 0, true}, {"fast", 0, true}, {"Inf", 0, true},
	}
	for _, tc := range tests {
		got, err := ParseCPU(tc.in)
		if (err != nil) != tc.err || (!tc.err && got != tc.want) {
			t.Errorf("ParseCPU(%q) = %d, %v; want %d, err=%v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestQuantityJSONRoundTrip(t *testing.T) {
	in := Usage{Slots: 2, Memory: 3 << 30, CPU: 1500}
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != `{"slots":2,"memory":"3Gi","cpu":1.5}` {
		t.Errorf("marshal = %s", data)
	}
	var out Usage
	if err := json.Unmarshal(data, &out); err != nil || out != in {
		t.Errorf("round trip = %+v, %v", out, err)
	}
	if err := json.Unmarshal([]byte(`{"memory":"lots"}`), &out); err == nil {
		t.Error("bad memory accepted")
	}
}

// FuzzParseBytes checks that every accepted quantity survives String and parse again.
func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"256Mi", "2Gi", "1.5G", "0", "12", "-1", "1e3", "Ki"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := ParseBytes(s)
		if err != nil {
			return
		}
		if b < 0 {
			t.Fatalf("ParseBytes(%q) = %d, negative", s, b)
		}
		back, err := ParseBytes(b.String())
		if err != nil || back != b {
			t.Fatalf("ParseBytes(%q) = %d; String %q parses to %d, %v", s, b, b.String(), back, err)
		}
	})
}

// FuzzParseCPU checks that every accepted cpu amount survives String and parse again.
func FuzzParseCPU(f *testing.F) {
	for _, s := range []string{"0.5", "2", "500m", "-1", "1e2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseCPU(s)
		if err != nil {
			return
		}
		if c < 0 {
			t.Fatalf("ParseCPU(%q) = %d, negative", s, c)
		}
		back, err := ParseCPU(c.String())
		if err != nil || back != c {
			t.Fatalf("ParseCPU(%q) = %d; String %q parses to %d, %v", s, c, c.String(), back, err)
		}
	})
}

// FuzzParseJobSpec checks that no input panics and that an accepted spec survives a JSON
// round trip unchanged.
func FuzzParseJobSpec(f *testing.F) {
	f.Add([]byte("name: a\ntenant: t\nworkers: 1\nresources: {memory: 64Mi, cpu: 1}\ncommand: [x]\n"))
	f.Add([]byte(`{"name":"m","tenant":"t","workers":2,"resources":{"memory":"64Mi","cpu":"500m"},"command":["x"],"links":["a","b"],"output":"file:///o"}`))
	f.Add([]byte("workers: [1\n"))
	f.Add([]byte("&a [*a]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		j, err := ParseJobSpec(data)
		if err != nil {
			return
		}
		out, err := json.Marshal(j)
		if err != nil {
			t.Fatalf("marshal accepted spec: %v", err)
		}
		j2, err := ParseJobSpec(out)
		if err != nil {
			t.Fatalf("accepted spec does not parse back from %s: %v", out, err)
		}
		out2, _ := json.Marshal(j2)
		if string(out) != string(out2) {
			t.Fatalf("round trip changed the spec:\n%s\n%s", out, out2)
		}
	})
}

// FuzzParseInventory checks that no cluster file panics the parser and accepted ones round-trip.
func FuzzParseInventory(f *testing.F) {
	f.Add([]byte(`{"nodes":[{"id":"n1","dc":"dc-a","rack":"r1","slots":16,"memory":"64Gi","cpu":32,"labels":{"disk":"ssd"},"used":{"slots":1,"memory":"256Mi","cpu":0.5}}]}`))
	f.Add([]byte(`{"nodes":[{"id":"n1"},{"id":"n1"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		inv, err := ParseInventory(data)
		if err != nil {
			return
		}
		out, err := json.Marshal(inv)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		if _, err := ParseInventory(out); err != nil {
			t.Fatalf("accepted inventory does not parse back from %s: %v", out, err)
		}
	})
}
