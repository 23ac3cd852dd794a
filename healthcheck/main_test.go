package healthcheck

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// allocEnv makes the test binary, re-executed, act as a worker that allocates memory on
// command: the real-pressure tests need a process whose memory they control to the MiB.
const allocEnv = "STORMDOCK_HC_ALLOCATOR"

func TestMain(m *testing.M) {
	if os.Getenv(allocEnv) == "1" {
		if err := runAllocator(); err != nil {
			fmt.Fprintln(os.Stderr, "allocator:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runAllocator reads commands from stdin and answers "ok <MiB held>" on stdout:
//
//	set N       hold exactly N MiB
//	grow N R    grow to N MiB at R MiB/s
//
// Memory comes from anonymous mmap with MAP_POPULATE: the kernel faults every page in (and
// charges it to the cgroup) inside the system call, and munmap gives it back at once. No Go
// code touches the pages, so neither the garbage collector nor the race detector's shadow
// memory blurs the figures.
func runAllocator() error {
	var chunks [][]byte
	alloc := func() error {
		b, err := syscall.Mmap(-1, 0, 1<<20, syscall.PROT_READ|syscall.PROT_WRITE,
			syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_POPULATE)
		if err != nil {
			return err
		}
		chunks = append(chunks, b)
		return nil
	}
	free := func() error {
		last := chunks[len(chunks)-1]
		chunks = chunks[:len(chunks)-1]
		return syscall.Munmap(last)
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) < 2 {
			return fmt.Errorf("bad command %q", in.Text())
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			return err
		}
		var pause time.Duration
		if f[0] == "grow" && len(f) == 3 {
			rate, err := strconv.Atoi(f[2])
			if err != nil || rate <= 0 {
				return fmt.Errorf("bad rate in %q", in.Text())
			}
			pause = time.Second / time.Duration(rate)
		}
		for len(chunks) < n {
			if err := alloc(); err != nil {
				return err
			}
			time.Sleep(pause) // the pace of the growth under test: R MiB/s
		}
		for len(chunks) > n {
			if err := free(); err != nil {
				return err
			}
		}
		fmt.Println("ok", len(chunks))
	}
	return in.Err()
}
