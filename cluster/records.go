package cluster

import (
	"fmt"
	"slices"
	"time"
)

// Keys of the coordination store, relative to stormdock's root (the ZooKeeper chroot).
// The master writes jobs, tenants and assignments; each agent writes its own node record,
// which is session-bound so that it disappears with the agent.
const (
	JobsKey        = "/jobs"        // /jobs/<job>: JobRecord
	TenantsKey     = "/tenants"     // /tenants/<tenant>: TenantRecord
	NodesKey       = "/nodes"       // /nodes/<id>: NodeRecord, session-bound
	AssignmentsKey = "/assignments" // /assignments/<id>: NodeAssignment
	NodeConfsKey   = "/nodeconf"    // /nodeconf/<id>: NodeConf, set by operators
	DCsKey         = "/dcs"         // /dcs/<dc>: DCRecord
	ElectionKey    = "/master/election"
	MasterKey      = "/master/info" // MasterInfo of the active master, session-bound
	// AdminTokenKey holds the hash of the admin token; the token itself is only in the file
	// of whoever made it (a master's data directory, or the operator's for a provisioned
	// cluster).
	AdminTokenKey = "/master/admin"
	// MetricsTokenKey holds the hash of the scrape token, which reads /metrics (masters',
	// agents' and routers') and nothing else; the token itself is only in the file of the
	// master that made it (DATA/metrics.token).
	MetricsTokenKey = "/master/metrics-token"
	// MasterDirKey holds the masters' own entries: ElectionKey, MasterKey, the admin and scrape
	// tokens.
	MasterDirKey = "/master"
	// OutputKeyKey holds the key that mirrored jobs' sender tokens are made with (see
	// package multidc); only masters read it.
	OutputKeyKey = "/master/output-key"
	// AgentKeyKey holds the key masters sign their requests to agents with (workers' logs)
	// and agents check them with.
	AgentKeyKey = "/master/agent-key"
	// RouterCAKey holds the CA (certificate and key, PEM) that agents issue their output
	// routers' certificates from; link workers, masters and the CLI trust it for routers.
	RouterCAKey = "/master/router-ca"
	// RoutersKey holds one entry per mirrored job, written by its output router (package
	// multidc): /routers/<job>: RouterRecord, /routers/<job>/election: the routers' election.
	RoutersKey = "/routers"
	// EventsKey holds the cluster's events (written by the masters, see package scheduler):
	// its value is the head (the next event id), its children the slots of events.
	EventsKey = "/events"
	// SharedImagesKey holds the SharedImages: the repository prefixes the admin shared,
	// whose images nodes and masters fetch with their own registry credentials.
	SharedImagesKey = "/shared-images"
	// TenantUIDsKey holds the next free uid of the tenants' range (TenantUIDCounter): it
	// only grows, so a uid is never given twice, a deleted tenant's included.
	TenantUIDsKey = "/tenant-uids"
)

// registryAuthChild is the name of a tenant's registry credentials below its record: a key
// of its own, so that nothing that reads tenant records (the API's list, the masters'
// mirror, token checks) ever holds them.
const registryAuthChild = "registry-auth"

// TenantRegistryAuthKey is the store key of a tenant's registry credentials (Docker's
// config.json, as images.Auth.Marshal writes it).
func TenantRegistryAuthKey(name string) (string, error) {
	k, err := TenantKey(name)
	if err != nil {
		return "", err
	}
	return k + "/" + registryAuthChild, nil
}

// SharedImages is the admin's list of shared repository prefixes (normalized by
// images.CheckPrefix: REGISTRY[/PATH], no trailing slash), sorted.
type SharedImages struct {
	Prefixes []string `json:"prefixes"`
}

// The key builders below are the only way store keys are made from names. Each refuses a
// name CheckName refuses (wrapping ErrInvalidName), so that a name no entry point checked
// still cannot reach another record: path.Join("/jobs", "../tenants/demo") is
// "/tenants/demo".

func nameKey(dir, kind, name string) (string, error) {
	if err := CheckName(name); err != nil {
		return "", fmt.Errorf("%s: %w", kind, err)
	}
	return dir + "/" + name, nil
}

// JobKey is the store key of a job's record.
func JobKey(name string) (string, error) { return nameKey(JobsKey, "job", name) }

