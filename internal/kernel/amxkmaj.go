package kernel

import "sync"

// MatMulKMajorAMX computes dst[m, n] = x[m, k] · wᵀ for a bf16 weight in
// k-major form (PackKMajor) on the AMX tiles, x split into three bf16
// parts as MatMulAMX splits it. The weight's columns go in slabs of at
// most amxSlabCols: the pool repacks a slab into AMX form in a buffer the
// call borrows, then runs MatMulAMX's work items over it, so the weight
// needs no second copy. Its bits are MatMulAMX's over PackAMX(w): other
// bits than MatMulKMajor's, so a backend keeps it for products it never
// mixes with shorter ones (prefill chunks of PackedMinRows rows or more).
// Where the AMX product is not available it runs the plain-Go twins, which
// give the same bits.
func (p *Pool) MatMulKMajorAMX(dst, x []float32, wk []uint16, m, n, k int) {
	p.matMulKMajorAMX(dst, x, wk, m, n, k, amxParts)
}

// MatMulKMajorAMXFast is MatMulKMajorAMX with x rounded to bf16, as
// MatMulAMXFast rounds it: MatMulAMXFast's bits over PackAMX(w).
func (p *Pool) MatMulKMajorAMXFast(dst, x []float32, wk []uint16, m, n, k int) {
	p.matMulKMajorAMX(dst, x, wk, m, n, k, 1)
}

// MatMulKMajorAMXSerial is MatMulKMajorAMX on the calling goroutine alone,
// repacking each slab itself. Calls may run concurrently (an MoE layer's
// experts, one to a worker).
func MatMulKMajorAMXSerial(dst, x []float32, wk []uint16, m, n, k int) {
	(*Pool)(nil).matMulKMajorAMX(dst, x, wk, m, n, k, amxParts)
}

// matMulKMajorAMX is the product with x split into np parts, on the pool,
// or on the calling goroutine alone where p is nil.
func (p *Pool) matMulKMajorAMX(dst, x []float32, wk []uint16, m, n, k, np int) {
	checkKMajor(len(dst), len(x), len(wk), m, n, k)
	if m == 0 || n == 0 {
		return
	}
	j := amxJobs.Get().(*amxJob)
	defer amxJobs.Put(j)
	j.prepare(dst, x, nil, m, n, k, np)
	bp := amxSlabs.Get().(*[]uint16)
	defer amxSlabs.Put(bp)
	if size := amxRepackLen(min(amxSlabCols, n), k); cap(*bp) < size {
		*bp = make([]uint16, size)
	}
	j.wk = wk
	if p == nil {
		j.split(0, m)
	} else {
		p.Run(amxSplitRange, Args{Job: j}, m, 16)
	}
	for s0 := 0; s0 < n; s0 += amxSlabCols {
		width := min(amxSlabCols, n-s0)
		j.columns(width)
		j.w, j.dst = (*bp)[:amxRepackLen(width, k)], dst[s0:]
		items := (width + amxRepackCols - 1) / amxRepackCols
		if p == nil {
			amxRepackRange(&Args{Job: j, M: s0}, 0, items)
			j.run(0, j.chunks*j.blocks)
			continue
		}
		p.Run(amxRepackRange, Args{Job: j, M: s0}, items, 1)
		p.Run(amxRange, Args{Job: j}, j.chunks*j.blocks, 1)
	}
	j.dst, j.x, j.w, j.wk = nil, nil, nil, nil
}

const (
	// amxSlabCols is how many output columns MatMulKMajorAMX repacks at a
	// time: three of MatMulAMX's column chunks and sixteen k-major panels,
	// 1.2 MB of AMX form at k = 768.
	amxSlabCols = 3 * amxChunk * 2 * AMXPanel
	// amxRepackCols is a repacking work item: two k-major panels, six AMX
	// panels.
	amxRepackCols = 2 * KMajorPanel
)

// amxRepackLen is the length of the AMX form of n columns as
// repackKMajorAMX writes it: whole k-major panels of whole pairs of AMX
// panels.
func amxRepackLen(n, k int) int {
	return (amxCols(n) + amxRepackCols - 1) / amxRepackCols * amxRepackCols * amxKPad(k)
}

// amxSlabs holds the calls' repacked slabs.
var amxSlabs = sync.Pool{New: func() any { return new([]uint16) }}

// amxRepackRange repacks the work items [lo, hi) of amxRepackCols columns
// of the slab that starts at column a.M into the job's w.
func amxRepackRange(a *Args, lo, hi int) {
	j := a.Job.(*amxJob)
	for it := lo; it < hi; it++ {
		c0 := it * amxRepackCols
		panels := min(amxRepackCols, amxCols(j.n)-c0) / AMXPanel
		repackKMajorAMX(j.w[c0*j.kp:], j.wk, a.M+j.n, j.k, (a.M+c0)/KMajorPanel, panels)
	}
}

// amxPairIdx interleaves two rows of 16 words for VPERMT2W: word 2c of
// the result is word c of the first, word 2c+1 word c of the second.
var amxPairIdx = func() (idx [32]uint16) {
	for c := range 16 {
		idx[2*c], idx[2*c+1] = uint16(c), uint16(32+c)
	}
	return idx
}()

// repackKMajorAMX writes panels AMX panels (16 columns each) from k-major
// panel p0 of wk (a weight [n, k] in PackKMajor's form, n here at least
// the columns asked for) on into dst in PackAMX's form: AMX panel q holds
// the columns 16(q mod 3) on of k-major panel p0 + q/3, zero past n and k.
// Whole k-major panels are written: dst has room for a multiple of three
// AMX panels.
func repackKMajorAMX(dst, wk []uint16, n, k, p0, panels int) {
	kp := amxKPad(k)
	kpanels := (n + KMajorPanel - 1) / KMajorPanel
	for kq := 0; 3*kq < panels; kq++ {
		d := dst[3*kq*AMXPanel*kp : 3*(kq+1)*AMXPanel*kp]
		if p0+kq >= kpanels {
			clear(d)
			continue
		}
		src := wk[(p0+kq)*KMajorPanel*k : (p0+kq+1)*KMajorPanel*k]
		full := k / 2 // pairs whose two rows lie inside k
		t := 0
		if hasAVX512BW && full > 0 {
			repackKMajorAMXAVX512(&d[0], &src[0], full, 2*AMXPanel*kp, &amxPairIdx)
			t = full
		}
		for ; t < kp/2; t++ {
			for q := range 3 {
				row := d[q*AMXPanel*kp+t*2*AMXPanel : q*AMXPanel*kp+(t+1)*2*AMXPanel]
				for c := range AMXPanel {
					var even, odd uint16
					if 2*t < k {
						even = src[2*t*KMajorPanel+q*AMXPanel+c]
					}
					if 2*t+1 < k {
						odd = src[(2*t+1)*KMajorPanel+q*AMXPanel+c]
					}
					row[2*c], row[2*c+1] = even, odd
				}
			}
		}
	}
}
