package cluster

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// FieldError is one problem with one field of a spec.
type FieldError struct {
	Path string // like "placement.spread[1]"
	Msg  string
	Line int // 1-based line in the YAML source; 0 when unknown
}

func (e FieldError) String() string {
	s := e.Path + ": " + e.Msg
	if e.Path == "" {
		s = e.Msg
	}
	if e.Line > 0 {
		s += fmt.Sprintf(" (line %d)", e.Line)
	}
	return s
}

// ValidationError carries every problem found in a spec at once.
type ValidationError struct {
	What     string // "job spec", "cluster"
	Problems []FieldError
}

func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.String()
	}
	return "invalid " + e.What + ": " + strings.Join(parts, "; ")
}

type problems []FieldError

func (ps *problems) add(path, format string, args ...any) {
	*ps = append(*ps, FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// isName reports whether s is a DNS label, ^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$ (names end up
// in cgroup paths, container names and store keys). By hand: that expression compiles to a
// program of 61 copies, which every process would pay for at start.
func isName(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// ErrInvalidName is CheckName's error: callers branch on it to answer "bad input".
var ErrInvalidName = errors.New("invalid name")

// NameRule says what a valid name is, for messages.
const NameRule = "1-63 lower-case letters, digits or '-', starting and ending with a letter or digit"

// CheckName reports whether s can name a job, tenant, node, data center, rack or link. It
// is the one name check: every store key and file path built from a name goes through it
// (see JobKey and the other key builders).
func CheckName(s string) error {
	if !isName(s) {
		return nameError{s}
	}
	return nil
}

// nameError says which name was refused and what a name is; it is ErrInvalidName.
type nameError struct{ name string }

func (e nameError) Error() string        { return quoteName(e.name) + " must be " + NameRule }
func (e nameError) Is(target error) bool { return target == ErrInvalidName }

// quoteName quotes a refused name for a one-line message: escaped, and clipped so that a
// megabyte of junk does not come back in the error.
func quoteName(s string) string {
	const maxLen = 64
	if len(s) > maxLen {
		return strconv.QuoteToASCII(s[:maxLen]) + "..."
	}
	return strconv.QuoteToASCII(s)
}

// Limits on what one job may ask for.
const (
	MaxWorkersPerJob = 100000
	MaxPriority      = 1000
	minWorkerMemory  = 4 << 20
	// MaxCommandEnvBytes bounds a job's command and environment together. Each node's
	// assignment carries them once per job it runs (cluster/assignwire.go), and ZooKeeper
	// refuses a value over 1 MiB: settings larger than this belong in the image or a file.
	MaxCommandEnvBytes = 64 << 10
)

// Validate checks the spec and returns a *ValidationError listing every problem, or nil.
func (j *JobSpec) Validate() error {
	var ps problems
	if j.Name == "" {
		ps.add("name", "is required")
	} else if err := CheckName(j.Name); err != nil {
		ps.add("name", "%v", err)
	}
	if j.Tenant == "" {
		ps.add("tenant", "is required")
	} else if err := CheckName(j.Tenant); err != nil {
		ps.add("tenant", "%v", err)
	}
	if j.Workers < 1 {
		ps.add("workers", "must be at least 1")
	} else if j.Workers > MaxWorkersPerJob {
		ps.add("workers", "must be at most %d", MaxWorkersPerJob)
	}
	if j.Resources.Memory < minWorkerMemory {
		ps.add("resources.memory", "must be at least 4Mi (a worker process needs some memory to start)")
	}
	if j.Resources.CPU <= 0 {
		ps.add("resources.cpu", "must be more than 0 (like 0.5)")
	}
	switch j.Isolation {
	case "", IsolationProcess:
		if len(j.Command) == 0 {
			ps.add("command", "is required for process isolation")
		}
	case IsolationDocker:
		if j.Image == "" {
			ps.add("image", "is required for docker isolation")
		}
	default:
		ps.add("isolation", "must be process or docker, not %q", j.Isolation)
	}
	if n := commandEnvBytes(j); n > MaxCommandEnvBytes {
		ps.add("env", "command and environment are %d bytes together, over the %d allowed: put large settings in the image or a file", n, MaxCommandEnvBytes)
	}
	for k := range j.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			ps.add("env", "variable name %q is not valid", k)
		} else if strings.HasPrefix(k, "STORMDOCK_") || strings.HasPrefix(k, "_STORMDOCK_") {
			ps.add("env."+k, "STORMDOCK_ and _STORMDOCK_ variables are set by stormdock itself")
		}
	}
	for i, k := range j.LiveEnv {
		path := fmt.Sprintf("liveEnv[%d]", i)
		switch {
		case k == "" || strings.ContainsAny(k, "=\x00"):
			ps.add(path, "variable name %q is not valid", k)
		case strings.HasPrefix(k, "STORMDOCK_"):
			ps.add(path, "STORMDOCK_ variables are set by stormdock itself")
		case slices.Index(j.LiveEnv, k) != i:
			ps.add(path, "%q is listed twice", k)
		}
	}
	j.Update.validate(&ps, "update.", j.Workers)
	if j.Scaling != nil {
		j.Scaling.validate(&ps, j.Workers)
	}
	j.Placement.validate(&ps)
	j.validateLinks(&ps)
	j.validateSecrets(&ps)
	if j.Priority < 0 || j.Priority > MaxPriority {
		ps.add("priority", "must be between 0 and %d", MaxPriority)
	}
	if j.GracePeriod < 0 {
		ps.add("gracePeriod", "must not be negative")
	}
	if len(ps) == 0 {
		return nil
	}
	return &ValidationError{What: "job spec", Problems: ps}
}

var domainDepth = map[string]int{DomainDC: 0, DomainRack: 1, DomainNode: 2}

func (p *PlacementSpec) validate(ps *problems) {
	last := -1
	for i, d := range p.Spread {
		depth, ok := domainDepth[d]
		switch {
		case !ok:
			ps.add(fmt.Sprintf("placement.spread[%d]", i), "must be dc, rack or node, not %q", d)
		case depth <= last:
			ps.add(fmt.Sprintf("placement.spread[%d]", i), "%q is listed twice or out of order (outermost first: dc, rack, node)", d)
		default:
			last = depth
		}
	}
	if p.MaxPerNode < 0 {
		ps.add("placement.maxPerNode", "must not be negative (0 means no cap)")
	}
	for i, dc := range p.DCs {
		if err := CheckName(dc); err != nil {
			ps.add(fmt.Sprintf("placement.dcs[%d]", i), "%v", err)
		} else if slices.Index(p.DCs, dc) != i {
			ps.add(fmt.Sprintf("placement.dcs[%d]", i), "%q is listed twice", dc)
		}
	}
	for k := range p.NodeLabels {
		if k == "" {
			ps.add("placement.nodeLabels", "label name must not be empty")
		}
	}
	switch p.Strategy {
	case "", StrategySpread, StrategyBinpack:
	default:
		ps.add("placement.strategy", "must be spread or binpack, not %q", p.Strategy)
	}
}

func (j *JobSpec) validateLinks(ps *problems) {
	if len(j.Links) == 0 {
		if j.Output != "" {
			checkOutput(ps, j.Output)
		}
		return
	}
	if len(j.Links) < 2 {
		ps.add("links", "a mirrored job needs at least two data centers")
	}
	for i, l := range j.Links {
		path := fmt.Sprintf("links[%d]", i)
		switch {
		case CheckName(l) != nil:
			ps.add(path, "%v", CheckName(l))
		case slices.Index(j.Links, l) != i:
			ps.add(path, "%q is listed twice", l)
		case len(j.Placement.DCs) > 0 && !slices.Contains(j.Placement.DCs, l):
			ps.add(path, "%q is not in placement.dcs", l)
		}
	}
	if j.Output == "" {
		ps.add("output", "is required for a mirrored job (file:///PATH, http://HOST/PATH, postgres://USER@HOST:PORT/DB?table=NAME or nats://HOST:PORT/SUBJECT)")
		return
	}
	checkOutput(ps, j.Output)
}

func checkOutput(ps *problems, out string) {
	u, err := url.Parse(out)
	if err != nil {
		ps.add("output", "is not a URL: %v", urlErr(err))
		return
	}
	switch u.Scheme {
	case "file":
		if u.Path == "" || u.Host != "" {
			ps.add("output", "a file sink is file:///ABSOLUTE/PATH")
		}
	case "http", "https":
		if u.Host == "" {
			ps.add("output", "an http sink needs a host")
		}
		if _, has := u.User.Password(); has {
			ps.add("output", "a password is never written in the output URL: give it to the routers as the job's output secret")
		}
	case "postgres", "postgresql":
		if _, err := ParsePostgresOutput(out); err != nil {
			ps.add("output", "postgres sink: %v", err)
		}
	case "nats":
		if _, err := ParseNATSOutput(out); err != nil {
			ps.add("output", "nats sink: %v", err)
		}
	default:
		ps.add("output", "must be a file://, http(s)://, postgres:// or nats:// URL, not %q", u.Redacted())
	}
}

// Validate checks a node record and returns a *ValidationError listing every problem, or nil.
func (n *Node) Validate() error {
	var ps problems
	n.validate(&ps, "")
	if len(ps) == 0 {
		return nil
	}
	return &ValidationError{What: "node", Problems: ps}
}

func (n *Node) validate(ps *problems, prefix string) {
	for _, f := range []struct{ name, v string }{{"id", n.ID}, {"dc", n.DC}, {"rack", n.Rack}} {
		if f.v == "" {
			ps.add(prefix+f.name, "is required")
		} else if err := CheckName(f.v); err != nil {
			ps.add(prefix+f.name, "%v", err)
		}
	}
	if n.Slots < 0 {
		ps.add(prefix+"slots", "must not be negative")
	}
	if n.Memory < 0 {
		ps.add(prefix+"memory", "must not be negative")
	}
	if n.CPU < 0 {
		ps.add(prefix+"cpu", "must not be negative")
	}
	if n.Used.Slots < 0 || n.Used.Memory < 0 || n.Used.CPU < 0 {
		ps.add(prefix+"used", "must not be negative")
	}
	if n.Throttled < 0 {
		ps.add(prefix+"throttled", "must not be negative")
	}
}

// Validate checks a tenant record.
func (t *Tenant) Validate() error {
	var ps problems
	if err := CheckName(t.Name); err != nil {
		ps.add("name", "%v", err)
	}
	if t.MaxWorkers < 0 {
		ps.add("maxWorkers", "must not be negative (0 means no cap)")
	}
	if t.MaxMemory < 0 {
		ps.add("maxMemory", "must not be negative (0 means no cap)")
	}
	if t.MaxPriority < 0 || t.MaxPriority > MaxPriority {
		ps.add("maxPriority", "must be between 0 (the lowest class: preempts no one) and %d", MaxPriority)
	}
	if t.UID < 0 {
		ps.add("uid", "must not be negative (the master gives it)")
	}
	if len(ps) == 0 {
		return nil
	}
	return &ValidationError{What: "tenant", Problems: ps}
}

// commandEnvBytes is the size of a job's command and environment as text.
func commandEnvBytes(j *JobSpec) int {
	n := 0
	for _, a := range j.Command {
		n += len(a) + 1
	}
	for k, v := range j.Env {
		n += len(k) + len(v) + 2
	}
	return n
}
