package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/provision"
)

// Labels on every container of a cluster. LabelSpec (the spec as JSON, without secrets)
// and LabelStore let any later command scale the cluster the way it was created.
const (
	LabelCluster = "io.stormdock.cluster"
	LabelRole    = "io.stormdock.cluster.role" // master or agent
	LabelNode    = "io.stormdock.cluster.node"
	LabelIndex   = "io.stormdock.cluster.index"
	LabelDC      = "io.stormdock.cluster.dc"
	LabelRack    = "io.stormdock.cluster.rack"
	LabelAPI     = "io.stormdock.cluster.api"
	LabelStore   = "io.stormdock.cluster.store"
	LabelSpec    = "io.stormdock.cluster.spec"

	roleMaster = "master"
	roleAgent  = "agent"
)

// Mount points of the tmpfs state directories: the root file system is read-only.
const (
	masterData = "/data"
	agentState = "/state"
)

// containerName is the container of a node id, or of "NAME-master".
func containerName(id string) string { return "stormdock-" + id }

// containerName0 is a listed container's name without docker's leading slash.
func containerName0(c container.Summary) string {
	if len(c.Names) == 0 {
		return c.ID[:min(12, len(c.ID))]
	}
	return strings.TrimPrefix(c.Names[0], "/")
}

func baseLabels(spec provision.Spec, role string) (map[string]string, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	return map[string]string{
		LabelCluster: spec.Name,
		LabelRole:    role,
		LabelStore:   spec.Store,
		LabelSpec:    string(b),
	}, nil
}

// hostConfig is what master and agent containers share: host network (loopback reaches
// ZooKeeper and the master), a read-only root with tmpfs state, no capabilities (an agent
// gets AgentCapabilities back), no new privileges, and a
// private cgroup namespace so that the agent finds no writable hierarchy (not the host's)
// and runs its workers unconfined inside the container's own limits.
func hostConfig(mem cluster.Bytes, cpu cluster.CPU, tmpfs string) *container.HostConfig {
	pids := int64(4096)
	return &container.HostConfig{
		NetworkMode:    "host",
		ReadonlyRootfs: true,
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges"},
		CgroupnsMode:   container.CgroupnsModePrivate,
		// Docker restarts a crashed agent or master; the new agent re-registers the node.
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyUnlessStopped},
		Tmpfs:         map[string]string{tmpfs: "rw,nosuid,nodev,mode=1777,size=" + strconv.FormatInt(int64(mem)/4, 10)},
		Resources: container.Resources{
			Memory:     int64(mem),
			MemorySwap: int64(mem), // no swap: the limit is the limit
			NanoCPUs:   int64(cpu) * 1e6,
			PidsLimit:  &pids,
		},
	}
}

// Environment that carries secrets into containers: a container's environment is seen by
// the engine's users (root), its command line by everyone on the machine.
const (
	envStoreCredentials = "STORMDOCK_STORE_CREDENTIALS"
	envTLSCertPEM       = "STORMDOCK_TLS_CERT_PEM"
	envTLSKeyPEM        = "STORMDOCK_TLS_KEY_PEM"
	// envSecretsKeyring is the masters' keyring for tenant secrets (tools/daemons).
	envSecretsKeyring = "STORMDOCK_SECRETS_KEYRING"
)

func (p *Provider) startMaster(ctx context.Context, spec provision.Spec, port int, env []string) (string, error) {
	labels, err := baseLabels(spec, roleMaster)
	if err != nil {
		return "", err
	}
	api := "127.0.0.1:" + strconv.Itoa(port)
	labels[LabelAPI] = "https://" + api
	cfg := &container.Config{
		Image:  spec.Image,
		Labels: labels,
		Env:    env,
		Cmd: []string{binary, "master", "--store", spec.Store, "--api", api, "--id", spec.Name + "-master",
			"--data", masterData, "--session-timeout", spec.SessionTimeout.String()},
	}
	hc := hostConfig(spec.MasterMemory, spec.MasterCPU, masterData)
	cmd := []string(cfg.Cmd)
	if err := p.storeTLSMounts(spec.Name, hc, &cmd); err != nil {
		return "", err
	}
	cfg.Cmd = cmd
	if spec.RegistryAuth != "" {
		hc.Mounts = append(hc.Mounts, authMount(spec.RegistryAuth))
		cfg.Cmd = append(cfg.Cmd, "--registry-auth", registryAuthPath)
	}
	return p.run(ctx, cfg, hc, containerName(spec.Name+"-master"))
}

