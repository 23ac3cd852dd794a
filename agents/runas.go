package agents

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/atomicfile"
	"github.com/stormdock/stormdock/isolation"
)

// Workers may run as another user than the agent (Config.RunAs): process workers through
// the process driver, docker workers always (docker.User). What such a worker can reach of
// the agent's state directory is its own lease (to watch it and hold its shared lock) and
// its own sender token; the directories on the way are traversable but not listable, and
// every other file in them (node and keeper records, worker records, the store's
// credentials, logs) is the agent's alone.

// tokenFile is the name of a link worker's sender token in its lease directory.
const tokenFile = "output.token"

// EnvStoreCredentialsFile names, in the environment of stormdock's own workers (output
// routers), the file with the store's credentials.
const EnvStoreCredentialsFile = "STORMDOCK_STORE_CREDENTIALS_FILE"

// The store's TLS files (coord.TLSFiles), in the environment of stormdock's own workers.
const (
	EnvStoreCA   = "STORMDOCK_STORE_CA"
	EnvStoreCert = "STORMDOCK_STORE_CERT"
	EnvStoreKey  = "STORMDOCK_STORE_KEY"
)

// dockerUID is the user docker workers run as (docker.User).
const dockerUID = 65534

// userOf is who a worker runs as: the run-as user for tenants' process workers, the agent's
// own user for stormdock's own workers.
func (a *Agent) userOf(wa cluster.WorkerAssignment, mode string) *isolation.User {
	if mode != cluster.IsolationProcess || wa.System || a.cfg.RunAs == nil {
		return nil
	}
	u := *a.cfg.RunAs
	return &u
}

// prepareStateDir opens the path to the leases to the workers' user and closes everything
// else, and checks that the user can reach the leases from /.
func (a *Agent) prepareStateDir() error {
	if a.cfg.RunAs == nil {
		return nil
	}
	for dir, mode := range map[string]os.FileMode{a.cfg.StateDir: 0o711, a.leasesDir(): 0o711, a.workersDir(): 0o700} {
		if err := os.Chmod(dir, mode); err != nil {
			return fmt.Errorf("agent: state dir: %w", err)
		}
	}
	return reachable(a.leasesDir(), *a.cfg.RunAs)
}

// MayRun reports whether user u may run the program at path: enter every directory down to
// it, and execute it.
func MayRun(path string, u isolation.User) bool {
	fi, err := os.Stat(path)
	if err != nil || reachable(filepath.Dir(path), u) != nil {
		return false
	}
	return fi.Mode().Perm()&permFor(fi, u, 0o1) != 0
}

// permFor is the permission bit (0o1 execute, 0o2 write, 0o4 read) that applies to user u
// for a file, by its owner and group.
func permFor(fi os.FileInfo, u isolation.User, bit os.FileMode) os.FileMode {
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !ok:
		return bit
	case st.Uid == u.UID:
		return bit << 6
	case st.Gid == u.GID || slices.Contains(u.Groups, st.Gid):
		return bit << 3
	}
	return bit
}

// reachable checks that user u may enter every directory from / down to dir.
func reachable(dir string, u isolation.User) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		perm := fi.Mode().Perm()
		var x os.FileMode = 0o001
		switch {
		case st.Uid == u.UID:
			x = 0o100
		case st.Gid == u.GID:
			x = 0o010
		}
		if perm&x == 0 {
			return fmt.Errorf("agent: workers run as %s but cannot enter %s (mode %v, owner %d:%d), on the way to their leases in %s: "+
				"make it traversable (chmod o+x %s), choose a --state-dir they can reach, or give --run-as another user",
				u, d, perm, st.Uid, st.Gid, dir, d)
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}

// writeOutputToken gives a link worker its sender token, in its lease directory, readable
// by the worker's user alone. It returns the path the worker sees ("" without a token).
func (a *Agent) writeOutputToken(id string, wa cluster.WorkerAssignment, mode string) (string, error) {
	if wa.OutputToken == "" {
		return "", nil
	}
	dir := filepath.Dir(a.leaseFile(id))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("sender token of %s: %w", id, err)
	}
	f, err := atomicfile.Create(filepath.Join(dir, tokenFile), 0o400)
	if err != nil {
		return "", fmt.Errorf("sender token of %s: %w", id, err)
	}
	defer f.Cleanup()
	if _, err := f.Write([]byte(wa.OutputToken + "\n")); err != nil {
		return "", fmt.Errorf("sender token of %s: %w", id, err)
	}
	uid, gid := -1, -1
	if u := a.userOf(wa, mode); u != nil {
		uid, gid = int(u.UID), int(u.GID)
	} else if mode == cluster.IsolationDocker && os.Geteuid() == 0 {
		uid, gid = dockerUID, dockerUID
	}
	if uid >= 0 {
		if err := f.Chown(uid, gid); err != nil && !errors.Is(err, os.ErrPermission) {
			return "", fmt.Errorf("sender token of %s: %w", id, err)
		}
	}
	if err := f.Commit(); err != nil {
		return "", fmt.Errorf("sender token of %s: %w", id, err)
	}
	return a.tokenPath(id, mode), nil
}

// tokenPath is where a worker finds its sender token.
func (a *Agent) tokenPath(id, mode string) string {
	if mode == cluster.IsolationDocker {
		return filepath.Join(containerLeaseDir, tokenFile)
	}
	return filepath.Join(filepath.Dir(a.leaseFile(id)), tokenFile)
}

// prepareSinkDir makes the tenant's sink directory, SinkDir/<tenant> (mode 0750), before an
// output router starts, owned by the user the router runs as: the router opens its file
// below it, and makes nothing above it. A directory that is there is kept but must be a
// real directory (not a symlink), and is given the router's user and the mode again.
func (a *Agent) prepareSinkDir(wa cluster.WorkerAssignment, mode string) error {
	if !wa.System || a.cfg.SinkDir == "" {
		return nil
	}
	if err := cluster.CheckName(wa.Tenant); err != nil {
		return fmt.Errorf("sink dir of tenant %q: %w", wa.Tenant, err)
	}
	if err := os.MkdirAll(a.cfg.SinkDir, 0o755); err != nil {
		return fmt.Errorf("sink dir: %w", err)
	}
	dir := cluster.TenantSinkDir(a.cfg.SinkDir, wa.Tenant)
	if err := os.Mkdir(dir, 0o750); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("sink dir of tenant %s: %w", wa.Tenant, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("sink dir of tenant %s: %w", wa.Tenant, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("sink dir of tenant %s: %s is not a directory (a symlink?): remove it, the agent makes it", wa.Tenant, dir)
	}
	if u := a.userOf(wa, mode); u != nil {
		// Lchown: dir was just checked to be no symlink, and must not become one's target.
		if err := os.Lchown(dir, int(u.UID), int(u.GID)); err != nil {
			return fmt.Errorf("sink dir of tenant %s: %w", wa.Tenant, err)
		}
	}
	if err := os.Chmod(dir, 0o750); err != nil {
		return fmt.Errorf("sink dir of tenant %s: %w", wa.Tenant, err)
	}
	return nil
}
