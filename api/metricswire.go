package api

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// NodeMetrics travel from every agent to every master each interval: at 10,000 nodes that
// is a thousand answers a second for a master to read, so they are binary (JSON would cost
// the master several times the cpu). The form, all integers as unsigned varints:
//
//	"SDM1"  node  at(unix ms)  interval(ms)  nstrings  strings...  njobs  jobs...
//	string: len bytes
//	job:    job tenant (string indexes) workers failed problem nseries series...
//	series: name labels (string indexes) flags(1: counter) sum min max (float64 bits, 8 bytes
//	        little endian) n  [total (8 bytes) when a counter]
//
// Names and labels repeat from job to job, so they are written once, in a table.

// NodeMetricsContentType is the media type of the binary form.
const NodeMetricsContentType = "application/x-stormdock-node-metrics"

// Bounds a decoder holds an answer to; an agent never sends more (its own caps are lower).
const (
	MaxNodeMetricsBytes      = 8 << 20
	maxWireStrings           = 1 << 16
	maxWireString            = 4 << 10
	maxWireJobs              = 1 << 12
	maxWireSeries            = 1 << 17
	nodeMetricsMagic         = "SDM1"
	wireCounter         byte = 1
)

// ErrMetricsWire: bytes that are not a NodeMetrics.
var ErrMetricsWire = errors.New("malformed node metrics")

// MarshalNodeMetrics encodes m in the binary form.
func MarshalNodeMetrics(m NodeMetrics) []byte {
	idx := map[string]uint64{}
	var table []string
	str := func(s string) uint64 {
		if i, ok := idx[s]; ok {
			return i
		}
		i := uint64(len(table))
		idx[s] = i
		table = append(table, s)
		return i
	}
	type enc struct{ job, tenant, problem uint64 }
	jobs := make([]enc, len(m.Jobs))
	type sref struct{ name, labels uint64 }
	series := make([][]sref, len(m.Jobs))
	for i, j := range m.Jobs {
		jobs[i] = enc{str(j.Job), str(j.Tenant), str(j.Problem)}
		series[i] = make([]sref, len(j.Series))
		for k, s := range j.Series {
			series[i][k] = sref{str(s.Name), str(s.Labels)}
		}
	}
	b := make([]byte, 0, 64+len(m.Jobs)*64)
	b = append(b, nodeMetricsMagic...)
	b = appendString(b, m.Node)
	var at int64 // 0: no round yet
	if !m.At.IsZero() {
		at = max(m.At.UnixMilli(), 1)
	}
	b = binary.AppendUvarint(b, uint64(at))
	b = binary.AppendUvarint(b, uint64(max(m.Interval.Milliseconds(), 0)))
	b = binary.AppendUvarint(b, uint64(len(table)))
	for _, s := range table {
		b = appendString(b, s)
	}
	b = binary.AppendUvarint(b, uint64(len(m.Jobs)))
	for i, j := range m.Jobs {
		b = binary.AppendUvarint(b, jobs[i].job)
		b = binary.AppendUvarint(b, jobs[i].tenant)
		b = binary.AppendUvarint(b, uint64(max(j.Workers, 0)))
		b = binary.AppendUvarint(b, uint64(max(j.Failed, 0)))
		b = binary.AppendUvarint(b, jobs[i].problem)
		b = binary.AppendUvarint(b, uint64(len(j.Series)))
		for k, s := range j.Series {
			b = binary.AppendUvarint(b, series[i][k].name)
			b = binary.AppendUvarint(b, series[i][k].labels)
			var flags byte
			if s.Counter {
				flags |= wireCounter
			}
			b = append(b, flags)
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(s.Sum))
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(s.Min))
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(s.Max))
			b = binary.AppendUvarint(b, uint64(max(s.N, 0)))
			if s.Counter {
				b = binary.LittleEndian.AppendUint64(b, math.Float64bits(s.Total))
			}
		}
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// wireReader reads the binary form, remembering the first error.
type wireReader struct {
	b   []byte
	err error
}

func (r *wireReader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrMetricsWire, what)
	}
}

