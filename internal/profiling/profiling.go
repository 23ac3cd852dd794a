// Package profiling serves a stormdock process's Go profiles (net/http/pprof) and its
// runtime's metrics (runtime/metrics) to the operator; the caller guards it with the admin token.
package profiling

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/pprof"
	"runtime"
	"runtime/metrics"
	"strconv"
	"time"
)

// Prefix is where the handler serves: Prefix+"pprof/" (the index, heap, profile, goroutine,
// allocs, ...) and Prefix+"runtime" (the runtime's metrics as JSON).
const Prefix = "/debug/"

// maxSeconds bounds a cpu profile or a trace: the write deadline is extended to match.
const maxSeconds = 300

// Handler serves the profiles and the runtime's metrics under Prefix. It checks no token:
// the master mounts it behind its admin role, an agent behind its admin-only guard.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Prefix+"pprof/", pprof.Index)
	mux.HandleFunc("GET "+Prefix+"pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET "+Prefix+"pprof/profile", timed(pprof.Profile))
	mux.HandleFunc("GET "+Prefix+"pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET "+Prefix+"pprof/trace", timed(pprof.Trace))
	mux.HandleFunc("GET "+Prefix+"runtime", serveRuntime)
	return mux
}

// timed lets a cpu profile or a trace of ?seconds=N run past the server's write timeout
// (api.WriteTimeout), which pprof would otherwise refuse, up to maxSeconds.
func timed(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		secs := 30.0 // pprof's default
		if v := r.URL.Query().Get("seconds"); v != "" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 || f > maxSeconds {
				http.Error(w, "seconds="+strconv.Quote(v)+": want a number of seconds from 1 to "+strconv.Itoa(maxSeconds), http.StatusBadRequest)
				return
			}
			secs = f
		}
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(time.Duration(secs*float64(time.Second)) + 30*time.Second))
		// pprof compares seconds with the server's WriteTimeout, found in the request's
		// context: the deadline above replaces it for this answer.
		h(w, r.WithContext(context.WithValue(r.Context(), http.ServerContextKey, nil)))
	}
}

// Sample is one runtime metric: a number, or a histogram's count and quantiles.
type Sample struct {
	Name  string   `json:"name"`
	Value *float64 `json:"value,omitempty"`
	// Count, P50 and P99 summarize a histogram (pause times, scheduling latencies).
	Count *uint64  `json:"count,omitempty"`
	P50   *float64 `json:"p50,omitempty"`
	P99   *float64 `json:"p99,omitempty"`
}

// Runtime is what /debug/runtime answers.
type Runtime struct {
	GOMAXPROCS int      `json:"gomaxprocs"`
	NumCPU     int      `json:"numCPU"`
	Goroutines int      `json:"goroutines"`
	Metrics    []Sample `json:"metrics"`
}

func serveRuntime(w http.ResponseWriter, _ *http.Request) {
	descs := metrics.All()
	samples := make([]metrics.Sample, len(descs))
	for i, d := range descs {
		samples[i].Name = d.Name
	}
	metrics.Read(samples)
	out := Runtime{GOMAXPROCS: runtime.GOMAXPROCS(0), NumCPU: runtime.NumCPU(), Goroutines: runtime.NumGoroutine()}
	for _, s := range samples {
		o := Sample{Name: s.Name}
		switch s.Value.Kind() {
		case metrics.KindUint64:
			v := float64(s.Value.Uint64())
			o.Value = &v
		case metrics.KindFloat64:
			v := s.Value.Float64()
			o.Value = &v
		case metrics.KindFloat64Histogram:
			h := s.Value.Float64Histogram()
			var n uint64
			for _, c := range h.Counts {
				n += c
			}
			o.Count = &n
			if n > 0 {
				p50, p99 := quantile(h, 0.5), quantile(h, 0.99)
				o.P50, o.P99 = &p50, &p99
			}
		default:
			continue
		}
		out.Metrics = append(out.Metrics, o)
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
}

// quantile is the upper bound of the bucket holding the q-th of h's samples (a finite one:
// the lower bound for the last, unbounded bucket).
func quantile(h *metrics.Float64Histogram, q float64) float64 {
	var n uint64
	for _, c := range h.Counts {
		n += c
	}
	want := uint64(math.Ceil(q * float64(n)))
	var seen uint64
	for i, c := range h.Counts {
		seen += c
		if seen >= want && c > 0 {
			if hi := h.Buckets[i+1]; !math.IsInf(hi, 1) {
				return hi
			}
			return h.Buckets[i]
		}
	}
	return 0
}
