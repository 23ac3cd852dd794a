// Package keyring holds the masters' secrets keys: a file of AES-256 keys by id, the first
// of which seals new values (AES-GCM) while every one still opens what it sealed.
package keyring

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stormdock/stormdock/internal/atomicfile"
)

// The file: one key a line, "ID BASE64" (32 bytes of key), '#' starts a comment. The first
// key seals; the others only open, so that a key can be rotated without a moment where some
// value cannot be read: add a new first key on every master, re-seal (`stormdock secret
// rewrap`), then drop the old line.

// KeySize is the size of a key: AES-256.
const KeySize = 32

// ErrUnknownKey: a value was sealed with a key id the keyring does not hold.
var ErrUnknownKey = errors.New("unknown key id")

// ErrOpen: a sealed value does not open with its key (another key under its id, or the value
// or what it is bound to changed).
var ErrOpen = errors.New("sealed value does not open")

// Keyring is a parsed keyring; its zero value holds no key.
type Keyring struct {
	keys []key // keys[0] seals
}

type key struct {
	id   string
	aead cipher.AEAD
}

// checkIDRule says what a key id is, for messages.
const checkIDRule = "1-32 lower-case letters, digits or '-'"

func validID(id string) bool {
	if len(id) == 0 || len(id) > 32 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// Parse reads a keyring file's contents; what names the file in errors, which never show a
// key.
func Parse(data []byte, what string) (*Keyring, error) {
	k := &Keyring{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("%s line %d: want \"ID BASE64-KEY\"", what, n)
		}
		if !validID(f[0]) {
			return nil, fmt.Errorf("%s line %d: key id %q must be %s", what, n, clip(f[0]), checkIDRule)
		}
		raw, err := base64.StdEncoding.DecodeString(f[1])
		if err != nil || len(raw) != KeySize {
			return nil, fmt.Errorf("%s line %d: key %s is not %d bytes in base64", what, n, f[0], KeySize)
		}
		for _, o := range k.keys {
			if o.id == f[0] {
				return nil, fmt.Errorf("%s line %d: key id %s is given twice", what, n, f[0])
			}
		}
		aead, err := newAEAD(raw)
		if err != nil {
			return nil, err
		}
		k.keys = append(k.keys, key{id: f[0], aead: aead})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if len(k.keys) == 0 {
		return nil, fmt.Errorf("%s holds no key: make one with `stormdock secret keygen FILE`", what)
	}
	return k, nil
}

func newAEAD(raw []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(raw)
	if err != nil {
		return nil, fmt.Errorf("keyring: %w", err)
	}
	return cipher.NewGCM(b)
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// Load reads the keyring at path. The file must not be readable by anyone but its owner:
// whoever reads it reads every secret of the cluster.
func Load(path string) (*Keyring, error) {
	data, _, err := read(path)
	if err != nil {
		return nil, err
	}
	return Parse(data, path)
}

// read reads the file at path after checking its mode, and returns a stamp of what was
// read (its inode, size, modification time and mode).
func read(path string) ([]byte, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, "", fmt.Errorf("secrets key: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, "", fmt.Errorf("secrets key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, "", fmt.Errorf("secrets key %s is open to others (mode %04o): chmod 600 %s", path, fi.Mode().Perm(), path)
	}
	if !fi.Mode().IsRegular() {
		return nil, "", fmt.Errorf("secrets key %s is not a regular file", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("secrets key: %w", err)
	}
	return data, stampOf(fi), nil
}

func stampOf(fi os.FileInfo) string {
	var ino uint64
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		ino = st.Ino
	}
	return fmt.Sprintf("%d/%d/%d/%o", ino, fi.Size(), fi.ModTime().UnixNano(), fi.Mode())
}

// Active is the id of the key that seals.
func (k *Keyring) Active() string { return k.keys[0].id }

// IDs lists the key ids, the sealing one first.
func (k *Keyring) IDs() []string {
	out := make([]string, len(k.keys))
	for i, x := range k.keys {
		out[i] = x.id
	}
	return out
}

func (k *Keyring) find(id string) (key, bool) {
	for _, x := range k.keys {
		if x.id == id {
			return x, true
		}
	}
	return key{}, false
}

// Seal seals plaintext with the active key, bound to aad (what the value is: the caller's
// tenant, name and version), and returns the key id with the sealed bytes (nonce, then
// ciphertext and tag).
func (k *Keyring) Seal(plaintext, aad []byte) (string, []byte, error) {
	x := k.keys[0]
	nonce := make([]byte, x.aead.NonceSize(), x.aead.NonceSize()+len(plaintext)+x.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", nil, fmt.Errorf("keyring: %w", err)
	}
	return x.id, x.aead.Seal(nonce, nonce, plaintext, aad), nil
}

// Open opens what Seal sealed with key id, bound to aad.
func (k *Keyring) Open(id string, sealed, aad []byte) ([]byte, error) {
	x, ok := k.find(id)
	if !ok {
		return nil, fmt.Errorf("%w %s: the masters' keyring (--secrets-key) lacks it: give every master the same keyring file", ErrUnknownKey, id)
	}
	ns := x.aead.NonceSize()
	if len(sealed) < ns+x.aead.Overhead() {
		return nil, fmt.Errorf("%w: too short", ErrOpen)
	}
	out, err := x.aead.Open(nil, sealed[:ns], sealed[ns:], aad)
	if err != nil {
		return nil, fmt.Errorf("%w with key %s: another key under that id, or a value changed in the store", ErrOpen, id)
	}
	return out, nil
}

// checkText is what a check value seals.
const checkText = "stormdock keyring check"

func checkAAD(id string) []byte { return []byte("stormdock-keyring-check\x00" + id) }

// Check is the check value of key id: a known text sealed with it, which another key
// under the same id does not open. It returns nil for an id the keyring lacks.
func (k *Keyring) Check(id string) []byte {
	x, ok := k.find(id)
	if !ok {
		return nil
	}
	nonce := make([]byte, x.aead.NonceSize())
	_, _ = rand.Read(nonce)
	return x.aead.Seal(nonce, nonce, []byte(checkText), checkAAD(id))
}

// Verify reports whether check, made by Check on some master, opens with this keyring's
// key id: the two masters hold the same key under it.
func (k *Keyring) Verify(id string, check []byte) error {
	got, err := k.Open(id, check, checkAAD(id))
	if err != nil || string(got) != checkText {
		return fmt.Errorf("key %s of this keyring is not the key other masters hold under that id: give every master the same keyring file", id)
	}
	return nil
}

// File is a keyring file that is read again when it changes, so that an operator rotates
// keys without restarting masters.
type File struct {
	path string

	mu    sync.Mutex
	ring  *Keyring
	stamp string
	seen  time.Time
}

// recheck bounds how often File.Ring looks at the file.
const recheck = time.Second

// Open reads the keyring file at path.
func Open(path string) (*File, error) {
	f := &File{path: path}
	if _, err := f.Ring(); err != nil {
		return nil, err
	}
	return f, nil
}

// Path is the keyring's file.
func (f *File) Path() string { return f.path }

// Ring returns the keyring as the file holds it now: read again when its inode, size,
// modification time or mode changed, at most once a second. A file that became unreadable or
// invalid keeps the last good keyring and returns the error with it.
func (f *File) Ring() (*Keyring, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ring != nil && time.Since(f.seen) < recheck {
		return f.ring, nil
	}
	f.seen = time.Now()
	fi, err := os.Stat(f.path)
	if err == nil && f.ring != nil && stampOf(fi) == f.stamp {
		return f.ring, nil
	}
	data, stamp, err := read(f.path)
	if err == nil {
		var k *Keyring
		if k, err = Parse(data, f.path); err == nil {
			f.ring, f.stamp = k, stamp
			return k, nil
		}
	}
	if f.ring == nil {
		return nil, err
	}
	return f.ring, err
}

// NewID makes a key id from the time and 4 random bytes.
func NewID(now time.Time) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "k" + now.UTC().Format("20060102") + "-" + hex.EncodeToString(b)
}

// Generate adds a new key at the head of the keyring file at path, making the file (mode
// 0600) when there is none: the new key seals from now on, the others still open. It
// returns the new key's id.
func Generate(path string) (string, error) {
	var old []byte
	if data, _, err := read(path); err == nil {
		if _, err := Parse(data, path); err != nil {
			return "", err
		}
		old = data
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	raw := make([]byte, KeySize)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("keyring: %w", err)
	}
	id := NewID(time.Now())
	var b bytes.Buffer
	if old == nil {
		b.WriteString("# stormdock secrets keyring: the first key seals new values, every key opens what it sealed.\n")
		b.WriteString("# Every master needs the same file (docs/security.md, \"Secrets\"). Keep it mode 0600.\n")
	}
	fmt.Fprintf(&b, "%s %s\n", id, base64.StdEncoding.EncodeToString(raw))
	if old != nil {
		// Comments first, as they were; then the new key; then the old keys.
		var head, rest bytes.Buffer
		sc := bufio.NewScanner(bytes.NewReader(old))
		inHead := true
		for sc.Scan() {
			line := sc.Text()
			if inHead && (strings.HasPrefix(strings.TrimSpace(line), "#") || strings.TrimSpace(line) == "") {
				head.WriteString(line + "\n")
				continue
			}
			inHead = false
			rest.WriteString(line + "\n")
		}
		b = *bytes.NewBuffer(append(append(head.Bytes(), b.Bytes()...), rest.Bytes()...))
	}
	f, err := atomicfile.Create(path, 0o600)
	if err != nil {
		return "", fmt.Errorf("secrets key: %w", err)
	}
	defer f.Cleanup()
	if _, err := f.Write(b.Bytes()); err != nil {
		return "", fmt.Errorf("secrets key: %w", err)
	}
	if err := f.Commit(); err != nil {
		return "", fmt.Errorf("secrets key: %w", err)
	}
	return id, nil
}

// Ensure makes the keyring file at path with one key when there is none (`up` does, in its
// data directory), and returns it opened.
func Ensure(path string) (*File, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if _, err := Generate(path); err != nil {
			return nil, err
		}
	}
	return Open(path)
}
