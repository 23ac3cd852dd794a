package healthcheck

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// AgentOOMScoreAdj is what the agent sets for itself: -1000 exempts it from the OOM killer.
// The agent is small and bounded; if the kernel killed it, every worker on the node would be
// orphaned and the master would reschedule them all, which is worse than any one worker dying.
const AgentOOMScoreAdj = -1000

// Worker OOM score adjustments lie in [WorkerOOMScoreAdjMin, WorkerOOMScoreAdjMax]: far above
// system daemons (0) so that, if the kernel must kill before the eviction loop acts, it
// kills a worker.
const (
	WorkerOOMScoreAdjMin = 500
	WorkerOOMScoreAdjMax = 1000
)

// WorkerOOMScoreAdj is the oom_score_adj the isolation driver should give a worker of a job
// with this priority: 1000 - priority, clamped to [500, 1000]. A lower priority gets a higher
// score, so the kernel, if it has to, picks in the same order as ChooseVictim does.
//
// Children inherit oom_score_adj at fork: a worker forked by the protected agent starts at
// -1000 and must be raised. The process driver writes this value with SetOOMScoreAdj right
// after the start (before the worker forks anything of its own, or through a re-exec shim
// that writes /proc/self/oom_score_adj before exec); the docker driver passes it as
// HostConfig.OomScoreAdj.
func WorkerOOMScoreAdj(priority int) int {
	return WorkerOOMScoreAdjMax - min(max(priority, 0), WorkerOOMScoreAdjMax-WorkerOOMScoreAdjMin)
}

// ProtectAgent sets the calling process's oom_score_adj to AgentOOMScoreAdj. Lowering it
// below its current floor needs CAP_SYS_RESOURCE, which root in a container often lacks; the
// error then wraps fs.ErrPermission. The agent should log it and go on: the workers, raised
// to WorkerOOMScoreAdj (which needs no privilege), still go first, since the agent stays at
// 0 and uses little memory; only a runaway agent would lose.
func ProtectAgent(procRoot string) error {
	err := SetOOMScoreAdj(procRoot, 0, AgentOOMScoreAdj)
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("%w (lowering it needs CAP_SYS_RESOURCE)", err)
	}
	return err
}

// SetOOMScoreAdj writes adj (-1000..1000) to /proc/<pid>/oom_score_adj; pid 0 means self.
func SetOOMScoreAdj(procRoot string, pid, adj int) error {
	if adj < -1000 || adj > 1000 {
		return fmt.Errorf("oom_score_adj %d out of range -1000..1000", adj)
	}
	p := oomPath(procRoot, pid)
	if err := os.WriteFile(p, []byte(strconv.Itoa(adj)), 0); err != nil {
		return fmt.Errorf("set oom_score_adj: %w", err)
	}
	return nil
}

// OOMScoreAdj reads /proc/<pid>/oom_score_adj; pid 0 means self.
func OOMScoreAdj(procRoot string, pid int) (int, error) {
	data, err := os.ReadFile(oomPath(procRoot, pid))
	if err != nil {
		return 0, fmt.Errorf("read oom_score_adj: %w", err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, fmt.Errorf("read oom_score_adj: %w", err)
	}
	return v, nil
}

func oomPath(procRoot string, pid int) string {
	if procRoot == "" {
		procRoot = "/proc"
	}
	who := "self"
	if pid != 0 {
		who = strconv.Itoa(pid)
	}
	return filepath.Join(procRoot, who, "oom_score_adj")
}
