package coord

import (
	"context"
	"sync"
)

// goroutines counts a client's background goroutines so that Close can wait for them, and
// refuses new ones once Close began: a WaitGroup must not grow while it is waited on, and a
// watch may be asked for at any moment, Close included.
type goroutines struct {
	mu   sync.Mutex
	shut bool
	wg   sync.WaitGroup
}

// start returns a context cancelled by ctx or life, and the function the goroutine calls
// when it ends; after shutdown the context is already cancelled.
func (g *goroutines) start(ctx, life context.Context) (context.Context, func()) {
	g.mu.Lock()
	if g.shut {
		g.mu.Unlock()
		c, cancel := context.WithCancel(ctx)
		cancel()
		return c, func() {}
	}
	g.wg.Add(1)
	g.mu.Unlock()
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(life, cancel)
	return wctx, func() {
		stop()
		cancel()
		g.wg.Done()
	}
}

// shutdown refuses new goroutines and waits for the running ones.
func (g *goroutines) shutdown() {
	g.mu.Lock()
	g.shut = true
	g.mu.Unlock()
	g.wg.Wait()
}