func (r *wireReader) uvarint(what string, limit uint64) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(what + ": truncated")
		return 0
	}
	r.b = r.b[n:]
	if v > limit {
		r.fail(fmt.Sprintf("%s: %d over %d", what, v, limit))
		return 0
	}
	return v
}

func (r *wireReader) float(what string) float64 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 8 {
		r.fail(what + ": truncated")
		return 0
	}
	v := math.Float64frombits(binary.LittleEndian.Uint64(r.b))
	r.b = r.b[8:]
	if math.IsNaN(v) || math.IsInf(v, 0) {
		r.fail(what + ": not a finite number")
		return 0
	}
	return v
}

func (r *wireReader) string(what string) string {
	n := r.uvarint(what, maxWireString)
	if r.err != nil {
		return ""
	}
	if uint64(len(r.b)) < n {
		r.fail(what + ": truncated")
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// UnmarshalNodeMetrics decodes the binary form, refusing what MarshalNodeMetrics would not
// write and anything over the decoder's bounds.
func UnmarshalNodeMetrics(b []byte) (NodeMetrics, error) {
	var m NodeMetrics
	if len(b) > MaxNodeMetricsBytes {
		return m, fmt.Errorf("%w: %d bytes, over %d", ErrMetricsWire, len(b), MaxNodeMetricsBytes)
	}
	if len(b) < len(nodeMetricsMagic) || string(b[:len(nodeMetricsMagic)]) != nodeMetricsMagic {
		return m, fmt.Errorf("%w: not the node metrics form (an agent of another version?)", ErrMetricsWire)
	}
	r := &wireReader{b: b[len(nodeMetricsMagic):]}
	m.Node = r.string("node")
	if at := int64(r.uvarint("time", math.MaxInt64)); at > 0 {
		m.At = time.UnixMilli(at).UTC()
	}
	m.Interval = time.Duration(r.uvarint("interval", uint64(24*time.Hour/time.Millisecond))) * time.Millisecond
	nstr := r.uvarint("strings", maxWireStrings)
	table := make([]string, 0, min(nstr, uint64(len(r.b))))
	for i := uint64(0); i < nstr && r.err == nil; i++ {
		table = append(table, r.string("string"))
	}
	ref := func(what string) string {
		i := r.uvarint(what, uint64(len(table)))
		if r.err != nil {
			return ""
		}
		if i >= uint64(len(table)) {
			r.fail(what + ": no such string")
			return ""
		}
		return table[i]
	}
	njobs := r.uvarint("jobs", maxWireJobs)
	total := 0
	m.Jobs = make([]NodeJobMetrics, 0, min(njobs, uint64(len(r.b))))
	for i := uint64(0); i < njobs && r.err == nil; i++ {
		j := NodeJobMetrics{Job: ref("job"), Tenant: ref("tenant")}
		j.Workers = int(r.uvarint("workers", math.MaxInt32))
		j.Failed = int(r.uvarint("failed", math.MaxInt32))
		j.Problem = ref("problem")
		ns := r.uvarint("series", maxWireSeries)
		total += int(ns)
		if total > maxWireSeries {
			r.fail("too many series")
			break
		}
		j.Series = make([]SeriesSample, 0, min(ns, uint64(len(r.b))/8))
		for k := uint64(0); k < ns && r.err == nil; k++ {
			s := SeriesSample{Name: ref("name"), Labels: ref("labels")}
			if len(r.b) < 1 {
				r.fail("flags: truncated")
				break
			}
			flags := r.b[0]
			r.b = r.b[1:]
			if flags&^wireCounter != 0 {
				r.fail("flags: unknown bits")
				break
			}
			s.Counter = flags&wireCounter != 0
			s.Sum, s.Min, s.Max = r.float("sum"), r.float("min"), r.float("max")
			s.N = int(r.uvarint("n", math.MaxInt32))
			if s.Counter {
				s.Total = r.float("total")
			}
			j.Series = append(j.Series, s)
		}
		m.Jobs = append(m.Jobs, j)
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail(fmt.Sprintf("%d bytes after the end", len(r.b)))
	}
	if r.err != nil {
		return NodeMetrics{}, r.err
	}
	return m, nil
}
