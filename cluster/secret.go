package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Tenant secrets: values a tenant's workers (and its mirrored jobs' output routers) read as
// files, never in a job record, an assignment, an event, a log, an environment variable or
// a command line. The store holds them sealed (AES-GCM) under a key only the masters hold
// (package internal/keyring); agents fetch a worker's from the leading master when they
// start it (api/nodeauth.go).

// SecretsKey holds one SecretIndex per tenant (/secrets/<tenant>), the metadata of its
// secrets, and below it each secret's sealed value (/secrets/<tenant>/<name>: SealedSecret).
// The masters mirror the indexes (versions reach running workers through their
// assignments); nothing but a master reads the values.
const SecretsKey = "/secrets"

// SecretsKeyringKey holds the check values of the masters' keyring (KeyringChecks): every
// master compares its --secrets-key file with them at start, so that two masters never seal
// under one key id with different keys.
const SecretsKeyringKey = "/master/secrets-keyring"

// Limits on secrets.
const (
	// MaxSecretBytes bounds one secret's value: a password, a key, a certificate bundle.
	MaxSecretBytes = 64 << 10
	// MaxTenantSecrets bounds a tenant's secrets, so that its index stays small (every
	// master mirrors it).
	MaxTenantSecrets = 256
	// MaxJobSecrets bounds the secrets one job names.
	MaxJobSecrets = 32
)

// SecretNameRule says what a secret name is, for messages.
const SecretNameRule = "1-63 letters, digits, '_', '-' or '.', starting with a letter or digit"

// CheckSecretName reports whether s can name a secret: it becomes a file name in the
// worker's secrets directory and a store key, so nothing that could climb out of either
// (no '/', no "..", no leading '.').
func CheckSecretName(s string) error {
	ok := len(s) > 0 && len(s) <= 63
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			i > 0 && (c == '_' || c == '-' || c == '.')
	}
	if !ok {
		return secretNameError{s}
	}
	return nil
}

// secretNameError says which secret name was refused and what one is; it is ErrInvalidName.
type secretNameError struct{ name string }

func (e secretNameError) Error() string {
	return "secret name " + quoteName(e.name) + " must be " + SecretNameRule
}
func (e secretNameError) Is(target error) bool { return target == ErrInvalidName }

// SecretIndexKey is the store key of a tenant's SecretIndex.
func SecretIndexKey(tenant string) (string, error) {
	return nameKey(SecretsKey, "tenant", tenant)
}

// SecretKey is the store key of one of a tenant's sealed secrets.
func SecretKey(tenant, name string) (string, error) {
	k, err := SecretIndexKey(tenant)
	if err != nil {
		return "", err
	}
	if err := CheckSecretName(name); err != nil {
		return "", err
	}
	return k + "/" + name, nil
}

// SecretMeta is what may be known of a secret without its value.
type SecretMeta struct {
	// Version grows by one with every new value: workers get the new one live.
	Version int64     `json:"version"`
	Size    int       `json:"size"`
	Created time.Time `json:"created"`
	Updated time.Time `json:"updated"`
	// UpdatedBy is the API principal that set the value last (admin, tenant/NAME).
	UpdatedBy string `json:"updatedBy,omitempty"`
}

// SecretIndex is a tenant's secrets by name, without values.
type SecretIndex struct {
	Secrets map[string]SecretMeta `json:"secrets"`
}

// SealedSecret is a secret's value as the store keeps it: sealed with the masters' key Key
// (a key id of their keyring), bound to the tenant, the name and Version.
type SealedSecret struct {
	Version int64  `json:"version"`
	Key     string `json:"key"`
	Sealed  []byte `json:"sealed"`
}

// KeyringChecks holds, for each key id the masters sealed with, a check value: a known
// text sealed with the key, which a master holding another key under that id cannot open.
type KeyringChecks struct {
	Checks map[string][]byte `json:"checks"`
}

// SecretRef is a secret a worker gets: its name and the version the master saw last. A new
// version reaches a running worker live (its file rewritten, then SIGHUP).
type SecretRef struct {
	Name    string `json:"name"`
	Version int64  `json:"version"`
}

// validateSecrets checks the secret names a job spec gives: their form, duplicates and
// count; whether the tenant has them is the master's to check at submit.
func (j *JobSpec) validateSecrets(ps *problems) {
	if len(j.Secrets) > MaxJobSecrets {
		ps.add("secrets", "names %d secrets, over the %d allowed", len(j.Secrets), MaxJobSecrets)
	}
	for i, s := range j.Secrets {
		path := fmt.Sprintf("secrets[%d]", i)
		if err := CheckSecretName(s); err != nil {
			ps.add(path, "%v", err)
		} else if slices.Index(j.Secrets, s) != i {
			ps.add(path, "%q is listed twice", s)
		}
	}
	if j.OutputSecret == "" {
		return
	}
	switch err := CheckSecretName(j.OutputSecret); {
	case err != nil:
		ps.add("outputSecret", "%v", err)
	case !j.Mirrored():
		ps.add("outputSecret", "goes with a mirrored job's output (links and output): it is given to the job's output routers")
	default:
		// Only the refusal: an output that does not parse is checkOutput's to report.
		if err := CheckOutputSecretTransport(j.Output); errors.Is(err, ErrSecretInClear) {
			ps.add("output", "%v", err)
		}
	}
}

// SealedRegistryAuth is a tenant's registry credentials as the store keeps them with the
// masters' keyring: the hosts in clear (what `tenant list` shows), the credentials (Docker's
// config.json) sealed like a secret's value. Without a keyring the store keeps the
// config.json itself.
type SealedRegistryAuth struct {
	Hosts  []string `json:"hosts"`
	Key    string   `json:"key"`
	Sealed []byte   `json:"sealed"`
}

// ParseSealedRegistryAuth reports whether a stored value of a tenant's registry credentials
// is sealed (rather than Docker's config.json), and returns it.
func ParseSealedRegistryAuth(val []byte) (SealedRegistryAuth, bool) {
	var sa SealedRegistryAuth
	if json.Unmarshal(val, &sa) != nil || len(sa.Sealed) == 0 || sa.Key == "" {
		return sa, false
	}
	return sa, true
}
