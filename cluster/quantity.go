package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Bytes is an amount of memory. It is written as people write it ("256Mi", "2Gi", "1G",
// "1048576") and read back in the same forms.
type Bytes int64

// binary and decimal suffixes, longest first so "Mi" wins over "M".
var byteSuffixes = []struct {
	suffix string
	mult   int64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"Pi", 1 << 50},
	{"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15},
}

// ParseBytes reads a memory quantity: a whole or decimal number with an optional suffix
// (Ki, Mi, Gi, Ti, Pi, or k, M, G, T, P). It refuses negatives and values past int64.
func ParseBytes(s string) (Bytes, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, errors.New("empty memory quantity (write it like 256Mi or 2Gi)")
	}
	mult := int64(1)
	num := t
	for _, bs := range byteSuffixes {
		if strings.HasSuffix(t, bs.suffix) {
			mult, num = bs.mult, strings.TrimSuffix(t, bs.suffix)
			break
		}
	}
	if strings.HasSuffix(num, "B") || strings.HasSuffix(num, "i") {
		return 0, fmt.Errorf("memory quantity %q: unknown unit (use Ki, Mi, Gi, Ti or k, M, G, T)", s)
	}
	if i, err := strconv.ParseInt(num, 10, 64); err == nil {
		if i < 0 {
			return 0, fmt.Errorf("memory quantity %q: must not be negative", s)
		}
		if i > math.MaxInt64/mult {
			return 0, fmt.Errorf("memory quantity %q: too large", s)
		}
		return Bytes(i * mult), nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || strings.ContainsAny(num, "xXpP_") {
		return 0, fmt.Errorf("memory quantity %q: not a number with an optional unit (like 256Mi or 2Gi)", s)
	}
	if f < 0 {
		return 0, fmt.Errorf("memory quantity %q: must not be negative", s)
	}
	v := f * float64(mult)
	if v >= math.MaxInt64 {
		return 0, fmt.Errorf("memory quantity %q: too large", s)
	}
	return Bytes(math.Round(v)), nil
}

// String writes the quantity in the largest binary unit that divides it exactly.
func (b Bytes) String() string {
	v := int64(b)
	if v == 0 {
		return "0"
	}
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"Pi", 1 << 50}, {"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if v%u.mult == 0 {
			return strconv.FormatInt(v/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(v, 10)
}

// MarshalJSON writes the quantity as a string like "256Mi".
func (b Bytes) MarshalJSON() ([]byte, error) { return json.Marshal(b.String()) }

// UnmarshalJSON accepts a quantity string or a plain number of bytes.
func (b *Bytes) UnmarshalJSON(data []byte) error {
	var s string
	if len(data) > 0 && data[0] == '"' {
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
	} else {
		s = string(data)
	}
	v, err := ParseBytes(s)
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// MarshalYAML writes the quantity as a string like "256Mi".
func (b Bytes) MarshalYAML() (any, error) { return b.String(), nil }

// UnmarshalYAML accepts a quantity string or a plain number of bytes.
func (b *Bytes) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return posError(n, "memory must be a quantity like 256Mi")
	}
	v, err := ParseBytes(n.Value)
	if err != nil {
		return posError(n, err.Error())
	}
	*b = v
	return nil
}

// CPU is an amount of processor time in thousandths of a core. It is written as cores
// (0.5, 2) and also read from Kubernetes-style millicores ("500m").
type CPU int64

// ParseCPU reads cores ("0.5", "2") or millicores ("500m").
func ParseCPU(s string) (CPU, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, errors.New("empty cpu quantity (write cores like 0.5 or 2)")
	}
	if m, ok := strings.CutSuffix(t, "m"); ok {
		i, err := strconv.ParseInt(m, 10, 64)
		if err != nil || i < 0 {
			return 0, fmt.Errorf("cpu quantity %q: millicores must be a whole non-negative number", s)
		}
		return CPU(i), nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || strings.ContainsAny(t, "xXpP_") {
		return 0, fmt.Errorf("cpu quantity %q: not a number of cores (like 0.5 or 2)", s)
	}
	if f < 0 {
		return 0, fmt.Errorf("cpu quantity %q: must not be negative", s)
	}
	if f*1000 >= math.MaxInt64 {
		return 0, fmt.Errorf("cpu quantity %q: too large", s)
	}
	return CPU(math.Round(f * 1000)), nil
}

// Cores returns the amount as a number of cores.
func (c CPU) Cores() float64 { return float64(c) / 1000 }

// String writes cores with at most three decimals ("0.5", "2").
func (c CPU) String() string { return strconv.FormatFloat(c.Cores(), 'f', -1, 64) }

// MarshalJSON writes cores as a JSON number.
func (c CPU) MarshalJSON() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalJSON accepts a number of cores or a string of cores or millicores.
func (c *CPU) UnmarshalJSON(data []byte) error {
	s := string(data)
	if len(data) > 0 && data[0] == '"' {
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
	}
	v, err := ParseCPU(s)
	if err != nil {
		return err
	}
	*c = v
	return nil
}

// MarshalYAML writes cores as a number.
func (c CPU) MarshalYAML() (any, error) { return c.Cores(), nil }

// UnmarshalYAML accepts a number of cores or a string of cores or millicores.
func (c *CPU) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return posError(n, "cpu must be a number of cores like 0.5")
	}
	v, err := ParseCPU(n.Value)
	if err != nil {
		return posError(n, err.Error())
	}
	*c = v
	return nil
}
