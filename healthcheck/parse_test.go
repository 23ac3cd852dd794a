package healthcheck

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestParseMeminfo(t *testing.T) {
	for _, tc := range []struct {
		file       string
		total, av  uint64
		used       float64
		wantErrSub string
	}{
		{file: "kernel6.txt", total: 24683620 << 10, av: 24175840 << 10, used: 1 - 24175840.0/24683620},
		// No MemAvailable (kernel < 3.14): free + buffers + cached.
		{file: "old-kernel.txt", total: 2048000 << 10, av: (512000 + 10240 + 204800) << 10, used: 1 - 727040.0/2048000},
		{file: "pressure.txt", total: 1048576 << 10, av: 104858 << 10, used: 1 - 104858.0/1048576},
		{file: "no-total.txt", wantErrSub: "no MemTotal"},
		{file: "bad-value.txt", wantErrSub: "bad value"},
		{file: "bad-unit.txt", wantErrSub: "unknown unit"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			m, err := ParseMeminfo(fixture(t, "meminfo/"+tc.file))
			if tc.wantErrSub != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErrSub) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErrSub)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.Total != tc.total || m.Available != tc.av {
				t.Errorf("got total %d avail %d, want %d %d", m.Total, m.Available, tc.total, tc.av)
			}
			if d := math.Abs(m.UsedFraction() - tc.used); d > 1e-9 {
				t.Errorf("used %v, want %v", m.UsedFraction(), tc.used)
			}
		})
	}
}

func TestParsePSI(t *testing.T) {
	for _, tc := range []struct {
		file    string
		want    PSI
		wantErr bool
	}{
		{file: "idle.txt"},
		{file: "busy.txt", want: PSI{SomeAvg10: 37.52, SomeAvg60: 12.07, SomeAvg300: 3.10, SomeTotal: 98765432,
			FullAvg10: 21.10, FullAvg60: 6.50, FullAvg300: 1.25, FullTotal: 45678901}},
		{file: "some-only.txt", want: PSI{SomeAvg10: 1.5, SomeAvg60: 0.75, SomeAvg300: 0.1, SomeTotal: 1234}},
		{file: "bad.txt", wantErr: true},
		{file: "unknown-line.txt", wantErr: true},
	} {
		t.Run(tc.file, func(t *testing.T) {
			p, err := ParsePSI(fixture(t, "psi/"+tc.file))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if !tc.wantErr && !psiClose(p, tc.want) {
				t.Errorf("got %+v\nwant %+v", p, tc.want)
			}
		})
	}
}

func psiClose(a, b PSI) bool {
	fs := [][2]float64{{a.SomeAvg10, b.SomeAvg10}, {a.SomeAvg60, b.SomeAvg60}, {a.SomeAvg300, b.SomeAvg300},
		{a.FullAvg10, b.FullAvg10}, {a.FullAvg60, b.FullAvg60}, {a.FullAvg300, b.FullAvg300}}
	for _, f := range fs {
		if math.Abs(f[0]-f[1]) > 1e-9 {
			return false
		}
	}
	return a.SomeTotal == b.SomeTotal && a.FullTotal == b.FullTotal
}

func TestParseMemoryStat(t *testing.T) {
	for _, tc := range []struct {
		file    string
		mode    Mode
		want    MemoryStat
		wantErr bool
	}{
		// v1 must take total_inactive_file (the parent and its workers), not inactive_file
		// (the parent's own pages only), and the hierarchical limit.
		{file: "v1.txt", mode: ModeV1, want: MemoryStat{InactiveFile: 20 << 20, HierarchicalLimit: 256 << 20}},
		{file: "v2.txt", mode: ModeV2, want: MemoryStat{InactiveFile: 20 << 20}},
		{file: "v1-no-total.txt", mode: ModeV1, wantErr: true},
		{file: "v2-no-inactive.txt", mode: ModeV2, wantErr: true},
		{file: "v1-bad.txt", mode: ModeV1, wantErr: true},
		{file: "v2.txt", mode: ModeNone, wantErr: true},
	} {
		t.Run(tc.mode.String()+"/"+tc.file, func(t *testing.T) {
			s, err := ParseMemoryStat(fixture(t, "memstat/"+tc.file), tc.mode)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if s != tc.want {
				t.Errorf("got %+v, want %+v", s, tc.want)
			}
		})
	}
	// The v1 root reports "no limit" as a huge number: no hierarchical limit.
	s, err := ParseMemoryStat([]byte("total_inactive_file 5\nhierarchical_memory_limit 9223372036854771712\n"), ModeV1)
	if err != nil || s.HierarchicalLimit != 0 || s.InactiveFile != 5 {
		t.Errorf("unlimited root: %+v %v", s, err)
	}
}

