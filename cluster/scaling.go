package cluster

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// ScalingPolicy is a job's autoscaling (the spec's scaling: block): the leading master keeps
// the job's worker count between Min and Max so that Metric, per worker, stays near Target,
// scaling through the same path as `job scale` (no restart of the workers that stay, a new
// epoch of the live configuration).
type ScalingPolicy struct {
	Min int `json:"min" yaml:"min"`
	Max int `json:"max" yaml:"max"`
	// Metric names a series of the job: one its workers serve (input_backlog), or one
	// stormdock measures (cpu, in cores; memory, in bytes; throughput, records per second).
	// A counter's value is its rate.
	Metric string `json:"metric" yaml:"metric"`
	// Target is the metric's value per worker the policy aims at.
	Target float64 `json:"target" yaml:"target"`
	// CooldownUp and CooldownDown are how long after the policy's last change it may scale
	// out, and in. Defaults DefaultCooldownUp and DefaultCooldownDown.
	CooldownUp   Duration `json:"cooldownUp,omitempty" yaml:"cooldownUp,omitempty"`
	CooldownDown Duration `json:"cooldownDown,omitempty" yaml:"cooldownDown,omitempty"`
	// Stabilization is how long every proposal must agree on fewer workers before the
	// policy scales in (it then takes the highest of them). Default DefaultStabilization.
	Stabilization Duration `json:"stabilization,omitempty" yaml:"stabilization,omitempty"`
	// MaxStep bounds one change, in workers; 0 means no bound.
	MaxStep int `json:"maxStep,omitempty" yaml:"maxStep,omitempty"`
}

// Defaults of ScalingPolicy.
const (
	DefaultCooldownUp    = time.Minute
	DefaultCooldownDown  = 5 * time.Minute
	DefaultStabilization = 5 * time.Minute
	// MaxStabilization bounds the window: the masters keep the history it is read from
	// (an hour by default, see --metrics-window).
	MaxStabilization = 24 * time.Hour
)

// Up, Down and Window are the policy's durations with their defaults.
func (p *ScalingPolicy) Up() time.Duration   { return orDefault(p.CooldownUp, DefaultCooldownUp) }
func (p *ScalingPolicy) Down() time.Duration { return orDefault(p.CooldownDown, DefaultCooldownDown) }
func (p *ScalingPolicy) Window() time.Duration {
	return orDefault(p.Stabilization, DefaultStabilization)
}

func orDefault(d Duration, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d.Std()
}

// Series that cannot drive scaling: what they measure does not fall when workers are
// added.
var unscalable = map[string]string{
	"workers":   "it is the worker count itself",
	"restarts":  "restarts do not fall when workers are added",
	"oom_kills": "OOM kills do not fall when workers are added",
}

// checkMetricName is the Prometheus rule for metric names, with the prefixes the agents
// drop (client libraries' own series) refused.
func checkMetricName(s string) string {
	if s == "" {
		return "is required: a series of the job (one its workers serve, like input_backlog, or cpu, memory or throughput)"
	}
	if len(s) > 128 {
		return "must be at most 128 characters"
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return fmt.Sprintf("%s is not a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*, no labels)", quoteName(s))
		}
	}
	for _, p := range []string{"go_", "process_", "promhttp_"} {
		if strings.HasPrefix(s, p) {
			return fmt.Sprintf("%s: the agents drop %s* series (client libraries' own); scale on what the workers measure, or on cpu or memory", quoteName(s), p)
		}
	}
	if why, ok := unscalable[s]; ok {
		return fmt.Sprintf("%s cannot drive scaling: %s", s, why)
	}
	return ""
}

func (p *ScalingPolicy) validate(ps *problems, workers int) {
	const pre = "scaling."
	if p.Min < 1 {
		ps.add(pre+"min", "must be at least 1 (kill the job to stop it)")
	}
	if p.Max < 1 || p.Max > MaxWorkersPerJob {
		ps.add(pre+"max", "must be between 1 and %d", MaxWorkersPerJob)
	}
	if p.Min >= 1 && p.Max >= 1 && p.Min > p.Max {
		ps.add(pre+"min", "%d is above scaling.max %d", p.Min, p.Max)
	}
	if p.Min >= 1 && p.Max >= p.Min && (workers < p.Min || workers > p.Max) {
		ps.add("workers", "%d is outside scaling.min..max (%d..%d): start the job within the policy's range", workers, p.Min, p.Max)
	}
	if msg := checkMetricName(p.Metric); msg != "" {
		ps.add(pre+"metric", "%s", msg)
	}
	if !(p.Target > 0) || math.IsInf(p.Target, 0) {
		ps.add(pre+"target", "must be a number above 0: the metric's value per worker to aim at")
	}
	for _, d := range []struct {
		name string
		v    Duration
	}{{"cooldownUp", p.CooldownUp}, {"cooldownDown", p.CooldownDown}, {"stabilization", p.Stabilization}} {
		if d.v < 0 {
			ps.add(pre+d.name, "must not be negative")
		}
	}
	if p.Stabilization.Std() > MaxStabilization {
		ps.add(pre+"stabilization", "must be at most %s", MaxStabilization)
	}
	if p.MaxStep < 0 {
		ps.add(pre+"maxStep", "must not be negative (0 means no bound)")
	}
}

// String is the policy in one line.
func (p *ScalingPolicy) String() string {
	s := fmt.Sprintf("%s target %g per worker, %d..%d workers, cooldown up %s down %s, stabilization %s",
		p.Metric, p.Target, p.Min, p.Max, p.Up(), p.Down(), p.Window())
	if p.MaxStep > 0 {
		s += fmt.Sprintf(", at most %d at a time", p.MaxStep)
	}
	return s
}

// AutoscaleState is what the autoscaler keeps of a job with a scaling policy, in its record.
type AutoscaleState struct {
	// Paused is set by a manual `job scale` (or `job autoscale --pause`): the policy decides
	// nothing until `job autoscale NAME --resume`.
	Paused   bool      `json:"paused,omitempty"`
	PausedAt time.Time `json:"pausedAt,omitzero"`
	PausedBy string    `json:"pausedBy,omitempty"`
	// Last is the policy's last change of the worker count.
	Last *ScalingDecision `json:"last,omitempty"`
}

// ScalingDecision is one change the policy made, with the numbers behind it.
type ScalingDecision struct {
	At     time.Time `json:"at"`
	From   int       `json:"from"`
	To     int       `json:"to"`
	Metric string    `json:"metric"`
	// Value is the metric per worker when it was decided; Target the policy's.
	Value  float64 `json:"value"`
	Target float64 `json:"target"`
	Reason string  `json:"reason"`
}
