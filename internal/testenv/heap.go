package testenv

import "runtime"

// LiveHeap is the bytes in live heap objects after a collection: what a test compares before
// and after to see what code keeps, rather than what it allocated and dropped.
func LiveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