// TenantKey is the store key of a tenant's record.
func TenantKey(name string) (string, error) { return nameKey(TenantsKey, "tenant", name) }

// NodeKey is the store key of a node's live record.
func NodeKey(id string) (string, error) { return nameKey(NodesKey, "node", id) }

// AssignmentKey is the store key of a node's assignment.
func AssignmentKey(id string) (string, error) { return nameKey(AssignmentsKey, "node", id) }

// NodeConfKey is the store key of a node's operator settings.
func NodeConfKey(id string) (string, error) { return nameKey(NodeConfsKey, "node", id) }

// DCKey is the store key of a data center's record.
func DCKey(name string) (string, error) { return nameKey(DCsKey, "data center", name) }

// RouterKey is the store key of a mirrored job's router record, the parent of its
// RouterElectionKey: deleting the tree removes both.
func RouterKey(job string) (string, error) { return nameKey(RoutersKey, "job", job) }

// RouterElectionKey is the prefix of the election that lets one router at a time serve a
// job, so that two routers never write one sink.
func RouterElectionKey(job string) (string, error) {
	k, err := RouterKey(job)
	if err != nil {
		return "", err
	}
	return k + "/election", nil
}

// Data-center states.
const (
	DCActive = "active"
	DCFailed = "failed" // failed by an operator: its workers move out, nothing new goes in
	DCLost   = "lost"   // every node gone (derived, never stored)
)

// DCRecord is what the store keeps of a data center: its operator state and the nodes
// the master has seen there, so that a data center whose nodes are all gone is still known.
type DCRecord struct {
	Name  string    `json:"name"`
	State string    `json:"state"`
	Since time.Time `json:"since"`
	// Rebalance asks the leader, once, to spread jobs back into the data center.
	Rebalance bool `json:"rebalance,omitempty"`
}

// Job states.
const (
	JobRunning = "running"
	JobKilled  = "killed" // workers are being stopped; the record goes once none is left
)

// JobRecord is a submitted job as the store keeps it.
type JobRecord struct {
	Spec JobSpec `json:"spec"`
	// Generation is the generation of Spec: a new one is made by every update of the spec
	// (its history is under HistoryKey). During a rollout workers run older generations
	// until they are replaced; a reverted update sets it back to the one before.
	Generation int64  `json:"generation"`
	State      string `json:"state"`
	// Image pins the spec's docker image to a registry digest for one generation (nil for a
	// job without an image).
	Image *ImagePin `json:"image,omitempty"`
	// Epoch counts the changes of the worker count (1 at submit): workers that partition a
	// stream by index tell one partitioning from the next by it (WorkerConfig.Epoch).
	Epoch int64 `json:"epoch,omitempty"`
	// Rollout is the job's current or last rollout (job update, rollback, restart).
	Rollout *Rollout `json:"rollout,omitempty"`
	// Autoscale is the autoscaler's state of a job with a scaling policy.
	Autoscale *AutoscaleState `json:"autoscale,omitempty"`
	// OutputTokenHash is the hash of a mirrored job's own token, which the masters present
	// to its router to fail its output over; the token itself is in no record (see package
	// multidc).
	OutputTokenHash string `json:"outputTokenHash,omitempty"`
	// OutputLinkTokenHashes are the hashes of the sender tokens of the job's links, by link:
	// a link's workers present theirs with every batch and heartbeat, and the router takes
	// a link's records only with that link's token. A job stored before per-link tokens has
	// none; its workers then present the job's token.
	OutputLinkTokenHashes map[string]string `json:"outputLinkTokenHashes,omitempty"`
	Submitted             time.Time         `json:"submitted"`
	Updated               time.Time         `json:"updated"`
}

// TenantRecord is a tenant with the hash of its API token.
type TenantRecord struct {
	Tenant
	TokenHash string    `json:"tokenHash,omitempty"` // hex SHA-256 of the token
	Created   time.Time `json:"created"`
}

