package agents

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/atomicfile"
	"github.com/stormdock/stormdock/isolation"
)

// Who workers run as. Every worker of a tenant, process or docker, runs as its tenant's uid
// (cluster.WorkerAssignment.UID, gid the same, no supplementary groups, no new privileges,
// no capabilities); a mirrored job's output routers (System workers) as the tenant's router
// uid, the next one: they hold the store's credentials and the job's output key, which the
// tenant's own code must not read through /proc or ptrace, as it could as the same uid. No
// worker runs as root or as the agent's own uid, which can read everything the agent holds
// (/proc/<agent>/environ, the store's credentials, the signing keys it reads): such an
// assignment is refused at start. --run-as (Config.RunAs) is the single-tenant opt-out: every
// tenant's process workers then run as that one user.
//
// What a worker can reach of the agent's state directory is its own lease directory (its
// lease, to watch it and hold its shared lock; its live configuration; its sender token; a
// router's copy of the store's credentials), 0700 and its own: the directories on the way
// are traversable but not listable, and every other file in them (node and keeper records,
// worker records, the store's credentials, logs) is the agent's alone.

// tokenFile is the name of a link worker's sender token in its lease directory.
const tokenFile = "output.token"

// credentialsFile is the name of a router's copy of the store's credentials in its lease
// directory.
const credentialsFile = "store.credentials"

// EnvStoreCredentialsFile names, in the environment of stormdock's own workers (output
// routers), the file with the store's credentials: a copy of the agent's, the router's own.
const EnvStoreCredentialsFile = "STORMDOCK_STORE_CREDENTIALS_FILE"

// The store's TLS files (coord.TLSFiles), in the environment of stormdock's own workers.
const (
	EnvStoreCA   = "STORMDOCK_STORE_CA"
	EnvStoreCert = "STORMDOCK_STORE_CERT"
	EnvStoreKey  = "STORMDOCK_STORE_KEY"
)

// ErrNoSwitch marks a process worker that would have to run as another user than the
// agent, which the agent cannot switch to.
var ErrNoSwitch = errors.New("agent cannot switch users")

// self is what the agent may do about users: its effective uid, and whether it can switch
// to another (CAP_SETUID and CAP_SETGID in its effective set, as root has them).
type self struct {
	euid      int
	canSwitch bool
}

// currentSelf reads the agent's own uid and capabilities.
func currentSelf() self {
	euid := os.Geteuid()
	return self{euid: euid, canSwitch: canSwitch(euid, effectiveCaps())}
}

// canSwitch reports whether a process with effective uid euid and effective capabilities
// capEff may switch to any user: it needs both CAP_SETUID and CAP_SETGID (setgroups, to
// drop every supplementary group, needs CAP_SETGID too), which root has unless they were
// taken from it (a container started with --cap-drop).
func canSwitch(euid int, capEff uint64) bool {
	_ = euid // root without the capabilities cannot switch either
	const need = 1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID
	return capEff&need == need
}

// effectiveCaps is the calling thread's effective capability set (0 when it cannot be read).
func effectiveCaps() uint64 {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return 0
	}
	return uint64(data[1].Effective)<<32 | uint64(data[0].Effective)
}

// noSwitchHelp is what to do about an agent that cannot switch users.
const noSwitchHelp = "run the agent as root, or give it CAP_SETUID and CAP_SETGID (ambient, with CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER and CAP_KILL), or --run-as for a single-tenant node"

// workerUser is who a worker runs as (nil: as the agent, which only --run-as set to the
// agent's own user asks for), or why it must not run: the one-line error its state shows.
func workerUser(wa cluster.WorkerAssignment, mode string, runAs *isolation.User, me self) (*isolation.User, error) {
	if mode == cluster.IsolationProcess && !wa.System && runAs != nil {
		if int(runAs.UID) == me.euid {
			return nil, nil // the opt-out as the agent's own user: nothing to switch
		}
		if !me.canSwitch {
			return nil, fmt.Errorf("%w: it runs as uid %d and --run-as %s needs a switch: %s", ErrNoSwitch, me.euid, runAs, noSwitchHelp)
		}
		u := *runAs
		return &u, nil
	}
	what := "tenant " + wa.Tenant + "'s worker"
	if wa.System {
		what = "tenant " + wa.Tenant + "'s output router"
	}
	switch {
	case wa.UID == 0:
		return nil, fmt.Errorf("%s %s has no uid to run as (never root): upgrade the masters, which give every tenant one", what, wa.Key)
	case wa.UID < 0 || wa.UID > math.MaxInt32-1:
		return nil, fmt.Errorf("%s %s has uid %d, not a uid: the masters give uids from --tenant-uids", what, wa.Key, wa.UID)
	case wa.UID == me.euid:
		return nil, fmt.Errorf("%s %s would run as uid %d, the agent's own, which reads the store's credentials: run the agent as another user than the tenants' range (--tenant-uids)", what, wa.Key, wa.UID)
	}
	u := &isolation.User{UID: uint32(wa.UID), GID: uint32(wa.UID)}
	if mode == cluster.IsolationDocker || me.canSwitch {
		return u, nil // the docker engine switches users for the agent
	}
	if wa.System && runAs != nil && int(runAs.UID) == me.euid {
		// A single-tenant node whose agent cannot switch (--run-as as itself): its routers
		// run with its tenant's workers, as the agent.
		return nil, nil
	}
	return nil, fmt.Errorf("%w: it runs as uid %d without CAP_SETUID and CAP_SETGID, so it cannot run %s %s as uid %d: %s",
		ErrNoSwitch, me.euid, what, wa.Key, wa.UID, noSwitchHelp)
}

