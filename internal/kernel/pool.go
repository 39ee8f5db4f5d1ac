// Package kernel holds the pure-Go compute kernels of the CPU backend:
// matrix products with float32 or bfloat16 weights, norms, activations,
// softmax and top-k, run on a fixed pool of worker goroutines.
//
// Kernels work on flat row-major slices and never allocate; the caller
// owns every buffer.
package kernel

import (
	"runtime"
	"sync"
)

// Args carries a kernel's operands to the workers. One struct serves every
// kernel so that dispatch passes a value, not a closure, and allocates nothing.
type Args struct {
	Dst, X, Y, W []float32
	WB           []uint16 // bfloat16 weights
	M, N, K      int
	F            float32
	// Job carries a larger kernel's own argument struct (a pointer, so
	// storing it allocates nothing).
	Job any
}

type job struct {
	fn     func(a *Args, lo, hi int)
	a      *Args
	lo, hi int
}

// Pool runs kernels over a fixed set of goroutines; the calling goroutine
// takes the first share. A Pool serialises the kernels submitted to it.
type Pool struct {
	mu      sync.Mutex
	args    Args
	workers []chan job
	wg      sync.WaitGroup
	closed  bool
}

// NewPool starts a pool of n workers in all (the caller counts as one);
// n <= 0 means GOMAXPROCS.
func NewPool(n int) *Pool {
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	p := &Pool{workers: make([]chan job, n-1)}
	for i := range p.workers {
		ch := make(chan job)
		p.workers[i] = ch
		go func() {
			for j := range ch {
				j.fn(j.a, j.lo, j.hi)
				p.wg.Done()
			}
		}()
	}
	return p
}

// Size returns the number of goroutines a kernel runs on.
func (p *Pool) Size() int { return len(p.workers) + 1 }

// Close stops the workers. Kernels must not be run after Close.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		for _, ch := range p.workers {
			close(ch)
		}
	}
}

// Run calls fn(a, lo, hi) over disjoint ranges covering [0, n), each range
// a multiple of grain long (except the last), in parallel.
func (p *Pool) Run(fn func(a *Args, lo, hi int), a Args, n, grain int) {
	if grain < 1 {
		grain = 1
	}
	chunks := (n + grain - 1) / grain
	parts := min(p.Size(), chunks)
	// The operands always travel through p.args: taking the address of the
	// parameter would move it to the heap on every call.
	p.mu.Lock()
	defer p.mu.Unlock()
	p.args = a
	if parts <= 1 {
		fn(&p.args, 0, n)
		return
	}
	per := (chunks + parts - 1) / parts * grain
	p.wg.Add(parts - 1)
	for i := 1; i < parts; i++ {
		lo, hi := i*per, min((i+1)*per, n)
		if lo >= hi {
			p.wg.Done()
			continue
		}
		p.workers[i-1] <- job{fn, &p.args, lo, hi}
	}
	fn(&p.args, 0, min(per, n))
	p.wg.Wait()
}
