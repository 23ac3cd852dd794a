// Command cgoshim is the shim linked with cgo, hence dynamically, as the stormdock binary is
// when built with cgo: the dynamic loader runs, as the driver's user, before the shim's first
// instruction, and reads the shim's environment (LD_PRELOAD). The process driver's tests start
// workers with it to show that a worker's environment never reaches that loader.
package main

// #include <unistd.h>
import "C"

import (
	"os"

	"github.com/stormdock/stormdock/isolation/shim"
)

func main() {
	_ = C.getpid() // linked with libc
	shim.Run()
	os.Exit(2)
}