// agentReserve is the share of an agent container's memory kept for the agent itself and
// its tmpfs state rather than advertised for workers.
const agentReserve = 8

func (p *Provider) startAgent(ctx context.Context, spec provision.Spec, s provision.Slot, env []string) error {
	labels, err := baseLabels(spec, roleAgent)
	if err != nil {
		return err
	}
	labels[LabelNode], labels[LabelDC], labels[LabelRack] = s.Node, s.DC, s.Rack
	labels[LabelIndex] = strconv.Itoa(s.Index)
	name := containerName(s.Node)
	workerMem := spec.AgentMemory - spec.AgentMemory/agentReserve
	cmd := []string{binary, "agent", "--store", spec.Store, "--node-id", s.Node, "--host", name,
		"--dc", s.DC, "--rack", s.Rack, "--slots", strconv.Itoa(spec.Slots),
		"--memory", strconv.FormatInt(int64(workerMem), 10), "--cpu", spec.AgentCPU.String(),
		"--session-timeout", spec.SessionTimeout.String(),
		"--cgroups", "auto", "--metrics", "off",
		// The master serves TLS: so do the agents' log endpoints (pinned through the store).
		"--tls",
		// Agents share the host's network: each gets its own range of worker ports.
		"--port-base", strconv.Itoa(portBase + s.Index*spec.Slots)}
	hc := hostConfig(spec.AgentMemory, spec.AgentCPU, agentState)
	// The agent runs each tenant's workers as the tenant's own uid, never its own: it is
	// root in its container, with only the capabilities that takes (AgentCapabilities), and
	// no-new-privileges still (a capability used in place needs no exec that gains one).
	// Its workers keep none: the switch away from root clears them, the shim its ambient
	// set. The state tmpfs is root's, 0711: the workers enter it to their own lease
	// directories and list nothing (agents' prepareStateDir), so no lease goes below /run.
	hc.CapAdd = slices.Clone(AgentCapabilities)
	hc.Tmpfs[agentState] = "rw,nosuid,nodev,mode=0711,size=" + strconv.FormatInt(int64(spec.AgentMemory)/4, 10)
	cfg := &container.Config{Image: spec.Image, Labels: labels, Env: env, User: "0:0"}
	if err := p.storeTLSMounts(spec.Name, hc, &cmd); err != nil {
		return err
	}
	if spec.RegistryAuth != "" {
		hc.Mounts = append(hc.Mounts, authMount(spec.RegistryAuth))
		cmd = append(cmd, "--registry-auth", registryAuthPath)
	}
	if spec.DockerWorkers {
		// The agent starts worker containers on the host's engine: their lease files are
		// bind-mounted from the host, so the agent's state is a host directory at the same
		// path inside (root's, as the agent is; it makes it 0711 for the workers, whose
		// way to it inside the container is the engine's directories, 0755).
		dir := filepath.Join(p.cfg.StateRoot, spec.Name, s.Node)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("agent %s: state directory: %w", s.Node, err)
		}
		hc.Mounts = append(hc.Mounts,
			mount.Mount{Type: mount.TypeBind, Source: p.cfg.DockerSocket, Target: "/var/run/docker.sock"},
			mount.Mount{Type: mount.TypeBind, Source: dir, Target: dir})
		cmd = append(cmd, "--isolation", "process,docker", "--state-dir", dir)
	} else {
		cmd = append(cmd, "--state-dir", agentState)
	}
	cfg.Cmd = append(cmd, spec.AgentArgs...)
	_, err = p.run(ctx, cfg, hc, name)
	return err
}

