package cluster

import (
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
)

// File sinks are confined: a mirrored job's file:// output must lie below SINKDIR/<tenant>/,
// where SINKDIR is the directory the operator gave the masters and agents (--sink-dir).
// Without one, file sinks are off. The master checks the rule at submit and update
// (CheckSinkDir); the router checks it again where it opens the file, without following
// symlinks (multidc.OpenFileSink), since a path that is clean in the spec may not be on disk.

// ErrNoSinkDir is CheckSinkDir's refusal of a file sink on a cluster without a sink dir.
const errNoSinkDir = "file sinks are off on this cluster: the operator sets --sink-dir"

// TenantSinkDir is where tenant's file sinks live: SINKDIR/<tenant>.
func TenantSinkDir(sinkDir, tenant string) string { return filepath.Join(sinkDir, tenant) }

// CheckSinkPath checks that path, a file sink's path, is clean, absolute and strictly below
// SINKDIR/<tenant>/. The error is one line that names the allowed prefix.
func CheckSinkPath(sinkDir, tenant, path string) error {
	if sinkDir == "" {
		return fmt.Errorf("%s", errNoSinkDir)
	}
	if err := CheckName(tenant); err != nil {
		return fmt.Errorf("file sink %q: tenant: %w", path, err)
	}
	prefix := TenantSinkDir(filepath.Clean(sinkDir), tenant) + "/"
	switch {
	case !filepath.IsAbs(path):
		return fmt.Errorf("file sink %q is not an absolute path: name a file below %s", path, prefix)
	case filepath.Clean(path) != path || strings.HasSuffix(path, "/"):
		return fmt.Errorf("file sink %q is not a clean path (no //, . or .. components, no trailing /): name a file below %s", path, prefix)
	case !strings.HasPrefix(path, prefix) || len(path) == len(prefix):
		return fmt.Errorf("file sink %q is outside this tenant's sink directory: name a file below %s", path, prefix)
	case strings.ContainsAny(path, "\x00\n"):
		return fmt.Errorf("file sink %q holds a NUL or newline: name a file below %s", path, prefix)
	}
	return nil
}

// CheckSinkDir checks a job's output against the cluster's sink dir: nothing to check for
// an http(s) sink or a job without output; a file sink must satisfy CheckSinkPath.
func (j *JobSpec) CheckSinkDir(sinkDir string) error {
	if j.Output == "" {
		return nil
	}
	u, err := url.Parse(j.Output)
	if err != nil || u.Scheme != "file" {
		return nil // Validate reports bad URLs; other schemes are not files
	}
	if sinkDir == "" {
		return fmt.Errorf("output: %s", errNoSinkDir)
	}
	if err := CheckSinkPath(sinkDir, j.Tenant, u.Path); err != nil {
		return fmt.Errorf("output: %w", err)
	}
	return nil
}
