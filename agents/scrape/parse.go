// Package scrape reads workers' Prometheus text within bounds (time, bytes, series, label
// sizes) and adds a node's workers up per job: what an agent tells the masters of its jobs.
package scrape

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/stormdock/stormdock/api"
)

// A worker's bytes are hostile: it may answer slowly, without end, with megabytes, with
// thousands of series or label values a kilobyte long, with NaN, or with text that is not
// the exposition format at all. None of that may cost its agent or the masters more than a
// fixed amount, nor fail anything but that worker's own scrape (reported, not fatal).

// Limits bound what one worker's scrape may cost.
type Limits struct {
	// MaxBytes bounds the body; a longer one fails the scrape. Default DefaultMaxBytes.
	MaxBytes int64
	// MaxSeries bounds the series kept of one worker (after those dropped by name): the
	// first ones by name are kept, the rest dropped and reported. Default DefaultMaxSeries.
	MaxSeries int
	// MaxLabels bounds a series' labels, MaxNameBytes its name, MaxLabelBytes each label's
	// name and value: a series over them is dropped, not cut (cutting could merge two).
	MaxLabels     int
	MaxNameBytes  int
	MaxLabelBytes int
}

// Defaults of Limits.
const (
	DefaultMaxBytes      = 256 << 10
	DefaultMaxSeries     = 100
	DefaultMaxLabels     = 8
	DefaultMaxNameBytes  = 128
	DefaultMaxLabelBytes = 128
)

func (l *Limits) defaults() {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxSeries <= 0 {
		l.MaxSeries = DefaultMaxSeries
	}
	if l.MaxLabels <= 0 {
		l.MaxLabels = DefaultMaxLabels
	}
	if l.MaxNameBytes <= 0 {
		l.MaxNameBytes = DefaultMaxNameBytes
	}
	if l.MaxLabelBytes <= 0 {
		l.MaxLabelBytes = DefaultMaxLabelBytes
	}
}

// Sample is one series of one worker at one scrape.
type Sample struct {
	Name    string
	Labels  string // api.SeriesSample.Labels
	Counter bool
	Value   float64
}

// ID is the sample's series: name and labels.
func (s Sample) ID() string { return api.SeriesID(s.Name, s.Labels) }

// ignoredPrefixes name the series client libraries serve on their own (the Go runtime's,
// the process's, the handler's): the agent measures cpu and memory itself, and keeping
// them would spend every job's series on the same thirty figures. Dropped without a report.
var ignoredPrefixes = []string{"go_", "process_", "promhttp_"}

// Reserved reports whether a worker's series name is one stormdock measures itself.
func Reserved(name string) bool {
	return slices.Contains(api.BuiltinSeries, name)
}

// ErrTooLarge: the body is over Limits.MaxBytes.
var ErrTooLarge = errors.New("metrics body too large")