// AgentCapabilities are what an agent container gets back after dropping every capability:
// what running each tenant's workers as the tenant's own uid takes, and nothing more (no
// CAP_NET_*, CAP_SYS_*, CAP_MKNOD, CAP_SETPCAP...). Each was taken away in turn on a real
// cluster: without it a tenant's process worker fails to start, or (CAP_KILL) never stops.
var AgentCapabilities = []string{
	// setresuid to the tenant's uid (the shim, between fork and exec).
	"CAP_SETUID",
	// setresgid to the tenant's gid and setgroups to none of the agent's groups.
	"CAP_SETGID",
	// A worker's lease directory, sender token, router credentials and log are the
	// worker's uid's from the moment they appear (lchown, fchown).
	"CAP_CHOWN",
	// The agent still writes the lease, live configuration and token into that
	// directory, 0700 and the worker's, and removes it when the worker is gone.
	"CAP_DAC_OVERRIDE",
	// chmod of the lease directory after it was given away, and of files the workers own.
	"CAP_FOWNER",
	// SIGTERM, SIGHUP (live configuration) and SIGKILL to workers of other uids.
	"CAP_KILL",
}

// storeTLSDir is where masters and agents find a zks:// store's TLS files, bind-mounted
// read-only from the cluster's directory (provision.Tokens.StoreTLS): the client key
// stays a 0400 file, never in a container's environment or command line. The agents hand
// them on to their keepers and routers (agents.Config.StoreTLS).
const storeTLSDir = "/etc/stormdock/store-tls"

// keepStoreTLS keeps a zks:// store's TLS files in the cluster's directory and checks that
// its containers can use them. The master runs as the image's user (stormdock image build:
// 65534) with no capabilities: the kept key is made that uid's, 0400. The directory it is
// in stays the operator's, 0700, so no other user of the host reaches it.
func (p *Provider) keepStoreTLS(spec provision.Spec, imageUser string) error {
	if t, err := coord.ParseURL(spec.Store); err != nil || !t.TLS {
		return nil
	}
	files, err := p.cfg.Tokens.KeepStoreTLS(spec.Name, spec.StoreTLS)
	if err != nil {
		return err
	}
	if files.CA == "" {
		// The image is FROM scratch: no system roots to verify the servers with.
		return fmt.Errorf("%w: store %s: give --store-ca, the CA (PEM) that signed the ZooKeeper servers' certificates: the cluster's containers have no system roots", provision.ErrBadSpec, spec.Store)
	}
	if files.Key == "" {
		return nil
	}
	uid, gid, err := numericUser(imageUser)
	if err != nil {
		return fmt.Errorf("%w: image user %q: %v: the master could not be given the store's client key; build the image with stormdock image build", provision.ErrBadSpec, imageUser, err)
	}
	if err := os.Chown(files.Key, uid, gid); err != nil {
		return fmt.Errorf("store client key: give it to the master's uid %d: %w: run cluster create as root on the Docker host", uid, err)
	}
	return nil
}

// numericUser parses an image's USER ("", "UID" or "UID:GID"; names cannot be resolved
// from outside the image).
func numericUser(u string) (uid, gid int, err error) {
	if u == "" {
		return 0, 0, nil
	}
	us, gs, hasGID := strings.Cut(u, ":")
	if uid, err = strconv.Atoi(us); err != nil {
		return 0, 0, errors.New("not a numeric uid")
	}
	gid = uid
	if hasGID {
		if gid, err = strconv.Atoi(gs); err != nil {
			return 0, 0, errors.New("not a numeric gid")
		}
	}
	return uid, gid, nil
}