// userOf is who a worker runs as; nil: as the agent, or not at all (see workerUser).
func (a *Agent) userOf(wa cluster.WorkerAssignment, mode string) *isolation.User {
	u, err := workerUser(wa, mode, a.cfg.RunAs, a.me)
	if err != nil {
		return nil
	}
	return u
}

// others stands for every user but the agent's and root, for what the tenants' uids may
// reach: none of them owns the agent's directories or is in their group.
var others = isolation.User{UID: math.MaxInt32 - 1, GID: math.MaxInt32 - 1, Name: "the tenants' uids"}

// leasesRunDir is where a root agent whose state directory the tenants' uids cannot reach
// keeps its leases instead (see prepareStateDir): /run is root's, on every distribution.
const leasesRunDir = "/run/stormdock/leases"

// prepareStateDir opens the path to the leases to the workers' users and closes everything
// else, and checks that they can reach the leases from /. Where they cannot (a state
// directory below /root, or a test's temporary directory) and the agent is root, the leases
// go to a directory of their own below /run, which the state directory's "leases" links to:
// the keeper and the agent's next start find it there. Nothing else moves.
func (a *Agent) prepareStateDir() error {
	for dir, mode := range map[string]os.FileMode{a.cfg.StateDir: 0o711, a.workersDir(): 0o700} {
		if err := os.Chmod(dir, mode); err != nil {
			return fmt.Errorf("agent: state dir: %w", err)
		}
	}
	link := filepath.Join(a.cfg.StateDir, "leases")
	a.leases = link
	need := a.driver(cluster.IsolationProcess) != nil && (a.me.canSwitch ||
		a.cfg.RunAs != nil && int(a.cfg.RunAs.UID) != a.me.euid)
	fi, err := os.Lstat(link)
	switch {
	case err == nil && fi.Mode()&os.ModeSymlink != 0:
		target, err := os.Readlink(link)
		if err != nil || !filepath.IsAbs(target) || filepath.Dir(target) != leasesRunDir {
			return fmt.Errorf("agent: state dir: %s links to %q, not a lease directory this agent made below %s: remove the link", link, target, leasesRunDir)
		}
		if err := makeRunDir(target); err != nil {
			return err
		}
		a.leases = target
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("agent: state dir: %w", err)
	case !need || reachable(a.cfg.StateDir, others) == nil || a.me.euid != 0:
		if err := os.MkdirAll(link, 0o711); err != nil {
			return fmt.Errorf("agent: state dir: %w", err)
		}
		if err := os.Chmod(link, 0o711); err != nil {
			return fmt.Errorf("agent: state dir: %w", err)
		}
	default:
		// Root, and the tenants' uids cannot reach the state directory: move the leases
		// below /run, unless workers run under the ones there.
		if err == nil {
			if !leaseIdle(filepath.Join(link, nodeLeaseName)) {
				return fmt.Errorf("agent: the tenants' uids cannot reach %s, and workers of an earlier agent still run under its leases: stop them (or let their leases lapse), then start the agent again", link)
			}
			if err := os.RemoveAll(link); err != nil {
				return fmt.Errorf("agent: state dir: %w", err)
			}
		}
		sum := sha256.Sum256([]byte(a.cfg.StateDir))
		target := filepath.Join(leasesRunDir, hex.EncodeToString(sum[:12]))
		if err := makeRunDir(target); err != nil {
			return err
		}
		if err := os.Symlink(target, link); err != nil {
			return fmt.Errorf("agent: state dir: %w", err)
		}
		a.log.Info("the tenants' uids cannot reach the state directory: leases are kept below /run", "state_dir", a.cfg.StateDir, "leases", target)
		a.leases = target
	}
	if !need {
		return nil
	}
	return reachable(a.leases, others)
}

// makeRunDir makes dir below /run for the leases, each directory on the way root's, 0711.
func makeRunDir(dir string) error {
	// A minimal root file system (an initramfs) may have no /run at all.
	if err := os.MkdirAll(filepath.Dir(filepath.Dir(leasesRunDir)), 0o755); err != nil {
		return fmt.Errorf("agent: lease dir: %w", err)
	}
	for _, d := range []string{filepath.Dir(leasesRunDir), leasesRunDir, dir} {
		if err := os.Mkdir(d, 0o711); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("agent: lease dir: %w", err)
		}
		fi, err := os.Lstat(d)
		if err != nil {
			return fmt.Errorf("agent: lease dir: %w", err)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || !fi.IsDir() || st.Uid != 0 {
			return fmt.Errorf("agent: lease dir %s is not a directory of root's: remove it", d)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return fmt.Errorf("agent: lease dir: %w", err)
		}
	}
	return nil
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

// AnyUser stands for the tenants' uids in MayRun: any user but the file's owner and group.
var AnyUser = others

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
				"make it traversable (chmod o+x %s), or choose a --state-dir they can reach",
				u, d, perm, st.Uid, st.Gid, dir, d)
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}