// NodeConf holds what operators set on a node.
type NodeConf struct {
	Draining bool   `json:"draining,omitempty"`
	Pool     string `json:"pool,omitempty"`
	// Avoid lists jobs whose workers kept crashing here: they run elsewhere while they can.
	// Masters from before Avoided avoid what it lists for good; later ones until the job's
	// Avoided entry's Until, and then take the job off this list.
	Avoid []string `json:"avoid,omitempty"`
	// Avoided says, for jobs of Avoid (and for some time after, to remember their strikes),
	// until when and how often. A job in Avoid without an entry (a record of an earlier
	// master) gets one at the leader's next look.
	Avoided []Avoidance `json:"avoided,omitempty"`
}

// Avoidance is one job's avoidance of a node after its workers crash-looped there.
type Avoidance struct {
	Job string `json:"job"`
	// Since is when the last crash loop made the node avoid the job (zero in a record of an
	// earlier master).
	Since time.Time `json:"since,omitzero"`
	// Until is when the node takes the job's workers again.
	Until time.Time `json:"until"`
	// Strikes counts the crash loops that made the node avoided, the last included: each
	// doubles the period, up to the masters' cap.
	Strikes int `json:"strikes"`
}

// Avoidance returns the job's avoidance entry, if it has one.
func (c NodeConf) Avoidance(job string) (Avoidance, bool) {
	for _, a := range c.Avoided {
		if a.Job == job {
			return a, true
		}
	}
	return Avoidance{}, false
}

// Avoiding reports whether the node avoids the job's workers at now: the job is in Avoid
// and its avoidance has not run out (an entry-less one lasts until it gets an entry).
func (c NodeConf) Avoiding(job string, now time.Time) bool {
	if !slices.Contains(c.Avoid, job) {
		return false
	}
	a, ok := c.Avoidance(job)
	return !ok || now.Before(a.Until)
}

// Worker states as agents report them.
const (
	// WorkerPulling: the node lacks the worker's image and its agent is pulling it.
	WorkerPulling  = "pulling"
	WorkerStarting = "starting"
	WorkerRunning  = "running"
	WorkerBackoff  = "backoff" // crashed; waiting before the next restart
	WorkerStopping = "stopping"
	WorkerFailed   = "failed" // could not be started (bad image, bad command)
	// WorkerEvicted: stopped by the node's health checks under memory pressure; the agent
	// does not restart it and the master places it elsewhere.
	WorkerEvicted = "evicted"
)

// WorkerStates lists every worker state, in the order of a worker's life: the label values
// of the master's and the agents' per-state worker metrics, so that both report the same
// series (a state with no worker reads 0 rather than missing).
func WorkerStates() []string {
	return []string{WorkerPulling, WorkerStarting, WorkerRunning, WorkerBackoff, WorkerStopping, WorkerFailed, WorkerEvicted}
}

// WorkerStatus is one worker as its agent sees it.
type WorkerStatus struct {
	Key        WorkerKey `json:"key"`
	Generation int64     `json:"generation"`
	// Restart is the assignment's restart rollout (WorkerAssignment.Restart).
	Restart int64  `json:"restart,omitempty"`
	State   string `json:"state"`
	PID     int    `json:"pid,omitempty"`
	// Port is the worker's STORMDOCK_PORT on its node's address.
	Port        int    `json:"port,omitempty"`
	ContainerID string `json:"containerId,omitempty"`
	Restarts    int    `json:"restarts"`
	// RecentRestarts counts restarts within the agent's crash-loop window.
	RecentRestarts int    `json:"recentRestarts,omitempty"`
	LastExit       string `json:"lastExit,omitempty"`
	// ExitReason says whose fault the last end was (an Exit* value): only ExitCrashed
	// counts in Restarts and RecentRestarts, backs off and makes a node avoided.
	ExitReason string `json:"exitReason,omitempty"`
	// Lapses counts the worker's stops by its launcher for a lapsed lease (not restarts).
	Lapses int       `json:"lapses,omitempty"`
	Memory Bytes     `json:"memory,omitempty"`
	Since  time.Time `json:"since"`
}

// Exit reasons, as WorkerStatus.ExitReason: whether a worker's last end was its own failure.
const (
	// ExitCrashed: the worker's own failure (a non-zero exit, a signal stormdock did not
	// send, an OOM kill, or an exit with the launcher's lapse status while the lease was
	// fine): counted, backed off, and a crash loop makes the node avoided for the job.
	ExitCrashed = "crashed"
	// ExitLeaseLapsed: the worker's lease launcher stopped it because the node's keeper
	// stopped renewing the lease (a store or network fault, fencing): not counted.
	ExitLeaseLapsed = "lease-lapsed"
	// ExitStopped: the agent stopped it (drain, move, rollout, kill): not counted.
	ExitStopped = "stopped"
	// ExitEvicted: the node's health checks stopped it under memory pressure: not counted.
	ExitEvicted = "evicted"
)

