package provision

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stormdock/stormdock/coord"
)

func TestCheckStore(t *testing.T) {
	for _, tc := range []struct {
		url, wantErr string // "": accepted
	}{
		{"zk://zk1:2181,zk2:2181/prod", ""},
		{"zks://zk1:2281,zk2:2281/prod", ""},
		{"zk://zk1:2181", "must be zk://HOST:PORT/CHROOT"},
		{"zks://zk1:2281/", "must be zk://HOST:PORT/CHROOT"},
		{"mem://x", "must be zk://HOST:PORT/CHROOT"},
	} {
		err := CheckStore(tc.url)
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("CheckStore(%q) = %v; want %q", tc.url, err, tc.wantErr)
		}
	}
}

// The store's TLS files of a spec go with a zks:// store only, a certificate with its key.
func TestValidateStoreTLS(t *testing.T) {
	base := Spec{Name: "c", Image: "img"}.WithDefaults()
	for _, tc := range []struct {
		store   string
		files   coord.TLSFiles
		wantErr string
	}{
		{"zks://zk:2281/c", coord.TLSFiles{CA: "ca.pem", Cert: "c.pem", Key: "k.pem"}, ""},
		{"zks://zk:2281/c", coord.TLSFiles{}, ""}, // the provider asks for a CA (it may be kept)
		{"zk://zk:2181/c", coord.TLSFiles{CA: "ca.pem"}, "are for a zks:// store"},
		{"zks://zk:2281/c", coord.TLSFiles{CA: "ca.pem", Cert: "c.pem"}, "--store-cert and --store-key go together"},
	} {
		s := base
		s.Store, s.StoreTLS = tc.store, tc.files
		err := s.Validate()
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%s %+v: %v; want %q", tc.store, tc.files, err, tc.wantErr)
		}
	}
}

// KeepStoreTLS copies the files into the cluster's directory (the key 0400), keeps what an
// earlier call kept, and refuses a file it cannot read.
func TestKeepStoreTLS(t *testing.T) {
	src := t.TempDir()
	for f, body := range map[string]string{"ca.pem": "CA", "cert.pem": "CERT", "key.pem": "KEY"} {
		if err := os.WriteFile(filepath.Join(src, f), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tokens := Tokens{Dir: t.TempDir()}
	if f, err := tokens.StoreTLS("c"); err != nil || f != (coord.TLSFiles{}) {
		t.Fatalf("StoreTLS before any: %+v, %v", f, err)
	}
	got, err := tokens.KeepStoreTLS("c", coord.TLSFiles{CA: filepath.Join(src, "ca.pem"), Cert: filepath.Join(src, "cert.pem"), Key: filepath.Join(src, "key.pem")})
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := tokens.ClusterDir("c")
	for _, c := range []struct {
		path, want, body string
		mode             os.FileMode
	}{{got.CA, StoreCAFile, "CA", 0o444}, {got.Cert, StoreCertFile, "CERT", 0o444}, {got.Key, StoreKeyFile, "KEY", 0o400}} {
		fi, err := os.Stat(c.path)
		b, _ := os.ReadFile(c.path)
		if c.path != filepath.Join(dir, c.want) || err != nil || fi.Mode().Perm() != c.mode || string(b) != c.body {
			t.Errorf("kept %s: %v, %v, %q; want %s mode %v", c.path, err, fi.Mode().Perm(), b, c.want, c.mode)
		}
	}
	if again, err := tokens.KeepStoreTLS("c", coord.TLSFiles{}); err != nil || again != got {
		t.Errorf("keep nothing new: %+v, %v; want %+v", again, err, got)
	}
	if _, err := tokens.KeepStoreTLS("c", coord.TLSFiles{CA: filepath.Join(src, "missing.pem")}); err == nil || !strings.Contains(err.Error(), "missing.pem") {
		t.Errorf("keep a missing file: %v", err)
	}
}
