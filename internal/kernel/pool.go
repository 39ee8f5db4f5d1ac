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
	id       int           // its share's index in Pool.shares
}

// share is one goroutine's run of a kernel's pieces, [front, back) packed
// in one word so that its owner, taking pieces from the front, and a
// thief, taking them from the back, agree on each piece by one
// compare-and-swap. The padding keeps each share on its own cache line:
// an owner's claims stay in its core's cache until a thief comes.
type share struct {
	v atomic.Uint64
	_ [56]byte
}

// spinFor is how long an idle worker polls for new work before it parks.
// Waking a parked goroutine costs tens to hundreds of microseconds on a
// virtual machine, more than a small matrix-vector product takes, so
// back-to-back kernels must find their workers awake.
const spinFor = 200 * time.Microsecond

// claimsPer is how many pieces a kernel is cut into for each goroutine
// of the pool. Each goroutine runs its own share of pieces, then takes
// the pieces others have not begun, so one that starts late or is
// descheduled by the host leaves its share to the others instead of
// stalling the kernel.
const claimsPer = 4

// Pool runs kernels over a fixed set of goroutines; the calling goroutine
// takes the first piece. A Pool serialises the kernels submitted to it.
type Pool struct {
	mu      sync.Mutex
	args    Args
	workers []*worker
	closed  atomic.Bool
	gemm    gemmJob
	fast    fastJob
	kmaj    kmajJob

	// The running kernel, read by the workers it was posted to.
	fn       func(a *Args, lo, hi int)
	n, piece int
	shares   []share // one per goroutine, the caller's first
}

// NewPool starts a pool of n workers in all (the caller counts as one);
// n <= 0 means GOMAXPROCS.
func NewPool(n int) *Pool {
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	p := &Pool{shares: make([]share, n)}
	for i := 0; i < n-1; i++ {
		w := &worker{wake: make(chan struct{}, 1), id: i + 1}
		p.workers = append(p.workers, w)
		go p.loop(w)
	}
	return p
}

func (p *Pool) loop(w *worker) {
	for {
		// Wait for a posted kernel: poll, then park. A post the caller
		// took back (it ran every piece before this worker came) is
		// not run.
		start := time.Now()
		for i := 0; !(w.state.Load() == posted && w.state.CompareAndSwap(posted, running)); i++ {
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
		p.claim(w.id)
		w.state.Store(idle)
	}
}

func (w *worker) post() {
	w.state.Store(posted)
	if w.sleeping.CompareAndSwap(1, 0) {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// claim runs the pieces of share own from its front, then those left in
// the other shares from their backs, until no piece is left.
func (p *Pool) claim(own int) {
	for i := range p.shares {
		sh := &p.shares[(own+i)%len(p.shares)]
		for {
			v := sh.v.Load()
			front, back := v>>32, v&(1<<32-1)
			if front >= back {
				break
			}
			piece := back - 1
			next := front<<32 | piece
			if i == 0 {
				piece = front
				next = (front+1)<<32 | back
			}
			if !sh.v.CompareAndSwap(v, next) {
				continue
			}
			lo := int(piece) * p.piece
			p.fn(&p.args, lo, min(lo+p.piece, p.n))
		}
	}
}

// Size returns the number of goroutines a kernel runs on.
func (p *Pool) Size() int { return len(p.workers) + 1 }

// Pieces returns how many ranges Run cuts a kernel of enough items into:
// a kernel that groups its own items (balancing their cost) offers about
// this many groups, so that its goroutines can even out a late start.
func (p *Pool) Pieces() int { return p.Size() * claimsPer }

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
// a multiple of grain long (except the last), in parallel. Which goroutine
// runs a range depends on timing, never the ranges themselves: they depend
// only on n, grain and the pool's size. fn must not call Run on the same
// pool.
func (p *Pool) Run(fn func(a *Args, lo, hi int), a Args, n, grain int) {
	p.run(fn, a, n, grain, false)
}

// RunEach is Run with ranges of exactly grain items (the last one
// shorter), however many that makes, rather than about claimsPer a
// goroutine: for items whose costs differ widely (an MoE call's experts,
// the indexer's causal rows), where a goroutine that finishes its share
// early then takes the others' items one range at a time instead of a
// few ranges' worth of uneven items.
func (p *Pool) RunEach(fn func(a *Args, lo, hi int), a Args, n, grain int) {
	p.run(fn, a, n, grain, true)
}

// RunShares is Run with one range a goroutine, each a multiple of grain
// (the last shorter), rather than about claimsPer: for kernels that stream
// a weight from memory for a single x row, where every range starts its
// weight streams, and the memory's prefetchers, afresh (a cold one-row
// 256x768 product ran 1.4x as fast as one range a goroutine as in four:
// docs/bench). A goroutine that starts late leaves its whole share to
// the others, which costs such a kernel, microseconds long, less than
// the restarts.
func (p *Pool) RunShares(fn func(a *Args, lo, hi int), a Args, n, grain int) {
	if !oneShare {
		p.run(fn, a, n, grain, false)
		return
	}
	grain = max(grain, 1)
	share := (n + p.Size() - 1) / p.Size()
	p.run(fn, a, n, (share+grain-1)/grain*grain, true)
}

// oneShare false makes RunShares cut Run's pieces, for the benchmark that
// compares the two (BenchmarkOneShare).
var oneShare = true

func (p *Pool) run(fn func(a *Args, lo, hi int), a Args, n, grain int, each bool) {
	if grain < 1 {
		grain = 1
	}
	chunks := (n + grain - 1) / grain
	// The operands always travel through p.args: taking the address of the
	// parameter would move it to the heap on every call.
	p.mu.Lock()
	defer p.mu.Unlock()
	p.args = a
	if chunks <= 1 || len(p.workers) == 0 || p.closed.Load() {
		fn(&p.args, 0, n)
		return
	}
	p.fn, p.n = fn, n
	p.piece = (chunks + p.Size()*claimsPer - 1) / (p.Size() * claimsPer) * grain
	if each {
		p.piece = grain
	}
	pieces := (n + p.piece - 1) / p.piece
	per := (pieces + p.Size() - 1) / p.Size()
	for i := range p.shares {
		front, back := min(i*per, pieces), min((i+1)*per, pieces)
		p.shares[i].v.Store(uint64(front)<<32 | uint64(back))
	}
	used := p.workers[:(pieces+per-1)/per-1]
	for _, w := range used {
		w.post()
	}
	p.claim(0)
	// Every piece is claimed. Take back the posts no worker has taken up,
	// then wait for the pieces still running.
	for _, w := range used {
		if w.state.CompareAndSwap(posted, idle) {
			continue
		}
		for i := 0; w.state.Load() != idle; i++ {
			if i%64 == 63 {
				runtime.Gosched()
			}
		}
	}
	p.fn = nil
}