func TestParseLimitUsage(t *testing.T) {
	for in, want := range map[string]uint64{
		"max\n": 0, "9223372036854771712\n": 0, "268435456\n": 268435456, " 4096 ": 4096,
	} {
		got, err := ParseLimit([]byte(in))
		if err != nil || got != want {
			t.Errorf("ParseLimit(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "12k", "maxi", "99999999999999999999999"} {
		if _, err := ParseLimit([]byte(bad)); err == nil {
			t.Errorf("ParseLimit(%q): no error", bad)
		}
		if _, err := ParseUsage([]byte(bad)); err == nil && bad != "max" {
			t.Errorf("ParseUsage(%q): no error", bad)
		}
	}
	if v, err := ParseUsage([]byte("230686720\n")); err != nil || v != 230686720 {
		t.Errorf("ParseUsage = %d, %v", v, err)
	}
}

func TestParseLoadavg(t *testing.T) {
	l, err := ParseLoadavg(fixture(t, "proc/loadavg"))
	if err != nil || l != (LoadAvg{3.21, 2.10, 1.05}) {
		t.Errorf("got %+v, %v", l, err)
	}
	if _, err := ParseLoadavg([]byte("1.0 x 2.0 1/2 3")); err == nil {
		t.Error("bad loadavg: no error")
	}
}

func TestParseDecimalAgreesWithStrconv(t *testing.T) {
	for _, s := range []string{"0", "0.00", "1.5", "37.52", "100.00", "12345678.123456789012", "7.", ".5", "", "1.2.3", "1e3", "-1"} {
		got, ok := parseDecimal([]byte(s))
		want, err := strconv.ParseFloat(s, 64)
		wantOK := err == nil && !strings.ContainsAny(s, "eE-+") && !strings.HasPrefix(s, ".") && !strings.HasSuffix(s, ".")
		if ok != wantOK {
			t.Errorf("parseDecimal(%q) ok = %v, want %v", s, ok, wantOK)
			continue
		}
		if ok && math.Abs(got-want) > 1e-9*math.Max(1, want) {
			t.Errorf("parseDecimal(%q) = %v, want %v", s, got, want)
		}
	}
}

// FuzzParsers feeds the same bytes to every parser: none may panic, and what they accept must
// be sane.
func FuzzParsers(f *testing.F) {
	for _, name := range []string{"meminfo/kernel6.txt", "meminfo/old-kernel.txt", "psi/busy.txt", "psi/some-only.txt",
		"memstat/v1.txt", "memstat/v2.txt", "proc/loadavg"} {
		f.Add(fixture(f, name))
	}
	f.Add([]byte("max\n"))
	f.Add([]byte("MemTotal: 18446744073709551615 kB\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if m, err := ParseMeminfo(data); err == nil {
			if m.Total == 0 || m.Available > m.Total {
				t.Errorf("meminfo accepted with total %d avail %d", m.Total, m.Available)
			}
			if u := m.UsedFraction(); !(u >= 0 && u <= 1) {
				t.Errorf("used fraction %v", u)
			}
		}
		if p, err := ParsePSI(data); err == nil {
			for _, v := range []float64{p.SomeAvg10, p.SomeAvg60, p.SomeAvg300, p.FullAvg10, p.FullAvg60, p.FullAvg300} {
				if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
					t.Errorf("psi value %v", v)
				}
			}
		}
		for _, mode := range []Mode{ModeV1, ModeV2} {
			if s, err := ParseMemoryStat(data, mode); err == nil && s.HierarchicalLimit >= unlimited {
				t.Errorf("hierarchical limit %d not treated as unlimited", s.HierarchicalLimit)
			}
		}
		if l, err := ParseLimit(data); err == nil && l >= unlimited {
			t.Errorf("limit %d not treated as unlimited", l)
		}
		_, _ = ParseUsage(data)
		if l, err := ParseLoadavg(data); err == nil && (l.Load1 < 0 || math.IsNaN(l.Load1)) {
			t.Errorf("load %v", l.Load1)
		}
		if v, ok := parseDecimal(data); ok {
			want, err := strconv.ParseFloat(string(data), 64)
			if err == nil && math.Abs(v-want) > 1e-6*math.Max(1, want) {
				t.Errorf("parseDecimal(%q) = %v, strconv says %v", data, v, want)
			}
		}
	})
}
