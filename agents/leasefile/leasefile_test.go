package leasefile

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

const boot = "0123456789abcdef0123456789abcdef"

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range []Record{
		{Boot: boot, Gen: 1, Stamp: time.Hour},
		{Boot: boot, Gen: 1<<64 - 1, Stamp: 1<<63 - 1},
		{Boot: unknownBoot},
	} {
		b := r.Marshal()
		if len(b) != Size {
			t.Fatalf("%+v marshals to %d bytes, want %d", r, len(b), Size)
		}
		got, err := Parse(b)
		if err != nil || got != r {
			t.Fatalf("Parse(Marshal(%+v)) = %+v, %v", r, got, err)
		}
	}
	// A writer that cannot read its boot id writes the unknown one.
	if got, _ := Parse(Record{Boot: "", Gen: 3}.Marshal()); got.Boot != unknownBoot || got.Gen != 3 {
		t.Fatalf("record without a boot id parsed as %+v", got)
	}
}

func TestParseRefuses(t *testing.T) {
	good := Record{Boot: boot, Gen: 7, Stamp: 42 * time.Second}.Marshal()
	flip := bytes.Clone(good)
	flip[60] ^= 1 // a digit of the stamp
	for name, b := range map[string][]byte{
		"short":       good[:Size-1],
		"long":        append(bytes.Clone(good), ' '),
		"checksum":    flip,
		"no magic":    bytes.Replace(good, []byte(magic), []byte("sdlease2"), 1),
		"upper hex":   bytes.Replace(good, []byte("abcdef"), []byte("ABCDEF"), 1),
		"all spaces":  bytes.Repeat([]byte{' '}, Size),
		"half a new":  append(Record{Boot: boot, Gen: 8, Stamp: time.Minute}.Marshal()[:60], good[60:]...),
		"old content": []byte("hello\n"),
	} {
		if _, err := Parse(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: Parse = %v, want ErrCorrupt", name, err)
		}
	}
	if _, err := Parse(nil); !errors.Is(err, ErrEmpty) {
		t.Errorf("empty: Parse = %v, want ErrEmpty", err)
	}
}

// FuzzParse: Parse never panics, and whatever it accepts marshals back to the same bytes.
func FuzzParse(f *testing.F) {
	f.Add(Record{Boot: boot, Gen: 1, Stamp: time.Second}.Marshal())
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{'0'}, Size))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Parse(b)
		if err != nil {
			return
		}
		if !bytes.Equal(r.Marshal(), b) {
			t.Fatalf("Parse(%q) = %+v, which marshals to %q", b, r, r.Marshal())
		}
	})
}

func TestLapsed(t *testing.T) {
	const ttl = 2 * time.Second
	r := Record{Boot: boot, Gen: 1, Stamp: time.Hour}
	for _, c := range []struct {
		name string
		now  time.Duration
		boot string
		want bool
	}{
		{"fresh", time.Hour + time.Second, boot, false},
		{"at the ttl", time.Hour + ttl, boot, false},
		{"past the ttl", time.Hour + ttl + 1, boot, true},
		{"stamped ahead", time.Hour - time.Minute, boot, false},
		{"another boot", time.Hour, "fedcba9876543210fedcba9876543210", true},
		{"own boot unknown", time.Hour, "", false},
	} {
		if got := r.Lapsed(c.now, ttl, c.boot); got != c.want {
			t.Errorf("%s: Lapsed = %v, want %v", c.name, got, c.want)
		}
	}
	if (Record{Boot: unknownBoot, Stamp: time.Hour}).Lapsed(time.Hour, ttl, boot) {
		t.Error("a record of an unknown boot lapsed for its boot alone")
	}
}

// Renewals rewrite the record in place: readers never see a torn one (Read retries), and the
// file never grows.
func TestWriterRenewsInPlace(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lease")
	w, err := OpenWriter(p)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := Read(p); !errors.Is(err, ErrEmpty) {
		t.Fatalf("new lease: %v, want ErrEmpty", err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := time.Duration(1); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := w.Write(Record{Boot: boot, Gen: uint64(i), Stamp: i * time.Second}, time.Now()); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	reads := 0
	for reads < 2000 {
		r, err := Read(p)
		if errors.Is(err, ErrEmpty) {
			continue
		}
		if err != nil {
			t.Fatalf("read %d: %v", reads, err)
		}
		if r.Stamp != time.Duration(r.Gen)*time.Second {
			t.Fatalf("read a record mixing two writes: %+v", r)
		}
		reads++
	}
	close(stop)
	wg.Wait()
	if fi, err := os.Stat(p); err != nil || fi.Size() != Size {
		t.Fatalf("lease file %v, %v: want %d bytes", fi, err, Size)
	}
}

// Stamp reads an older keeper's lease, which has no record, by its modification time.
func TestStampOfALeaseWithoutRecord(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lease")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Minute)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	clock := func() time.Duration { return 10 * time.Hour }
	r, err := Stamp(p, clock)
	if err != nil {
		t.Fatal(err)
	}
	if age := clock() - r.Stamp; age < time.Minute || age > time.Minute+time.Hour || r.Gen != 0 {
		t.Fatalf("stamp %+v (age %s), want a minute old in generation 0", r, age)
	}
	w, err := OpenWriter(p)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// With a record the modification time no longer counts.
	if err := w.Write(Record{Boot: BootID(), Gen: 4, Stamp: 9 * time.Hour}, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if r, err := Stamp(p, clock); err != nil || r.Stamp != 9*time.Hour || r.Gen != 4 {
		t.Fatalf("stamp %+v, %v: want the record's", r, err)
	}
}

func TestNowIsTheBootClock(t *testing.T) {
	a := Now()
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	var up float64
	if _, err := fmt.Sscan(string(b), &up); err != nil {
		t.Fatal(err)
	}
	if d := time.Duration(up*float64(time.Second)) - a; d < -2*time.Second || d > 2*time.Second {
		t.Errorf("Now %s, /proc/uptime %.2fs: want the same clock", a, up)
	}
	if Now() < a {
		t.Error("the boot clock went back")
	}
}
