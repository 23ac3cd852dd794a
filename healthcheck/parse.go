package healthcheck

// The parsers work on []byte without allocating: the agent probes several times a second and
// a probe should cost microseconds, not garbage.

// nextLine splits b at the first newline.
func nextLine(b []byte) (line, rest []byte) {
	for i, c := range b {
		if c == '\n' {
			return b[:i], b[i+1:]
		}
	}
	return b, nil
}

// trimSpace trims ASCII blanks at both ends.
func trimSpace(b []byte) []byte {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// nextField returns the first blank-separated field of b and what follows it.
func nextField(b []byte) (field, rest []byte) {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	i := 0
	for i < len(b) && !isSpace(b[i]) {
		i++
	}
	return b[:i], b[i:]
}

// parseUint reads a decimal unsigned integer that fills all of b.
func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (1<<64-1-d)/10 {
			return 0, false // overflow
		}
		n = n*10 + d
	}
	return n, true
}

// parseDecimal reads a non-negative decimal such as "12.34" or "7" that fills all of b. The
// kernel prints PSI averages and load averages with exactly this shape ("%lu.%02lu").
func parseDecimal(b []byte) (float64, bool) {
	intPart, frac := b, []byte(nil)
	for i, c := range b {
		if c == '.' {
			intPart, frac = b[:i], b[i+1:]
			if len(frac) == 0 {
				return 0, false
			}
			break
		}
	}
	n, ok := parseUint(intPart)
	if !ok {
		return 0, false
	}
	v := float64(n)
	if len(frac) > 0 {
		if len(frac) > 9 {
			frac = frac[:9] // more digits than a float64 needs here; validate them below
			for _, c := range b[len(intPart)+1+9:] {
				if c < '0' || c > '9' {
					return 0, false
				}
			}
		}
		f, ok := parseUint(frac)
		if !ok {
			return 0, false
		}
		scale := 1.0
		for range frac {
			scale *= 10
		}
		v += float64(f) / scale
	}
	return v, true
}

// keyValue looks up key in "key value" lines (memory.stat, memory.oom_control) and parses the
// value as an unsigned integer.
func keyValue(data []byte, key string) (uint64, bool) {
	for len(data) > 0 {
		var line []byte
		line, data = nextLine(data)
		k, rest := nextField(line)
		if string(k) != key { // no allocation: the compiler compares in place
			continue
		}
		v, _ := nextField(rest)
		return parseUint(v)
	}
	return 0, false
}
