package kernel

import (
	"slices"
	"sync"
	"time"
	"unsafe"
)

// Sum returns the sum of x. It is the body of the read-bandwidth probe.
func Sum(x []float32) float32 {
	var s float32
	done := 0
	if useAVX2 && len(x) >= 32 {
		done = len(x) &^ 31
		s = sumAVX2(&x[0], done)
	}
	var s0, s1, s2, s3 float32
	i := done
	for ; i+4 <= len(x); i += 4 {
		s0 += x[i]
		s1 += x[i+1]
		s2 += x[i+2]
		s3 += x[i+3]
	}
	for ; i < len(x); i++ {
		s0 += x[i]
	}
	return s + (s0 + s1) + (s2 + s3)
}

func sumRange(a *Args, lo, hi int) {
	x := a.X[lo:hi]
	if useAVX2 && len(x) >= 128 {
		n := len(x) &^ 127
		a.Dst[lo/a.K] = read4AVX2(&x[0], n) + Sum(x[n:])
		return
	}
	a.Dst[lo/a.K] = Sum(x)
}

// ReadBandwidth measures the STREAM-style read bandwidth of buf on the
// pool's goroutines: the median of reps full passes, in bytes per second.
// buf should be several times larger than the last-level cache. Matrix-vector
// products only read their weights, so this is their roofline. The median,
// not the best pass, because on shared hosts the attainable bandwidth
// fluctuates between passes a second apart; the best pass
// would compare a kernel's average with the host's luckiest moment.
func (p *Pool) ReadBandwidth(buf []float32, reps int) float64 {
	parts := p.Size()
	per := (len(buf) + parts - 1) / parts
	per = (per + 31) &^ 31
	partial := make([]float32, parts+1)
	rates := make([]float64, 0, reps)
	for r := 0; r < reps; r++ {
		start := time.Now()
		p.Run(sumRange, Args{Dst: partial, X: buf, K: per}, len(buf), per)
		rates = append(rates, float64(4*len(buf))/time.Since(start).Seconds())
	}
	slices.Sort(rates)
	return rates[len(rates)/2]
}

func fmaRange(a *Args, lo, hi int) { fmaLoopAVX2(a.K) }

func dpbf16Range(a *Args, lo, hi int) { dpbf16LoopAVX512(a.K) }

func fma512Range(a *Args, lo, hi int) { fmaLoopAVX512(a.K) }

// PeakFLOPS measures the fp32 FMA peak of the pool's goroutines with an
// AVX2 register-only loop (the best of a few runs, in FLOP/s); 0 where the
// assembly is not available. Compute-bound benchmarks report their rate as
// a share of it.
func (p *Pool) PeakFLOPS() float64 {
	if !useAVX2 {
		return 0
	}
	return p.peak(fmaRange, 12*16)
}

// PeakWideFLOPS measures the fp32 FMA peak with 512-bit vectors (the
// loop of PeakFLOPS on zmm registers), or 0 where the CPU has no AVX-512
// or K3_KERNEL caps the path below it. Kernels that run 512-bit FMAs
// (WideFMA) report their rate as a share of it.
func (p *Pool) PeakWideFLOPS() float64 {
	if !hasZMM {
		return 0
	}
	return p.peak(fma512Range, 12*32)
}

// PeakKernelFLOPS is the FMA peak of the path's kernels: PeakWideFLOPS
// where they run 512-bit FMAs (AVX-512, not capped below it), else
// PeakFLOPS.
func (p *Pool) PeakKernelFLOPS() float64 {
	if wide := p.PeakWideFLOPS(); wide > 0 {
		return wide
	}
	return p.PeakFLOPS()
}

// WideFMA reports whether the packed GEMM and the decode tiles run
// 512-bit FMAs on this CPU (probed once; see Path).
func WideFMA() bool { return wideFMA() }

// PeakBF16DotFLOPS measures the bf16 dot-product peak of the pool's
// goroutines (VDPBF16PS, AVX512_BF16; the best of a few runs, in FLOP/s),
// or 0 where the instruction is missing. No product kernel uses it, since
// it takes activations in bfloat16; `k3 bench kernels` prints it beside
// the FMA peak as the ceiling a bf16-activation mode would have.
func (p *Pool) PeakBF16DotFLOPS() float64 {
	if !hasBF16Dot {
		return 0
	}
	return p.peak(dpbf16Range, 12*64)
}

// PeakAMXFLOPS measures the AMX-BF16 tile peak of the pool's goroutines
// (rounds of four independent TDPBF16PS on full tiles, no memory traffic;
// the best of a few runs, in FLOP/s), or 0 where the AMX product does not
// run (AMXAvailable). The AMX product's shares are of it.
func (p *Pool) PeakAMXFLOPS() float64 {
	if !hasAMX || amxEmulated {
		return 0
	}
	return p.peakIters(amxPeakRange, 4*16*16*32*2, 500_000)
}

