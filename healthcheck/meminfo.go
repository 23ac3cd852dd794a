package healthcheck

import (
	"errors"
	"fmt"
)

// NodeMemory is the machine's memory as /proc/meminfo reports it, in bytes.
type NodeMemory struct {
	Total uint64
	// Available is MemAvailable: what can be given to new work without swapping, page cache
	// that can be dropped included. Kernels before 3.14 lack it; MemFree+Buffers+Cached
	// stands in for it there.
	Available uint64
}

// UsedFraction is the share of memory not available, in [0, 1].
func (m NodeMemory) UsedFraction() float64 {
	if m.Total == 0 {
		return 0
	}
	if m.Available >= m.Total {
		return 0
	}
	return float64(m.Total-m.Available) / float64(m.Total)
}

var errNoMemTotal = errors.New("no MemTotal line")

// ParseMeminfo reads MemTotal and MemAvailable from the contents of /proc/meminfo.
func ParseMeminfo(data []byte) (NodeMemory, error) {
	var m NodeMemory
	var free, buffers, cached uint64
	var haveAvail bool
	for len(data) > 0 {
		var line []byte
		line, data = nextLine(data)
		key, rest := nextField(line)
		if len(key) < 2 || key[len(key)-1] != ':' {
			continue
		}
		var dst *uint64
		switch string(key[:len(key)-1]) {
		case "MemTotal":
			dst = &m.Total
		case "MemAvailable":
			dst, haveAvail = &m.Available, true
		case "MemFree":
			dst = &free
		case "Buffers":
			dst = &buffers
		case "Cached":
			dst = &cached
		default:
			continue
		}
		num, rest := nextField(rest)
		unit, _ := nextField(rest)
		v, ok := parseUint(num)
		if !ok {
			return NodeMemory{}, fmt.Errorf("meminfo: bad value in %q", line)
		}
		switch string(unit) {
		case "kB":
			if v > 1<<54 {
				return NodeMemory{}, fmt.Errorf("meminfo: value out of range in %q", line)
			}
			v *= 1024
		case "":
		default:
			return NodeMemory{}, fmt.Errorf("meminfo: unknown unit in %q", line)
		}
		*dst = v
	}
	if m.Total == 0 {
		return NodeMemory{}, fmt.Errorf("meminfo: %w", errNoMemTotal)
	}
	if !haveAvail {
		m.Available = free + buffers + cached
	}
	m.Available = min(m.Available, m.Total)
	return m, nil
}

// LoadAvg is /proc/loadavg's three averages of runnable and uninterruptible tasks.
type LoadAvg struct {
	Load1, Load5, Load15 float64
}

// ParseLoadavg reads the first three fields of /proc/loadavg.
func ParseLoadavg(data []byte) (LoadAvg, error) {
	var l LoadAvg
	rest := data
	for _, dst := range []*float64{&l.Load1, &l.Load5, &l.Load15} {
		var f []byte
		f, rest = nextField(rest)
		v, ok := parseDecimal(f)
		if !ok {
			return LoadAvg{}, fmt.Errorf("loadavg: bad field %q", f)
		}
		*dst = v
	}
	return l, nil
}