// storeTLSMounts mounts cluster name's kept store TLS files (if any) into hc and names
// them on cmd.
func (p *Provider) storeTLSMounts(name string, hc *container.HostConfig, cmd *[]string) error {
	files, err := p.cfg.Tokens.StoreTLS(name)
	if err != nil {
		return err
	}
	for _, f := range []struct{ src, file, flag string }{
		{files.CA, "ca.pem", "--store-ca"}, {files.Cert, "cert.pem", "--store-cert"}, {files.Key, "key.pem", "--store-key"},
	} {
		if f.src == "" {
			continue
		}
		target := storeTLSDir + "/" + f.file
		hc.Mounts = append(hc.Mounts, mount.Mount{Type: mount.TypeBind, Source: f.src, Target: target, ReadOnly: true})
		*cmd = append(*cmd, f.flag, target)
	}
	return nil
}

// registryAuthPath is where masters and agents find the registry credentials file.
const registryAuthPath = "/etc/stormdock/registry-auth.json"

func authMount(hostPath string) mount.Mount {
	return mount.Mount{Type: mount.TypeBind, Source: hostPath, Target: registryAuthPath, ReadOnly: true}
}

// removeWorkers removes the docker workers the agents among ctrs left on the engine (an
// agent stops its workers only when asked; a destroyed cluster's would otherwise stay).
func (p *Provider) removeWorkers(ctx context.Context, ctrs []container.Summary) error {
	var errs []error
	for _, c := range ctrs {
		node := c.Labels[LabelNode]
		if c.Labels[LabelRole] != roleAgent || node == "" {
			continue
		}
		ws, err := p.api.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
			filters.Arg("label", "io.stormdock.managed=true"), filters.Arg("label", "io.stormdock.node="+node))})
		if err != nil {
			return engineErr("list workers", err)
		}
		for _, w := range ws {
			if err := p.remove(ctx, w.ID, 0); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// portBase is the first worker port of agent 0.
const portBase = 20000

// run creates and starts a container; a container that cannot start is removed again.
func (p *Provider) run(ctx context.Context, cfg *container.Config, hc *container.HostConfig, name string) (string, error) {
	resp, err := p.api.ContainerCreate(ctx, cfg, hc, nil, nil, name)
	if err != nil {
		return "", engineErr("create container "+name, err)
	}
	if err := p.api.ContainerStart(ctx, resp.ID, container.StartOptions{}); err != nil {
		_ = p.remove(context.WithoutCancel(ctx), resp.ID, 0)
		return "", engineErr("start container "+name, err)
	}
	p.log.Debug("container started", "name", name, "id", resp.ID)
	return resp.ID, nil
}

// specOf recovers the cluster's spec and API URL from its containers' labels.
func specOf(ctrs []container.Summary) (provision.Spec, string, error) {
	var spec provision.Spec
	var api string
	found := false
	for _, c := range ctrs {
		if c.Labels[LabelRole] == roleMaster {
			api = c.Labels[LabelAPI]
		}
		if !found && c.Labels[LabelSpec] != "" {
			if err := json.Unmarshal([]byte(c.Labels[LabelSpec]), &spec); err == nil {
				found = true
			}
		}
	}
	if !found {
		return spec, api, errors.New("no container of the cluster carries a readable spec label: destroy it and create it again")
	}
	return spec, api, nil
}

// logTail is the end of a container's output, for errors.
func (p *Provider) logTail(ctx context.Context, name string) string {
	rc, err := p.api.ContainerLogs(ctx, name, container.LogsOptions{ShowStdout: true, ShowStderr: true, Tail: "200"})
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer rc.Close()
	var out bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &out, io.LimitReader(rc, 256<<10)); err != nil {
		return fmt.Sprintf("(log: %v)", err)
	}
	// The first lines say why a process refused to start (a usage error comes before the
	// help text); the last ones what it did at the end.
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) > 5 {
		lines = append(append(lines[:2:2], "..."), lines[len(lines)-3:]...)
	}
	return strings.Join(lines, " | ")
}
