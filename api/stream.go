package api

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// StreamWriter writes a long answer (a log followed, events followed) and flushes every
// write. The server's write timeout (NewServer) would cut a quiet stream: the deadline
// is pushed forward, by WriteTimeout, every third of it, except while one write has been
// blocked for longer than that, so that a client that stops reading is still cut off.
type StreamWriter struct {
	w    http.ResponseWriter
	rc   *http.ResponseController
	busy atomic.Int64 // unix nanoseconds since a write is in progress; 0: none
	done chan struct{}
	wg   sync.WaitGroup
}

// NewStreamWriter starts a stream on w; the handler must call Stop when it is done.
func NewStreamWriter(w http.ResponseWriter) *StreamWriter {
	sw := &StreamWriter{w: w, rc: http.NewResponseController(w), done: make(chan struct{})}
	_ = sw.rc.SetWriteDeadline(time.Now().Add(WriteTimeout))
	sw.wg.Add(1)
	go func() {
		defer sw.wg.Done()
		t := time.NewTicker(WriteTimeout / 3)
		defer t.Stop()
		for {
			select {
			case <-sw.done:
				return
			case now := <-t.C:
				if b := sw.busy.Load(); b == 0 || now.Sub(time.Unix(0, b)) < WriteTimeout {
					_ = sw.rc.SetWriteDeadline(now.Add(WriteTimeout))
				}
			}
		}
	}()
	return sw
}

// Write writes b and flushes it.
func (sw *StreamWriter) Write(b []byte) error {
	sw.busy.Store(time.Now().UnixNano())
	defer sw.busy.Store(0)
	if _, err := sw.w.Write(b); err != nil {
		return err
	}
	return sw.rc.Flush()
}

// Stop ends the deadline's extensions; call it when the answer is done.
func (sw *StreamWriter) Stop() {
	close(sw.done)
	sw.wg.Wait()
}