func amxPeakRange(a *Args, lo, hi int) {
	var cfg amxConfig
	cfg.set(16, 16)
	amxPeakLoop(&cfg, a.K)
}

// peak runs a register-only loop of flops per iteration on every goroutine
// of the pool and returns the best FLOP/s of three runs.
func (p *Pool) peak(loop func(a *Args, lo, hi int), flops float64) float64 {
	return p.peakIters(loop, flops, 20_000_000)
}

// peakIters is peak with iters iterations of the loop per goroutine.
func (p *Pool) peakIters(loop func(a *Args, lo, hi int), flops float64, iters int) float64 {
	parts := p.Size()
	best := 0.0
	for r := 0; r < 3; r++ {
		start := time.Now()
		p.Run(loop, Args{K: iters}, parts, 1)
		if f := float64(parts) * float64(iters) * flops / time.Since(start).Seconds(); f > best {
			best = f
		}
	}
	return best
}

// Limits measures, once per process, the memory bandwidth (the higher of a
// STREAM-style read and a STREAM triad over arrays far past the last-level
// cache) and the FMA peak of a default pool's kernels (PeakKernelFLOPS).
// Benchmarks
// report their figures as shares of these, measured in the same run.
var Limits = sync.OnceValues(func() (bandwidth, peakFLOPS float64) {
	p := NewPool(0)
	defer p.Close()
	const n = 64 << 20
	a, b, c := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range b {
		b[i], c[i] = 1, 2
	}
	return max(p.ReadBandwidth(b, 7), p.Triad(a, b, c, 7)), p.PeakKernelFLOPS()
})

// triadRange runs the triad with ordinary stores, triadNTRange with
// non-temporal ones (on 32-byte aligned ranges); both finish in Go.
func triadRange(a *Args, lo, hi int) { triadPart(a, lo, hi, false) }

func triadNTRange(a *Args, lo, hi int) { triadPart(a, lo, hi, true) }

func triadPart(a *Args, lo, hi int, nt bool) {
	x, y, z := a.Dst[lo:hi], a.X[lo:hi], a.Y[lo:hi]
	i := 0
	switch {
	case !useAVX2 || len(x) < 8:
	case !nt:
		i = len(x) &^ 7
		triadPlainAVX2(&x[0], &y[0], &z[0], a.F, i)
	case uintptr(unsafe.Pointer(&x[0]))%32 == 0:
		i = len(x) &^ 7
		triadAVX2(&x[0], &y[0], &z[0], a.F, i)
	}
	for ; i < len(x); i++ {
		x[i] = y[i] + a.F*z[i]
	}
}

// Triad measures the STREAM triad a = b + s·c over the three arrays (equal
// lengths, far larger than the cache) on the pool: the median of reps
// passes, in bytes per second. Like STREAM's own code it stores through the
// cache and counts 12 bytes per element, although the bus also reads each
// line of a before it is written (16 bytes an element).
func (p *Pool) Triad(a, b, c []float32, reps int) float64 { return p.triad(triadRange, a, b, c, reps) }

// TriadNT is Triad with non-temporal stores, which skip reading a: on some
// hosts it moves more bytes per second than any read-only stream, so it
// bounds mixed traffic, not reads.
func (p *Pool) TriadNT(a, b, c []float32, reps int) float64 {
	return p.triad(triadNTRange, a, b, c, reps)
}

func (p *Pool) triad(part func(a *Args, lo, hi int), a, b, c []float32, reps int) float64 {
	per := ((len(a)+p.Size()-1)/p.Size() + 7) &^ 7
	rates := make([]float64, 0, reps)
	for r := 0; r < reps; r++ {
		start := time.Now()
		p.Run(part, Args{Dst: a, X: b, Y: c, F: 3}, len(a), per)
		rates = append(rates, float64(12*len(a))/time.Since(start).Seconds())
	}
	slices.Sort(rates)
	return rates[len(rates)/2]
}

// nowProbe holds BandwidthNow's arrays and pool, made on first use.
var nowProbe = sync.OnceValue(func() *struct {
	p       *Pool
	a, b, c []float32
} {
	const n = 32 << 20 // 128 MB an array: four times the largest L3 seen here
	pr := &struct {
		p       *Pool
		a, b, c []float32
	}{p: NewPool(0), a: make([]float32, n), b: make([]float32, n), c: make([]float32, n)}
	for i := range pr.b {
		pr.b[i], pr.c[i] = 1, 2
	}
	return pr
})

// BandwidthNow measures the memory bandwidth at this moment: the higher of
// one read pass and one STREAM triad over arrays far past the cache (made
// on the first call and kept). Benchmarks call it right before and after
// their timed loop and divide by the higher value, because on a shared
// host the bandwidth drifts from one second to the next and a probe taken
// at another moment (Limits) can be off by a factor of two.
func BandwidthNow() float64 {
	pr := nowProbe()
	return max(pr.p.ReadBandwidth(pr.b, 1), pr.p.Triad(pr.a, pr.b, pr.c, 1))
}
