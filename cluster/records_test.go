package cluster

import (
	"errors"
	"path"
	"regexp"
	"strings"
	"testing"
)

// TestKeyBuildersRefuseEscapes: a name that would leave its directory (or that is not a name
// at all) never becomes a key.
func TestKeyBuildersRefuseEscapes(t *testing.T) {
	builders := map[string]func(string) (string, error){
		"job": JobKey, "tenant": TenantKey, "node": NodeKey, "assignment": AssignmentKey,
		"nodeconf": NodeConfKey, "dc": DCKey, "router": RouterKey, "election": RouterElectionKey, "history": JobHistoryKey,
	}
	bad := []string{"", ".", "..", "../tenants/demo", "..%2Ftenants", "a/b", "A", "a_b", "-a", "a-",
		"a.router", " a", "a\n", "a\x00", "é", strings.Repeat("a", 64), "%2e%2e"}
	for what, build := range builders {
		for _, name := range bad {
			if k, err := build(name); !errors.Is(err, ErrInvalidName) {
				t.Errorf("%s key of %q = %q, %v; want ErrInvalidName", what, name, k, err)
			}
		}
		for _, name := range []string{"a", "wordcount", "dc-a", "n1", strings.Repeat("a", 63)} {
			if _, err := build(name); err != nil {
				t.Errorf("%s key of %q: %v", what, name, err)
			}
		}
	}
}

// FuzzJobKey: whatever the name, a key that is made is a direct child of /jobs and clean.
func FuzzJobKey(f *testing.F) {
	for _, s := range []string{"wordcount", "..", "../tenants/demo", "a/b", "%2e%2e%2f", "a\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		k, err := JobKey(name)
		if err != nil {
			if !errors.Is(err, ErrInvalidName) || strings.ContainsAny(err.Error(), "\n\x00") {
				t.Fatalf("JobKey(%q): %v", name, err)
			}
			return
		}
		if path.Clean(k) != k || path.Dir(k) != JobsKey || path.Base(k) != name {
			t.Fatalf("JobKey(%q) = %q escapes %s", name, k, JobsKey)
		}
	})
}

// FuzzCheckName: the hand-written name check accepts exactly the DNS labels of its rule.
func FuzzCheckName(f *testing.F) {
	re := regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	for _, s := range []string{"", "a", "wordcount", "dc-a", "-a", "a-", "A", "a.b", strings.Repeat("a", 63), strings.Repeat("a", 64), "a\x00", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := CheckName(s) == nil, re.MatchString(s); got != want {
			t.Fatalf("CheckName(%q) accepts: %v, the rule: %v", s, got, want)
		}
	})
}

// TestSecretNamesAndKeys: a secret name is a file name that stays in its directory and a
// store key that stays below its tenant's; nothing else passes.
func TestSecretNamesAndKeys(t *testing.T) {
	for _, name := range []string{"", ".", "..", ".env", "a/b", "../x", "-a", "_a", "a b", "a\x00", "a\n", "é", strings.Repeat("a", 64)} {
		if err := CheckSecretName(name); !errors.Is(err, ErrInvalidName) {
			t.Errorf("secret name %q: %v, want ErrInvalidName", name, err)
		}
		if k, err := SecretKey("acme", name); err == nil {
			t.Errorf("secret key of %q = %q", name, k)
		}
	}
	for _, name := range []string{"db", "DB_PASSWORD", "api-key", "tls.crt", "a", strings.Repeat("a", 63)} {
		k, err := SecretKey("acme", name)
		if err != nil || path.Dir(k) != SecretsKey+"/acme" || path.Base(k) != name {
			t.Errorf("secret key of %q = %q, %v", name, k, err)
		}
	}
	if _, err := SecretKey("../x", "db"); !errors.Is(err, ErrInvalidName) {
		t.Errorf("a secret key of tenant ../x: %v", err)
	}
}