// ExitCounts reports whether an end with this reason counts as a crash ("" for records
// of agents from before exit reasons, which counted every end).
func ExitCounts(reason string) bool { return reason == "" || reason == ExitCrashed }

// NodeHealth is what the node's health checks say.
type NodeHealth struct {
	State     string `json:"state"` // HealthHealthy, HealthThrottled or HealthUnhealthy
	Reason    string `json:"reason,omitempty"`
	Throttled int    `json:"throttled,omitempty"` // slots withheld
}

// NodeRecord is an agent's live entry: who the node is, its health and its workers. The
// agent rewrites it at most once per heartbeat, and only when something changed.
type NodeRecord struct {
	Node    Node           `json:"node"`
	Health  NodeHealth     `json:"health"`
	Workers []WorkerStatus `json:"workers"`
	// Isolation lists the drivers this agent can run workers with.
	Isolation []string `json:"isolation"`
	// Images reports the images the node's assignment asks to pre-pull.
	Images []ImageStatus `json:"images,omitempty"`
	// Logs is where the agent serves its workers' logs to the masters; nil when it serves
	// none.
	Logs    *LogsEndpoint `json:"logs,omitempty"`
	Agent   string        `json:"agent"` // agent instance id, new at every start
	Started time.Time     `json:"started"`
	// SessionTimeout is the store session timeout granted to the node (the shortest of the
	// agent's and its keeper's sessions): the workers' leases last no longer. 0: unknown.
	SessionTimeout Duration `json:"sessionTimeout,omitempty"`
	// SessionRequested is the session timeout the agent asked for, shown only when the
	// store granted less (its maxSessionTimeout is lower).
	SessionRequested Duration `json:"sessionRequested,omitempty"`
	// Identity holds the node's public keys: the leading master hands the node its
	// workers' secrets only on a request signed with the first, sealed to the second.
	Identity *NodeIdentity `json:"identity,omitempty"`
}

// NodeIdentity is a node's public keys, made by its agent at its first start (the private
// halves never leave its state directory).
type NodeIdentity struct {
	// Sign is an Ed25519 public key: requests of the node's agent are signed with it.
	Sign []byte `json:"sign"`
	// Seal is an X25519 public key: secrets for the node are sealed to it (HPKE).
	Seal []byte `json:"seal"`
}

// WorkerAssignment is everything an agent needs to run one worker. A change of what it runs
// (SameRun) replaces the worker: stop with grace, then start. A change of the live fields
// (SameLive: the worker count and its epoch, the generation, live env, routers) rewrites
// its live configuration and sends it SIGHUP instead.
type WorkerAssignment struct {
	Key WorkerKey `json:"key"`
	// Generation is the generation of the job's spec the worker runs: during a rollout
	// workers not replaced yet keep an older one. Live: a new generation that changes
	// nothing the worker runs reaches it without a restart.
	Generation int64  `json:"generation"`
	Tenant     string `json:"tenant"`
	Workers    int    `json:"workers"` // workers in the job (per link)
	// Epoch counts the changes of the worker count (JobRecord.Epoch).
	Epoch int64 `json:"epoch,omitempty"`
	// Restart is the restart rollout that last replaced the worker in place (job restart):
	// a new value replaces it though nothing else changed.
	Restart   int64    `json:"restart,omitempty"`
	Isolation string   `json:"isolation"`
	Command   []string `json:"command,omitempty"`
	Image     string   `json:"image,omitempty"`
	// Pinned is Image by digest (NAME@sha256:...), as the master resolved it for Generation:
	// what the agent pulls and runs. Empty when the image is not pinned.
	Pinned string `json:"pinned,omitempty"`
	// Env is the environment the worker runs with; LiveEnv holds the keys the spec lists in
	// liveEnv, whose changes reach the worker live.
	Env       map[string]string `json:"env,omitempty"`
	LiveEnv   map[string]string `json:"liveEnv,omitempty"`
	Resources Resources         `json:"resources"`
	Priority  int               `json:"priority,omitempty"`
	Grace     Duration          `json:"grace"`
	Output    string            `json:"output,omitempty"`
	// OutputToken is the sender token of a mirrored job's link worker: the agent hands it to
	// the worker in a file only the worker may read.
	OutputToken string `json:"outputToken,omitempty"`
	// System marks stormdock's own workers (output routers): they get the store's
	// credentials, and run as their tenant's router uid (Tenant.RouterUID).
	System bool `json:"system,omitempty"`
	// UID is who the worker runs as, uid and gid (no supplementary groups): its tenant's
	// UID, or its RouterUID for a System worker. 0 is never run: the agent refuses it.
	UID int `json:"uid,omitempty"`
	// Stop asks the agent to stop the worker with Grace (a job killed with its own grace
	// period); the master drops the entry once the agent no longer reports the worker.
	Stop bool `json:"stop,omitempty"`
	// Routers are the URLs of a mirrored job's output routers, the active one among them,
	// for its link workers. Like the worker count, they reach a running worker through its
	// live configuration (WorkerConfig), without a restart.
	Routers []string `json:"routers,omitempty"`
	// Secrets are the tenant secrets the worker gets as files (names and versions, never
	// values: its agent fetches those from the leading master). The names are part of its
	// run; a new version reaches it live.
	Secrets []SecretRef `json:"secrets,omitempty"`
}

