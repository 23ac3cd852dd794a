// Command alloc is a test worker that allocates memory in steps and holds it: STEP MiB
// every EVERY until MAX MiB, touching every page so that it counts, then sleeps until
// SIGTERM.
package main

import (
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	step, _ := strconv.Atoi(os.Args[1])
	every, _ := time.ParseDuration(os.Args[2])
	limit, _ := strconv.Atoi(os.Args[3])
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	var held [][]byte
	tick := time.NewTicker(every)
	for {
		select {
		case <-term:
			os.Exit(0)
		case <-tick.C:
			if len(held)*step >= limit {
				continue
			}
			b := make([]byte, step<<20)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			held = append(held, b)
		}
	}
}
