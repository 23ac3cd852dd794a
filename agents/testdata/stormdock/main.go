// Command stormdock is a stand-in for the stormdock binary in the agent's tests, built
// without the race detector so that workers start fast: `launch` is the real lease launcher,
// `helper` a test worker.
//
// The helper writes one report per start into HELPER_DIR (<key>.<pid>.json, key being
// job[.link].worker) and a <key>.<pid>.term file when it drains on SIGTERM. HELPER_MODE: "run"
// (default) waits for SIGTERM and exits 0; "crash" exits 3 (or HELPER_EXIT_CODE) after
// HELPER_CRASH_AFTER;
// "ignore-term" ignores SIGTERM. On SIGHUP it copies its live configuration (STORMDOCK_CONFIG)
// to <key>.<pid>.hup.<n>, n counting the signals from 1. With HELPER_SECRET set it copies that
// secret's file (STORMDOCK_SECRETS_DIR/HELPER_SECRET), as it reads it, to <key>.<pid>.secret.<n>,
// n being 0 at start and then each SIGHUP's. Given STORMDOCK_METRICS_PORT, it serves helper_up
// (1) and helper_ticks_total (its seconds alive) there.
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/stormdock/stormdock/agents/launcher"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: stormdock launch|helper ...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case launcher.Command:
		os.Exit(launcher.Main(os.Args[2:], os.Stderr))
	case "helper":
		helper()
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		os.Exit(2)
	}
}

type report struct {
	PID  int               `json:"pid"`
	PPID int               `json:"ppid"`
	Env  map[string]string `json:"env"`
	At   time.Time         `json:"at"`
}

func helper() {
	sigs := make(chan os.Signal, 1)
	mode := os.Getenv("HELPER_MODE")
	if mode == "ignore-term" {
		signal.Ignore(syscall.SIGTERM)
	} else {
		signal.Notify(sigs, syscall.SIGTERM)
	}
	env := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "STORMDOCK_") {
			env[k] = v
		}
	}
	key := env["STORMDOCK_JOB"]
	if l := env["STORMDOCK_LINK"]; l != "" {
		key += "." + l
	}
	key += "." + env["STORMDOCK_WORKER"]
	base := filepath.Join(os.Getenv("HELPER_DIR"), key+"."+strconv.Itoa(os.Getpid()))
	// SIGHUP is caught before the report is written: a test that waits for the report and
	// then changes the live configuration must not have its signal ignored (the launcher
	// starts workers with SIGHUP ignored until they ask for it).
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	fmt.Printf("helper pid %d\n", os.Getpid()) // the worker's log: agents serve it
	b, _ := json.Marshal(report{PID: os.Getpid(), PPID: os.Getppid(), Env: env, At: time.Now()})
	if err := os.WriteFile(base+".json.tmp", b, 0o644); err == nil {
		_ = os.Rename(base+".json.tmp", base+".json")
	}
	copySecret := func(n int) {
		name := os.Getenv("HELPER_SECRET")
		if name == "" {
			return
		}
		b, err := os.ReadFile(filepath.Join(os.Getenv("STORMDOCK_SECRETS_DIR"), name))
		if err != nil {
			b = []byte("error: " + err.Error())
		}
		p := fmt.Sprintf("%s.secret.%d", base, n)
		if err := os.WriteFile(p+".tmp", b, 0o644); err == nil {
			_ = os.Rename(p+".tmp", p)
		}
	}
	copySecret(0)
	if port := os.Getenv("STORMDOCK_METRICS_PORT"); port != "" {
		start := time.Now()
		if ln, err := net.Listen("tcp", net.JoinHostPort(os.Getenv("STORMDOCK_ADDR"), port)); err == nil {
			go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { //nolint:errcheck // for the process's life
				fmt.Fprintf(w, "# TYPE helper_up gauge\nhelper_up 1\n# TYPE helper_ticks_total counter\nhelper_ticks_total %d\n", int(time.Since(start).Seconds()))
			}))
		}
	}
	go func() {
		for n := 1; ; n++ {
			<-hups
			b, _ := os.ReadFile(os.Getenv("STORMDOCK_CONFIG"))
			p := fmt.Sprintf("%s.hup.%d", base, n)
			if err := os.WriteFile(p+".tmp", b, 0o644); err == nil {
				_ = os.Rename(p+".tmp", p)
			}
			copySecret(n)
		}
	}()
	if mode == "crash" {
		d, _ := time.ParseDuration(os.Getenv("HELPER_CRASH_AFTER"))
		time.Sleep(d)
		code := 3
		if c, err := strconv.Atoi(os.Getenv("HELPER_EXIT_CODE")); err == nil {
			code = c
		}
		os.Exit(code)
	}
	if mode == "ignore-term" {
		for {
			time.Sleep(time.Hour) // until SIGKILL
		}
	}
	<-sigs
	_ = os.WriteFile(base+".term", nil, 0o644)
	os.Exit(0)
}
