package keyring

import (
	"bytes"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func rawKey(b byte) string {
	return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, KeySize))
}

// TestParse: the file's form, refused one way or another with a line that names the line
// and never shows a key.
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, text, err string
		ids             []string
	}{
		{"one", "k1 " + rawKey(1) + "\n", "", []string{"k1"}},
		{"comments and blanks", "# a comment\n\n k2 " + rawKey(2) + " \n# more\nk1 " + rawKey(1) + "\n", "", []string{"k2", "k1"}},
		{"empty", "# nothing\n", "holds no key", nil},
		{"one field", "k1\n", "line 1: want", nil},
		{"bad id", "K_1 " + rawKey(1) + "\n", "key id \"K_1\" must be", nil},
		{"short key", "k1 " + base64.StdEncoding.EncodeToString([]byte("short")) + "\n", "not 32 bytes", nil},
		{"not base64", "k1 !!!!\n", "not 32 bytes", nil},
		{"twice", "k1 " + rawKey(1) + "\nk1 " + rawKey(2) + "\n", "line 2: key id k1 is given twice", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, err := Parse([]byte(tc.text), "FILE")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				if strings.Contains(err.Error(), rawKey(1)) || strings.Contains(err.Error(), rawKey(2)) || strings.Contains(err.Error(), "\n") {
					t.Errorf("error shows a key or spans lines: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(k.IDs(), ","); got != strings.Join(tc.ids, ",") || k.Active() != tc.ids[0] {
				t.Errorf("ids %s active %s, want %v", got, k.Active(), tc.ids)
			}
		})
	}
}

// TestSealOpen: what is sealed opens with its key and what it is bound to, and with nothing
// else: another binding, another key under the same id, a flipped byte, an unknown id.
func TestSealOpen(t *testing.T) {
	k, _ := Parse([]byte("k1 "+rawKey(1)+"\n"), "a")
	other, _ := Parse([]byte("k1 "+rawKey(9)+"\n"), "b")
	id, sealed, err := k.Seal([]byte("hunter2"), []byte("acme/db/1"))
	if err != nil || id != "k1" {
		t.Fatal(id, err)
	}
	if bytes.Contains(sealed, []byte("hunter2")) {
		t.Fatal("the sealed bytes hold the value")
	}
	if v, err := k.Open(id, sealed, []byte("acme/db/1")); err != nil || string(v) != "hunter2" {
		t.Fatalf("open: %q %v", v, err)
	}
	_, again, _ := k.Seal([]byte("hunter2"), []byte("acme/db/1"))
	if bytes.Equal(sealed, again) {
		t.Error("two seals of one value are equal: the nonce is not fresh")
	}
	flipped := bytes.Clone(sealed)
	flipped[len(flipped)-1] ^= 1
	for name, open := range map[string]func() ([]byte, error){
		"other binding":  func() ([]byte, error) { return k.Open(id, sealed, []byte("other/db/1")) },
		"other key":      func() ([]byte, error) { return other.Open(id, sealed, []byte("acme/db/1")) },
		"flipped":        func() ([]byte, error) { return k.Open(id, flipped, []byte("acme/db/1")) },
		"short":          func() ([]byte, error) { return k.Open(id, sealed[:5], []byte("acme/db/1")) },
		"unknown key id": func() ([]byte, error) { return k.Open("k2", sealed, []byte("acme/db/1")) },
	} {
		v, err := open()
		if err == nil || v != nil {
			t.Errorf("%s: opened %q", name, v)
		}
		want := ErrOpen
		if name == "unknown key id" {
			want = ErrUnknownKey
		}
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
	}
	// Checks tell the same key from another under one id.
	if err := k.Verify("k1", k.Check("k1")); err != nil {
		t.Error(err)
	}
	if err := other.Verify("k1", k.Check("k1")); err == nil {
		t.Error("another key under k1 passes the check")
	}
}

// TestGenerateRotates: keygen makes a 0600 file, then puts each new key first, keeping the
// old ones: what an old key sealed still opens. A file open to others is refused.
func TestGenerateRotates(t *testing.T) {
	p := filepath.Join(t.TempDir(), "secrets.key")
	id1, err := Generate(p)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("keyring mode %v %v, want 0600", fi.Mode(), err)
	}
	k1, err := Load(p)
	if err != nil || k1.Active() != id1 {
		t.Fatal(k1, err)
	}
	_, sealed, _ := k1.Seal([]byte("v1"), nil)
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	id2, err := Generate(p)
	if err != nil || id2 == id1 {
		t.Fatal(id2, err)
	}
	k2, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := k2.IDs(); len(got) != 2 || got[0] != id2 || got[1] != id1 {
		t.Fatalf("ids after rotation %v, want [%s %s]", got, id2, id1)
	}
	if v, err := k2.Open(id1, sealed, nil); err != nil || string(v) != "v1" {
		t.Errorf("the old key's value after rotation: %q %v", v, err)
	}
	// An open File sees the new key once it looks again.
	f.seen = time.Time{}
	if r, err := f.Ring(); err != nil || r.Active() != id2 {
		t.Errorf("reloaded ring: %v %v, want active %s", r, err, id2)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a keyring open to others: %v", err)
	}
	// The File keeps its last good ring and says what is wrong.
	f.seen = time.Time{}
	if r, err := f.Ring(); r == nil || err == nil {
		t.Errorf("after the file went bad: %v %v; want the last ring and an error", r, err)
	}
}

// FuzzParse: no input makes Parse panic, and a keyring it accepts holds valid ids, the
// first of which is active.
func FuzzParse(f *testing.F) {
	f.Add([]byte("k1 " + rawKey(1) + "\n"))
	f.Add([]byte("# c\nk2 " + rawKey(2) + "\nk1 " + rawKey(1)))
	f.Add([]byte("k1 " + rawKey(1) + "\nk1 " + rawKey(1)))
	f.Add([]byte("\x00\xff"))
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := Parse(data, "fuzz")
		if err != nil {
			return
		}
		ids := k.IDs()
		if len(ids) == 0 || k.Active() != ids[0] {
			t.Fatalf("ids %v active %s", ids, k.Active())
		}
		for _, id := range ids {
			if !validID(id) {
				t.Fatalf("accepted id %q", id)
			}
		}
	})
}
