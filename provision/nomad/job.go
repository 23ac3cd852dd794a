package nomad

import (
	"encoding/json"
	"strconv"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/provision"
)

// Mount points of the tmpfs state directories: the root file system is read-only.
const (
	masterData = "/data"
	agentState = "/state"
)

// agentReserve is the share of an agent's memory kept for the agent and its tmpfs state
// rather than advertised for workers (as in provision/docker).
const agentReserve = 8

// Job builds the Nomad service job of a cluster (spec with its defaults). Nomad resources
// are in MHz: a core counts as 1000 MHz (so MHz = stormdock millicores), which is what the job asks the scheduler for;
// the docker driver bounds the container's memory at MemoryMB.
func Job(spec provision.Spec) (*nomadapi.Job, error) {
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	id := JobID(spec.Name)
	job := nomadapi.NewServiceJob(id, id, "", 50)
	for _, dc := range spec.DCs {
		job.AddDatacenter(dc)
	}
	job.SetMeta(MetaCluster, spec.Name).SetMeta(MetaStore, spec.Store).SetMeta(MetaSpec, string(raw))

	master := nomadapi.NewTaskGroup(GroupMaster, 1)
	// A dynamic port on the host network: the master publishes its address in the store,
	// where the CLI finds it.
	master.Networks = []*nomadapi.NetworkResource{{Mode: "host", DynamicPorts: []nomadapi.Port{{Label: "api"}}}}
	master.AddTask(task("master", spec, int(spec.MasterMemory>>20), spec.MasterCPU, masterData, []string{
		"master", "--store", spec.Store, "--api", "${NOMAD_ADDR_api}", "--id", spec.Name + "-master-${NOMAD_ALLOC_INDEX}",
		"--data", masterData, "--session-timeout", spec.SessionTimeout.String(),
	}))
	job.AddTaskGroup(master)

	agents := nomadapi.NewTaskGroup(GroupAgents, spec.Agents)
	// One agent per Nomad client: the node id is the client's name, and the agents of one
	// host would share its ports.
	agents.Constrain(nomadapi.NewConstraint("", "distinct_hosts", "true"))
	agents.Constrain(nomadapi.NewConstraint("${meta.rack}", "is_set", ""))
	var targets []*nomadapi.SpreadTarget
	for _, dc := range spec.DCs {
		targets = append(targets, nomadapi.NewSpreadTarget(dc, uint8(100/len(spec.DCs))))
	}
	agents.AddSpread(nomadapi.NewSpread("${node.datacenter}", 100, targets))
	agents.AddSpread(nomadapi.NewSpread("${meta.rack}", 50, nil))
	workerMem := spec.AgentMemory - spec.AgentMemory/agentReserve
	agents.AddTask(task("agent", spec, int(spec.AgentMemory>>20), spec.AgentCPU, agentState, append([]string{
		"agent", "--store", spec.Store,
		"--node-id", "${node.unique.name}", "--host", "${node.unique.name}",
		"--dc", "${node.datacenter}", "--rack", "${meta.rack}",
		"--slots", strconv.Itoa(spec.Slots), "--memory", strconv.FormatInt(int64(workerMem), 10),
		"--cpu", spec.AgentCPU.String(), "--session-timeout", spec.SessionTimeout.String(),
		"--state-dir", agentState, "--metrics", "off",
		// Nomad's docker driver offers no private cgroup namespace to tell by: nested
		// cgroups are never writable in its containers, so say so rather than probe.
		"--cgroups", "off",
	}, spec.AgentArgs...)))
	job.AddTaskGroup(agents)
	return job, nil
}

// task is a docker task of the stormdock image running the binary with args.
func task(name string, spec provision.Spec, memMB int, cpu cluster.CPU, tmpfs string, args []string) *nomadapi.Task {
	t := nomadapi.NewTask(name, "docker").
		SetConfig("image", spec.Image).
		SetConfig("command", images.StormdockPath).
		SetConfig("args", args).
		SetConfig("network_mode", "host").
		SetConfig("readonly_rootfs", true).
		SetConfig("cap_drop", []string{"all"}).
		SetConfig("security_opt", []string{"no-new-privileges"}).
		SetConfig("pids_limit", 4096).
		SetConfig("mount", []map[string]any{{
			"type": "tmpfs", "target": tmpfs, "readonly": false,
			"tmpfs_options": map[string]any{"size": memMB << 20 / 4},
		}}).
		Require(&nomadapi.Resources{CPU: new(int(cpu)), MemoryMB: new(memMB)})
	t.Env = map[string]string{"STORMDOCK_STORE": spec.Store}
	return t
}