// Parse reads the exposition text format from r within lim (expfmt's parser, names checked
// as Prometheus checks them). It returns the series kept, sorted by id, and what it
// dropped, in one line ("" when nothing); an error means nothing of r can be trusted.
func Parse(r io.Reader, lim Limits) ([]Sample, string, error) {
	lim.defaults()
	lr := &limitedReader{r: r, left: lim.MaxBytes}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(lr)
	if lr.over {
		return nil, "", fmt.Errorf("%w: over %d bytes", ErrTooLarge, lim.MaxBytes)
	}
	if err != nil {
		return nil, "", fmt.Errorf("not the Prometheus text format: %s", clip(err.Error(), 200))
	}
	var d dropped
	seen := map[string]bool{}
	var out []Sample
	add := func(s Sample) {
		if math.IsNaN(s.Value) || math.IsInf(s.Value, 0) || (s.Counter && s.Value < 0) {
			d.note("non-finite or negative counter values", s.Name)
			return
		}
		if id := s.ID(); seen[id] {
			d.note("repeated series", s.Name)
			return
		} else {
			seen[id] = true
		}
		out = append(out, s)
	}
	for name, mf := range fams {
		if ignored(name) {
			continue
		}
		if Reserved(name) {
			d.note("names stormdock measures itself", name)
			continue
		}
		if len(name)+len("_count") > lim.MaxNameBytes {
			d.note("names over the size limit", clip(name, 40))
			continue
		}
		for _, m := range mf.GetMetric() {
			labels, ok := labelString(m.GetLabel(), lim)
			if !ok {
				d.note("label sets over the limits", name)
				continue
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				add(Sample{Name: name, Labels: labels, Counter: true, Value: m.GetCounter().GetValue()})
			case dto.MetricType_GAUGE:
				add(Sample{Name: name, Labels: labels, Value: m.GetGauge().GetValue()})
			case dto.MetricType_UNTYPED:
				add(Sample{Name: name, Labels: labels, Value: m.GetUntyped().GetValue()})
			case dto.MetricType_SUMMARY:
				s := m.GetSummary()
				add(Sample{Name: name + "_count", Labels: labels, Counter: true, Value: float64(s.GetSampleCount())})
				add(Sample{Name: name + "_sum", Labels: labels, Counter: true, Value: s.GetSampleSum()})
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				add(Sample{Name: name + "_count", Labels: labels, Counter: true, Value: float64(h.GetSampleCount())})
				add(Sample{Name: name + "_sum", Labels: labels, Counter: true, Value: h.GetSampleSum()})
			default:
				d.note("unsupported types", name)
			}
		}
	}
	slices.SortFunc(out, func(a, b Sample) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.Labels, b.Labels)
	})
	if len(out) > lim.MaxSeries {
		d.count += len(out) - lim.MaxSeries
		d.reasons = append(d.reasons, fmt.Sprintf("%d series over the limit of %d (kept the first by name)", len(out)-lim.MaxSeries, lim.MaxSeries))
		out = out[:lim.MaxSeries]
	}
	return out, d.String(), nil
}

func ignored(name string) bool {
	for _, p := range ignoredPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// labelString writes a label set sorted by name, in the exposition format's syntax, or
// false when it is over the limits.
func labelString(ls []*dto.LabelPair, lim Limits) (string, bool) {
	if len(ls) == 0 {
		return "", true
	}
	if len(ls) > lim.MaxLabels {
		return "", false
	}
	pairs := make([]*dto.LabelPair, 0, len(ls))
	for _, l := range ls {
		if len(l.GetName()) > lim.MaxLabelBytes || len(l.GetValue()) > lim.MaxLabelBytes {
			return "", false
		}
		if l.GetValue() == "" {
			continue // an empty label is no label, as Prometheus has it
		}
		pairs = append(pairs, l)
	}
	slices.SortFunc(pairs, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
	var sb strings.Builder
	for i, l := range pairs {
		if i > 0 {
			if pairs[i-1].GetName() == l.GetName() {
				return "", false // a label given twice
			}
			sb.WriteByte(',')
		}
		sb.WriteString(l.GetName())
		sb.WriteString(`="`)
		sb.WriteString(escapeLabel(l.GetValue()))
		sb.WriteByte('"')
	}
	return sb.String(), true
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)

func escapeLabel(v string) string { return labelEscaper.Replace(v) }

// dropped collects what a parse left out, for one line of report.
type dropped struct {
	count   int
	reasons []string
	kinds   map[string][]string
}

func (d *dropped) note(reason, name string) {
	d.count++
	if d.kinds == nil {
		d.kinds = map[string][]string{}
	}
	if _, ok := d.kinds[reason]; !ok {
		d.reasons = append(d.reasons, reason)
	}
	if len(d.kinds[reason]) < 3 && !slices.Contains(d.kinds[reason], name) {
		d.kinds[reason] = append(d.kinds[reason], name)
	}
}

func (d *dropped) String() string {
	if d.count == 0 {
		return ""
	}
	parts := make([]string, 0, len(d.reasons))
	for _, r := range d.reasons {
		if names := d.kinds[r]; len(names) > 0 {
			r += " (" + strings.Join(names, ", ") + ")"
		}
		parts = append(parts, r)
	}
	return clip("dropped "+strconv.Itoa(d.count)+" series: "+strings.Join(parts, "; "), 300)
}

// clip bounds a message built from a worker's bytes, and keeps it one printable line.
func clip(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "..."
}

// limitedReader reads at most left bytes and says whether there was more.
type limitedReader struct {
	r    io.Reader
	left int64
	over bool
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		// One byte more tells a body of exactly the limit from a longer one.
		var one [1]byte
		n, err := l.r.Read(one[:])
		if n > 0 {
			l.over = true
			return 0, ErrTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}
