package healthcheck

import "fmt"

// PSI is the memory line of Linux pressure stall information (/proc/pressure/memory, or a v2
// cgroup's memory.pressure): the share of wall time, in percent, in which some (or all)
// non-idle tasks were stalled waiting for memory.
type PSI struct {
	SomeAvg10, SomeAvg60, SomeAvg300 float64
	// SomeTotal is the total stall time in microseconds.
	SomeTotal                        uint64
	FullAvg10, FullAvg60, FullAvg300 float64
	FullTotal                        uint64
}

// ParsePSI reads the "some" and "full" lines of a pressure file. A file with only a "some"
// line (the cpu file of older kernels) is accepted.
func ParsePSI(data []byte) (PSI, error) {
	var p PSI
	var some bool
	for len(data) > 0 {
		var line []byte
		line, data = nextLine(data)
		kind, rest := nextField(line)
		var avg10, avg60, avg300 *float64
		var total *uint64
		switch string(kind) {
		case "some":
			avg10, avg60, avg300, total = &p.SomeAvg10, &p.SomeAvg60, &p.SomeAvg300, &p.SomeTotal
			some = true
		case "full":
			avg10, avg60, avg300, total = &p.FullAvg10, &p.FullAvg60, &p.FullAvg300, &p.FullTotal
		case "":
			continue
		default:
			return PSI{}, fmt.Errorf("psi: unknown line %q", line)
		}
		for {
			var f []byte
			f, rest = nextField(rest)
			if len(f) == 0 {
				break
			}
			var key, val []byte
			for i, c := range f {
				if c == '=' {
					key, val = f[:i], f[i+1:]
					break
				}
			}
			var ok bool
			switch string(key) {
			case "avg10":
				*avg10, ok = parseDecimal(val)
			case "avg60":
				*avg60, ok = parseDecimal(val)
			case "avg300":
				*avg300, ok = parseDecimal(val)
			case "total":
				*total, ok = parseUint(val)
			default:
				ok = true // a field added by a later kernel
			}
			if !ok {
				return PSI{}, fmt.Errorf("psi: bad field %q", f)
			}
		}
	}
	if !some {
		return PSI{}, fmt.Errorf("psi: no \"some\" line")
	}
	return p, nil
}
