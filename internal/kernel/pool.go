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
	"sync/atomic"
	"time"
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

// worker states
const (
	idle    = 0
	posted  = 1
	running = 2
)

type worker struct {
	state    atomic.Uint32
	sleeping atomic.Uint32
	wake     chan struct{} // capacity 1
	fn       func(a *Args, lo, hi int)
	lo, hi   int
}

// spinFor is how long an idle worker polls for new work before it parks.
// Waking a parked goroutine costs tens to hundreds of microseconds on a
// virtual machine, more than a small matrix-vector product takes, so
// back-to-back kernels must find their workers awake.
const spinFor = 200 * time.Microsecond

// Pool runs kernels over a fixed set of goroutines; the calling goroutine
// takes the first share. A Pool serialises the kernels submitted to it.
type Pool struct {
	mu      sync.Mutex
	args    Args
	workers []*worker
	closed  atomic.Bool
	gemm    gemmJob
	fast    fastJob
	kmaj    kmajJob
}

// NewPool starts a pool of n workers in all (the caller counts as one);
// n <= 0 means GOMAXPROCS.
func NewPool(n int) *Pool {
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	p := &Pool{}
	for i := 0; i < n-1; i++ {
		w := &worker{wake: make(chan struct{}, 1)}
		p.workers = append(p.workers, w)
		go p.loop(w)
	}
	return p
}

func (p *Pool) loop(w *worker) {
	for {
		// Wait for a posted job: poll, then park.
		start := time.Now()
		for i := 0; w.state.Load() != posted; i++ {
			if p.closed.Load() {
				return
			}
			if i%64 != 63 || time.Since(start) < spinFor {
				if i%64 == 63 {
					runtime.Gosched()
				}
				continue
			}
			if w.sleeping.CompareAndSwap(0, 1) {
				if w.state.Load() == posted || p.closed.Load() {
					w.sleeping.Store(0)
					continue
				}
				<-w.wake
				start = time.Now()
			}
		}
		w.state.Store(running)
		w.fn(&p.args, w.lo, w.hi)
		w.state.Store(idle)
	}
}

func (w *worker) post(fn func(a *Args, lo, hi int), lo, hi int) {
	w.fn, w.lo, w.hi = fn, lo, hi
	w.state.Store(posted)
	if w.sleeping.CompareAndSwap(1, 0) {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// Size returns the number of goroutines a kernel runs on.
func (p *Pool) Size() int { return len(p.workers) + 1 }

// Close stops the workers once the running kernel, if any, has finished.
// Kernels run after Close run on the calling goroutine alone.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Swap(true) {
		return
	}
	for _, w := range p.workers {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// Run calls fn(a, lo, hi) over disjoint ranges covering [0, n), each range
// a multiple of grain long (except the last), in parallel. fn must not call
// Run on the same pool.
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
	if parts <= 1 || p.closed.Load() {
		fn(&p.args, 0, n)
		return
	}
	per := (chunks + parts - 1) / parts * grain
	used := p.workers[:0]
	for i := 1; i < parts; i++ {
		lo, hi := i*per, min((i+1)*per, n)
		if lo >= hi {
			break
		}
		w := p.workers[i-1]
		w.post(fn, lo, hi)
		used = p.workers[:i]
	}
	fn(&p.args, 0, min(per, n))
	for _, w := range used {
		for i := 0; w.state.Load() != idle; i++ {
			if i%64 == 63 {
				runtime.Gosched()
			}
		}
	}
}