// ownerOf is the uid and gid a worker's files get: its user's, or -1 (unchanged: the
// agent's) when it runs as the agent.
func ownerOf(u *isolation.User) (uid, gid int) {
	if u == nil {
		return -1, -1
	}
	return int(u.UID), int(u.GID)
}

// prepareLeaseDir makes a worker's lease directory its user's, 0700: the tenant's other
// workers on the node, other tenants' and routers cannot enter it.
func (a *Agent) prepareLeaseDir(id string, u *isolation.User) error {
	dir := filepath.Dir(a.leaseFile(id))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("lease dir of %s: %w", id, err)
	}
	// Lchown: never through a link planted in the agent's directory.
	uid, gid := ownerOf(u)
	if err := os.Lchown(dir, uid, gid); err != nil {
		return chownError("lease dir of "+id, uid, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("lease dir of %s: %w", id, err)
	}
	return nil
}

// writeOwned writes a file of a worker's lease directory atomically, mode perm, owned by
// the worker's user from the moment it appears.
func writeOwned(path string, b []byte, perm os.FileMode, u *isolation.User) error {
	f, err := atomicfile.Create(path, perm)
	if err != nil {
		return err
	}
	defer f.Cleanup()
	if _, err := f.Write(b); err != nil {
		return err
	}
	if uid, gid := ownerOf(u); uid >= 0 {
		if err := f.Chown(uid, gid); err != nil {
			return chownError(filepath.Base(path), uid, err)
		}
	}
	return f.Commit()
}

// chownError says what an agent that may not give a worker its files lacks: the worker
// could not read them, and nobody else may.
func chownError(what string, uid int, err error) error {
	if errors.Is(err, os.ErrPermission) {
		return fmt.Errorf("%s: the agent may not give it to uid %d (%w): run the agent as root, or give it CAP_CHOWN, CAP_DAC_OVERRIDE and CAP_FOWNER (ambient)", what, uid, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// writeOutputToken gives a link worker its sender token, in its lease directory, readable
// by the worker's user alone. It returns the path the worker sees ("" without a token).
func (a *Agent) writeOutputToken(id string, wa cluster.WorkerAssignment, mode string, u *isolation.User) (string, error) {
	if wa.OutputToken == "" {
		return "", nil
	}
	p := filepath.Join(filepath.Dir(a.leaseFile(id)), tokenFile)
	if err := writeOwned(p, []byte(wa.OutputToken+"\n"), 0o400, u); err != nil {
		return "", fmt.Errorf("sender token of %s: %w", id, err)
	}
	return a.tokenPath(id, mode), nil
}

// tokenPath is where a worker finds its sender token.
func (a *Agent) tokenPath(id, mode string) string {
	return a.workerPath(id, mode, tokenFile)
}

// workerPath is where a worker finds the file name of its lease directory.
func (a *Agent) workerPath(id, mode, name string) string {
	if mode == cluster.IsolationDocker {
		return filepath.Join(containerLeaseDir, name)
	}
	return filepath.Join(filepath.Dir(a.leaseFile(id)), name)
}

// writeRouterCredentials gives a router (a System worker) its own copy of the store's
// credentials, in its lease directory, 0400 and its user's: not the agent's file, which
// its uid cannot read, and nothing a tenant's worker can reach. It returns the path the
// router sees ("" when the store has no credentials).
func (a *Agent) writeRouterCredentials(id string, wa cluster.WorkerAssignment, mode string, u *isolation.User) (string, error) {
	if !wa.System || a.cfg.StoreCredentialsFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(a.cfg.StoreCredentialsFile)
	if err != nil {
		return "", fmt.Errorf("store credentials for router %s: %w", id, err)
	}
	p := filepath.Join(filepath.Dir(a.leaseFile(id)), credentialsFile)
	if err := writeOwned(p, b, 0o400, u); err != nil {
		return "", fmt.Errorf("store credentials for router %s: %w", id, err)
	}
	return a.workerPath(id, mode, credentialsFile), nil
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
		// Said here, once, rather than as the router's "permission denied".
		if reachable(a.cfg.SinkDir, *u) != nil {
			return fmt.Errorf("sink dir %s: the router of tenant %s runs as uid %d, which cannot enter it or a directory above it: "+
				"make them traversable (chmod o+x) or give --sink-dir a directory outside private ones (not below the data directory or /root)",
				a.cfg.SinkDir, wa.Tenant, u.UID)
		}
	}
	if err := os.Chmod(dir, 0o750); err != nil {
		return fmt.Errorf("sink dir of tenant %s: %w", wa.Tenant, err)
	}
	return nil
}
