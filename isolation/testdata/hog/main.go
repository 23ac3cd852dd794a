// Command hog is the worker program of the isolation tests: it misbehaves on request.
//
//	hog sleep                 print "ready" and sleep
//	hog alloc N [DELAY]       after DELAY, allocate N MiB 1 MiB at a time, touching every page
//	hog forkbomb              start copies of itself as fast as it can, forever
//	hog tree N M              start N children that each start M grandchildren, then sleep
//	hog term                  exit 0 on SIGTERM
//	hog hup                   exit 42 on SIGHUP
//	hog ignore-term           ignore SIGTERM
//	hog exit N                exit with status N
//	hog spew N                write N KiB of output, then sleep
//	hog tick MS               write "tick I" every MS milliseconds, to stdout and stderr by turns
package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: hog MODE [ARGS]")
		os.Exit(2)
	}
	arg := func(i int, def int) int {
		if len(os.Args) > i {
			n, err := strconv.Atoi(os.Args[i])
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			return n
		}
		return def
	}
	switch os.Args[1] {
	case "sleep":
		ready()
		sleep()
	case "alloc":
		n, delay := arg(2, 0), arg(3, 0)
		ready()
		time.Sleep(time.Duration(delay) * time.Millisecond)
		var keep [][]byte
		for i := 0; i < n; i++ {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = byte(j)
			}
			keep = append(keep, b)
			if i%16 == 0 {
				fmt.Printf("allocated %d MiB\n", i+1)
			}
		}
		fmt.Printf("allocated %d MiB in total\n", len(keep))
		sleep()
	case "forkbomb":
		// Stay alive at the limit: a Go program dies when it cannot create a thread, so keep
		// to the threads it has (one P, no GC, no goroutine blocked in wait4: the kernel
		// reaps children whose parent ignores SIGCHLD).
		runtime.GOMAXPROCS(1)
		debug.SetGCPercent(-1)
		signal.Ignore(syscall.SIGCHLD)
		ready()
		attr := &syscall.ProcAttr{Files: []uintptr{0, 1, 2}}
		for {
			_, _ = syscall.ForkExec("/proc/self/exe", []string{"hog", "forkbomb"}, attr)
			time.Sleep(time.Millisecond)
		}
	case "tree":
		n, m := arg(2, 2), arg(3, 2)
		for i := 0; i < n; i++ {
			c := exec.Command("/proc/self/exe", "tree", "0", "0")
			if m > 0 {
				c = exec.Command("/proc/self/exe", "tree", strconv.Itoa(m), "0")
			}
			c.Stdout, c.Stderr = os.Stdout, os.Stderr
			if err := c.Start(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
		// Children and grandchildren ignore SIGTERM: only the cgroup/container kill gets them.
		if n == 0 {
			signal.Ignore(syscall.SIGTERM)
		}
		ready()
		sleep()
	case "term":
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM)
		ready()
		<-c
		fmt.Println("got SIGTERM, draining")
		os.Exit(0)
	case "hup":
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGHUP)
		ready()
		<-c
		fmt.Println("got SIGHUP")
		os.Exit(42)
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		ready()
		sleep()
	case "exit":
		os.Exit(arg(2, 0))
	case "spew":
		// Numbered lines of 1 KiB: a test can tell whether any was lost.
		pad := strings.Repeat("x", 1024-9)
		for i := 0; i < arg(2, 0); i++ {
			fmt.Fprintf(os.Stdout, "%07d %s\n", i, pad)
		}
		ready()
		sleep()
	case "tick":
		every := time.Duration(arg(2, 100)) * time.Millisecond
		for i := 0; ; i++ {
			out := os.Stdout
			if i%2 == 1 {
				out = os.Stderr
			}
			fmt.Fprintf(out, "tick %d\n", i)
			time.Sleep(every)
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
}

// ready says the program has set itself up: on stdout, and (for tests that cannot read the
// output) by ignoring SIGUSR2, visible in /proc/PID/status as the SigIgn bit. SigCgt cannot
// serve: the Go runtime catches SIGTERM from its first instruction.
func ready() {
	signal.Ignore(syscall.SIGUSR2)
	fmt.Printf("ready pid=%d\n", os.Getpid())
}

func sleep() {
	for {
		time.Sleep(time.Hour)
	}
}