// WorkerConfig is a worker's live configuration: the file named by STORMDOCK_CONFIG, which
// its agent rewrites when any of it changes, without restarting the worker.
type WorkerConfig struct {
	Job     string `json:"job"`
	Link    string `json:"link,omitempty"`
	Worker  int    `json:"worker"`
	Workers int    `json:"workers"`
	// Epoch grows with every change of Workers: a worker that partitions its input by
	// index re-partitions when it changes (see examples/wordcount).
	Epoch      int64             `json:"epoch"`
	Generation int64             `json:"generation"`
	Routers    []string          `json:"routers,omitempty"`
	Env        map[string]string `json:"env,omitempty"` // the spec's env, live keys as they are now
}

// NodeAssignment is the set of workers the master wants on one node.
type NodeAssignment struct {
	Node string `json:"node"`
	// DC and Rack are the node's, remembered so that the master can tell where the
	// workers of a node that is gone were.
	DC      string             `json:"dc,omitempty"`
	Rack    string             `json:"rack,omitempty"`
	Workers []WorkerAssignment `json:"workers"`
	// Prepull lists images (pinned references) the agent pulls ahead of need, so that a
	// rollout that replaces a worker with a new image stops it only for stop and start; the
	// agent reports them in its NodeRecord's Images.
	Prepull []string `json:"prepull,omitempty"`
	// PrepullTenants names, for each Prepull image, the tenant whose registry credentials
	// pull it (a shared image is pulled with the node's own): an agent never fetches a
	// tenant's image with credentials another gave.
	PrepullTenants map[string]string `json:"prepullTenants,omitempty"`
	// Session is the store session owning the node's entry when the master wrote this: the
	// node's agent acts only on an assignment stamped with its current session, one written
	// after the master saw the node as it is registered now.
	Session int64 `json:"session,omitempty"`
}

// MasterInfo tells clients where the active master serves its API.
type MasterInfo struct {
	ID  string `json:"id"`
	API string `json:"api"`
	// CertSHA256 is the SHA-256 (hex, of the DER bytes) of the certificate an https:// API
	// serves: agents fetching their workers' secrets trust it alone (the store, which only
	// the cluster can write, vouches for it), whatever CA signed it.
	CertSHA256 string `json:"certSha256,omitempty"`
}

// LogsEndpoint is an agent's HTTP endpoint for its workers' logs, at the node's Addr.
type LogsEndpoint struct {
	Port int `json:"port"`
	// TLS is set when it serves HTTPS, with a certificate of its own whose SHA-256 (hex, of
	// the DER bytes) is CertSHA256: masters trust that certificate alone for the node (the
	// store, which only the cluster can write, vouches for it).
	TLS        bool   `json:"tls,omitempty"`
	CertSHA256 string `json:"certSha256,omitempty"`
}
