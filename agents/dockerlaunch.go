package agents

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/atomicfile"
)

// Docker workers run under the lease launcher like process workers, whatever their image
// holds: the agent's own launcher, a static binary, is bind-mounted read-only into every
// container at containerLauncher and is the container's entrypoint; the worker's command
// follows it, or, for a job without one, the image's own entrypoint and cmd, which the
// docker driver reads from the image (isolation.Spec.ImageCommand). The image's working
// directory and environment stay the worker's. So an image from any registry is fenced as
// stormdock's own are, and an image's ENTRYPOINT never takes the launcher's place.
//
// The mount's source is a copy in the agent's state directory (dockerLauncherFile): the
// engine resolves bind mounts on its own host, where the state directory is (docker workers'
// leases are bind-mounted from it too), while the agent's binary may be elsewhere (an agent
// in a container of its own, cluster create).

// containerLauncher is where a docker worker's container holds the launcher.
const containerLauncher = "/run/stormdock-launch"

// dockerLauncherFile is the launcher's copy in the state directory.
const dockerLauncherFile = "docker-launcher"

// prepareDockerLauncher copies the static launcher into the state directory for the docker
// driver's bind mounts: cfg.Launcher (stormdock-shim) or else cfg.Self, whichever is static
// (a container has no libc to load a dynamic one with). Without one (or when the copy
// fails: a full disk), docker workers with a command run under the image's own stormdock as
// before (SelfPath), and those without are refused at start, saying why (noDockerLauncher).
func (a *Agent) prepareDockerLauncher() {
	if a.drivers[cluster.IsolationDocker] == nil || a.cfg.NoLease {
		return
	}
	var why []string
	for _, src := range []string{a.cfg.Launcher, a.cfg.Self} {
		err := images.CheckStatic(src)
		if err == nil {
			dst := filepath.Join(a.cfg.StateDir, dockerLauncherFile)
			if err := copyExecutable(src, dst); err != nil {
				a.noDockerLauncher = fmt.Errorf("this agent could not copy its lease launcher %s for docker workers: %w: free the state directory's disk and restart the agent, or give the job a command", src, err)
				a.log.Warn("docker jobs without a command cannot run on this node", "err", a.noDockerLauncher)
				return
			}
			a.dockerLauncher = dst
			return
		}
		why = append(why, err.Error())
	}
	a.noDockerLauncher = fmt.Errorf("this agent has no static lease launcher to run an image's own command under (%s): "+
		"install stormdock-shim built with CGO_ENABLED=0 beside stormdock, or give the job a command", strings.Join(slices.Compact(why), "; "))
	a.log.Warn("docker jobs without a command cannot run on this node", "err", a.noDockerLauncher)
}

// copyExecutable replaces dst with a copy of src, mode 0755: a worker of any uid may run it,
// and only the agent may change it. Containers that run the copy before keep it (a bind
// mount holds the file it was made of).
func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	f, err := atomicfile.Create(dst, 0o755)
	if err != nil {
		return err
	}
	defer f.Cleanup()
	if _, err := io.Copy(f, in); err != nil {
		return err
	}
	return f.Commit()
}
