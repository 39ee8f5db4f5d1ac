package kernel

import (
	"math"
	"sync"
)

// K-major bf16 weights serve every product of a prepared weight, whatever
// its row count: a weight [N, K] is stored as panels of KMajorPanel weight
// rows, each panel [K][KMajorPanel] (PackKMajor), and each output is one
// FMA chain over k in order, starting from zero. The register tiles take
// eight, four, two or one x rows against one panel, and none of that
// changes a result's bits: a row's outputs are the same alone, in a decode
// batch, in a scheduler's mixed pass or in a prefill chunk of any length.
const KMajorPanel = 48

const (
	kmajKC = 1024 // k block: four panels' blocks (384 KB) stay in L2 across the row groups
	kmajMC = 64   // x rows per work item: their k block stays in L2 across the panels
)

// KMajorMinN is the fewest weight rows (output columns) a backend lays out
// k-major. A narrower weight fills few panels (64 rows are a panel and a
// third, read as 96), so a single x row cannot spread its reads over four
// streams per core; the dot-form tiles read such a weight at 1.6-2x the
// rate (BenchmarkKMajorVsDot at 64x768). Below it the stored layout
// keeps the dot-form tiles for every row count, since the packed GEMM
// takes nothing that narrow (packedWideMinN), so those products are
// row-invariant at any size too.
const KMajorMinN = 384

// KMajorLen returns the length of the k-major form of an [n, k] weight.
func KMajorLen(n, k int) int {
	return (n + KMajorPanel - 1) / KMajorPanel * KMajorPanel * k
}

// PackKMajor writes w [n, k] in k-major form into dst (KMajorLen(n, k)
// long): panel p, element (kk, j) is w[48p+j][kk], zero where 48p+j >= n.
func PackKMajor(dst, w []uint16, n, k int) {
	checkPack(dst, w, n, k)
	packPanels48(dst, w, n, k, 0, (n+KMajorPanel-1)/KMajorPanel, false)
}

// PackKMajor is PackKMajor with the panels split over the pool (a model's
// weights are packed at load).
func (p *Pool) PackKMajor(dst, w []uint16, n, k int) {
	checkPack(dst, w, n, k)
	j := &p.kmaj
	j.mu.Lock()
	defer j.mu.Unlock()
	j.pdst, j.pw, j.n, j.k = dst, w, n, k
	p.Run(packRange, Args{Job: j}, (n+KMajorPanel-1)/KMajorPanel, 1)
	j.pdst, j.pw = nil, nil
}

func packRange(a *Args, lo, hi int) {
	j := a.Job.(*kmajJob)
	packPanels48(j.pdst, j.pw, j.n, j.k, lo, hi, j.pairs)
}

func checkPack(dst, w []uint16, n, k int) {
	if len(dst) != KMajorLen(n, k) || len(w) < n*k {
		panic("kernel: PackKMajor operand too short")
	}
}

// panelAt is the offset of w[48p+j][kk] in panel p: k-major, or with
// pairs the k pairs' elements side by side (PackKPairs).
func panelAt(kk, j int, pairs bool) int {
	if pairs {
		return kk&^1*KMajorPanel + 2*j + kk&1
	}
	return kk*KMajorPanel + j
}

// packPanels48 packs panels [p0, p1), pair-interleaved with pairs.
func packPanels48(dst, w []uint16, n, k, p0, p1 int, pairs bool) {
	for p := p0; p < p1; p++ {
		panel := dst[p*KMajorPanel*k : (p+1)*KMajorPanel*k]
		cols := min(KMajorPanel, n-p*KMajorPanel)
		if cols < KMajorPanel {
			clear(panel)
		}
		for j := 0; j < cols; j++ {
			row := w[(p*KMajorPanel+j)*k : (p*KMajorPanel+j+1)*k]
			for kk, v := range row {
				panel[panelAt(kk, j, pairs)] = v
			}
		}
	}
}

// UnpackKMajor is PackKMajor's inverse: it writes the [n, k] weight that wp
// holds in k-major form into w.
func UnpackKMajor(w, wp []uint16, n, k int) {
	if len(wp) != KMajorLen(n, k) || len(w) < n*k {
		panic("kernel: UnpackKMajor operand too short")
	}
	unpackPanels(w, wp, n, k, false)
}

func unpackPanels(w, wp []uint16, n, k int, pairs bool) {
	for r := 0; r < n; r++ {
		p, j := r/KMajorPanel, r%KMajorPanel
		panel := wp[p*KMajorPanel*k:]
		row := w[r*k : (r+1)*k]
		for kk := range row {
			row[kk] = panel[panelAt(kk, j, pairs)]
		}
	}
}

// KMajorFast reports whether the k-major products run on the 512-bit
// tiles here: on any CPU with AVX-512F and VL that K3_KERNEL does not cap
// below them, whatever its FMA width (on Zen 4, whose 512-bit FMAs run at
// the 256-bit rate, the layout still pays: docs/bench). A backend lays its
// bf16 weights out k-major only then: elsewhere the plain-Go twin below
// serves, correct but slow.
func KMajorFast() bool { return hasZMM }

// kmajJob is one k-major product. The pool owns one, so a product
// allocates nothing.
type kmajJob struct {
	mu      sync.Mutex // held for the whole product
	dst, x  []float32
	w       []uint16
	m, n, k int
	panels  int
	pdst    []uint16 // PackKMajor's operands
	pw      []uint16
	// pairs: w is pair-interleaved (PackKPairs) and the product reads x
	// rounded to bf16 in xb (MatMulKPairs).
	pairs bool
	xb    []uint16
}

// MatMulKMajor computes dst[m, n] = x[m, k] · wᵀ for a bf16 weight w [n, k]
// in k-major form (PackKMajor).
func (p *Pool) MatMulKMajor(dst, x []float32, wp []uint16, m, n, k int) {
	checkKMajor(len(dst), len(x), len(wp), m, n, k)
	if m == 0 || n == 0 {
		return
	}
	j := &p.kmaj
	j.mu.Lock()
	defer j.mu.Unlock()
	p.kmajRun(j, dst, x, wp, m, n, k)
}

// kmajRun runs the product j holds the lock of, over the pool.
func (p *Pool) kmajRun(j *kmajJob, dst, x []float32, wp []uint16, m, n, k int) {
	j.dst, j.x, j.w, j.m, j.n, j.k = dst, x, wp, m, n, k
	j.panels = (n + KMajorPanel - 1) / KMajorPanel
	blocks := (m + kmajMC - 1) / kmajMC
	if m < 8 {
		// kmajFew reads its range's panels as four streams, each
		// restarted with every range.
		p.RunShares(kmajRange, Args{Job: j}, blocks*j.panels, kmajStreams)
	} else {
		p.Run(kmajRange, Args{Job: j}, blocks*j.panels, 1)
	}
	j.dst, j.x, j.w = nil, nil, nil
}

// MatMulKMajorSerial is MatMulKMajor on the calling goroutine alone.
func MatMulKMajorSerial(dst, x []float32, wp []uint16, m, n, k int) {
	checkKMajor(len(dst), len(x), len(wp), m, n, k)
	if m == 0 || n == 0 {
		return
	}
	j := kmajJob{dst: dst, x: x, w: wp, m: m, n: n, k: k, panels: (n + KMajorPanel - 1) / KMajorPanel}
	blocks := (m + kmajMC - 1) / kmajMC
	a := Args{Job: &j}
	kmajRange(&a, 0, blocks*j.panels)
}

// MatMulKMajorPanels is MatMulKMajorSerial restricted to the outputs of
// panels [p0, p1): columns [48·p0, min(n, 48·p1)) of dst, each with the
// bits the whole product gives it, so that one product's panels can be
// spread over goroutines (an MoE call's experts, cpu.MoEExperts).
func MatMulKMajorPanels(dst, x []float32, wp []uint16, m, n, k, p0, p1 int) {
	checkKMajor(len(dst), len(x), len(wp), m, n, k)
	j := kmajJob{dst: dst, x: x, w: wp, m: m, n: n, k: k, panels: (n + KMajorPanel - 1) / KMajorPanel}
	kmajPanels(&j, p0, p1)
}

// MatMulKPairsPanels is MatMulKPairsSerial restricted to the outputs of
// panels [p0, p1), x given already rounded to bf16 (xb, m·k long, as
// ToBF16 writes it).
func MatMulKPairsPanels(dst []float32, xb, wp []uint16, m, n, k, p0, p1 int) {
	checkKPairs(len(dst), len(xb), len(wp), m, n, k)
	j := kmajJob{dst: dst, xb: xb, w: wp, m: m, n: n, k: k, pairs: true, panels: (n + KMajorPanel - 1) / KMajorPanel}
	kmajPanels(&j, p0, p1)
}

// kmajPanels runs panels [p0, p1) of j's product for all its rows.
func kmajPanels(j *kmajJob, p0, p1 int) {
	if p0 < 0 || p1 > j.panels || p0 > p1 {
		panic("kernel: k-major panel range outside the weight")
	}
	if j.m == 0 || p0 == p1 {
		return
	}
	for r0 := 0; r0 < j.m; r0 += kmajMC {
		kmajBlock(j, r0, min(j.m, r0+kmajMC), p0, p1)
	}
}

func checkKMajor(nd, nx, nw, m, n, k int) {
	if nd < m*n || nx < m*k || nw != KMajorLen(n, k) {
		panic("kernel: MatMulKMajor operand too short")
	}
}

// kmajRange computes work items [lo, hi): item i is the panel i mod panels
// for the block of x rows i / panels.
func kmajRange(a *Args, lo, hi int) {
	j := a.Job.(*kmajJob)
	for it := lo; it < hi; {
		p, mb := it%j.panels, it/j.panels
		pe := min(j.panels, p+hi-it)
		kmajBlock(j, mb*kmajMC, min(j.m, (mb+1)*kmajMC), p, pe)
		it += pe - p
	}
}

// kmajStreams is how many panels a product of fewer than eight rows reads
// at once: one weight stream per core reaches about two thirds of the
// memory's rate, four reach all of it (BenchmarkKMajorVsDot).
const kmajStreams = 4

// kmajBlock computes x rows [r0, r1) against panels [p0, p1).
func kmajBlock(j *kmajJob, r0, r1, p0, p1 int) {
	k, n := j.k, j.n
	rows := r1 - r0
	full := min(p1, n/KMajorPanel) // panels [p0, full) have 48 columns
	x := r0 * k                    // x row r0's first element in j.x (or j.xb)
	out := j.dst[r0*n:]
	if rows < 8 && !kmajGo && (hasZMM && !j.pairs || hasBF16Dot && j.pairs) {
		if rows%4 == 3 {
			kmajFewPadded(j, x, out, rows, p0, p1)
			return
		}
		kmajFew(j, x, out, rows, p0, p1, nil)
		return
	}
	p := p0
	for ; p < full; p++ {
		for kb := 0; kb < k; kb += kmajKC {
			j.rows(x+kb, rows, (p*k+kb)*KMajorPanel, min(kmajKC, k-kb), out[p*KMajorPanel:], n, kb > 0)
		}
	}
	if p < p1 {
		// The last panel, narrower than 48 columns: eight rows at a time
		// on the edge tiles where it has 16 or 32, else through a buffer.
		var edge [8 * KMajorPanel]float32
		c0 := p * KMajorPanel
		cols := n - c0
		edgeTile := hasZMM && !kmajGo && !j.pairs && cols%16 == 0
		for r := 0; r < rows; {
			if edgeTile {
				if took := kmajEdge(j, x+r*k, out[r*n+c0:], rows-r, c0, cols); took > 0 {
					r += took
					continue
				}
			}
			rr := min(8, rows-r)
			for kb := 0; kb < k; kb += kmajKC {
				j.rows(x+r*k+kb, rr, c0*k+kb*KMajorPanel, min(kmajKC, k-kb), edge[:], KMajorPanel, kb > 0)
			}
			for q := 0; q < rr; q++ {
				copy(out[(r+q)*n+c0:(r+q)*n+c0+cols], edge[q*KMajorPanel:])
			}
			r += rr
		}
	}
}

// kmajEdge runs the first sixteen (where cols is 16) or eight of rows x
// rows (from x; out at their first output of the panel) against the last
// panel, of cols (16 or 32) columns from c0, on the edge tiles, and
// returns how many rows it took: none under eight.
func kmajEdge(j *kmajJob, x int, out []float32, rows, c0, cols int) int {
	took := 8
	switch {
	case rows < 8:
		return 0
	case cols == 16 && rows >= 16:
		took = 16
	}
	k, n := j.k, j.n
	for kb := 0; kb < k; kb += kmajKC {
		ac := 0
		if kb > 0 {
			ac = 1
		}
		xp, wp, kn := &j.x[x+kb], &j.w[c0*k+kb*KMajorPanel], min(kmajKC, k-kb)
		switch {
		case took == 16:
			kmaj16e1(xp, k, wp, kn, &out[0], n, ac)
		case cols == 16:
			kmaj8e1(xp, k, wp, kn, &out[0], n, ac)
		default:
			kmaj8e2(xp, k, wp, kn, &out[0], n, ac)
		}
	}
	return took
}

// kmajFew computes fewer than eight x rows (x, out from the first) against
// panels [p0, p1): the panels cut into four runs read side by side, one
// panel of each per step, each row group meeting the step's panels
// (k-blocked so that they stay in L2) before the next. Where a run has no
// panel left its stream reads the first run's panel again (from cache),
// and a step holding such a stream or the last, narrower panel writes
// through a buffer.
//
// With pad, the rows are three or seven and their last three go through
// the four-row tiles as four, the fourth zero: pad takes each k block of
// them (the tiles read its rows kmajKC apart) and the outputs go through
// the buffer.
func kmajFew(j *kmajJob, x int, out []float32, rows, p0, p1 int, pad *fewPad) {
	k, n := j.k, j.n
	tileRows, padFrom := rows, rows // the rows the tiles take; the first from pad
	if pad != nil {
		tileRows, padFrom = rows+1, rows-3
	}
	g := (p1 - p0 + kmajStreams - 1) / kmajStreams
	var buf [8 * kmajStreams * KMajorPanel]float32 // [row][stream][48]
	var q [kmajStreams]int
	var w [kmajStreams]*uint16
	var o [kmajStreams]*float32
	ahead := kmajFewAhead()
	for i := 0; i < g; i++ {
		buffered := pad != nil
		for s := range q {
			q[s] = p0 + s*g + i
			if q[s] >= p1 || (q[s]+1)*KMajorPanel > n {
				buffered = true
			}
		}
		os := n
		if buffered {
			os = kmajStreams * KMajorPanel
		}
		for kb := 0; kb < k; kb += kmajKC {
			kn := min(kmajKC, k-kb)
			ac := 0
			if kb > 0 {
				ac = 1
			}
			for s := range w {
				qs := q[s]
				if qs >= p1 {
					qs = q[0]
				}
				w[s] = &j.w[(qs*k+kb)*KMajorPanel]
			}
			if pad != nil {
				for r := padFrom; r < rows; r++ {
					q := (r - padFrom) * kmajKC
					if j.pairs {
						copy(pad.xb[q:q+kn], j.xb[x+r*k+kb:])
					} else {
						copy(pad.x[q:q+kn], j.x[x+r*k+kb:])
					}
				}
			}
			// The tiles' x rows from row r: their first element and stride.
			xrow := func(r int) (*float32, int) {
				if r >= padFrom {
					return &pad.x[(r-padFrom)*kmajKC], kmajKC
				}
				return &j.x[x+r*k+kb], k
			}
			xbrow := func(r int) (*uint16, int) {
				if r >= padFrom {
					return &pad.xb[(r-padFrom)*kmajKC], kmajKC
				}
				return &j.xb[x+r*k+kb], k
			}
			// at points o at the outputs of row r.
			at := func(r int) *[kmajStreams]*float32 {
				for s := range o {
					if buffered {
						o[s] = &buf[r*os+s*KMajorPanel]
					} else {
						o[s] = &out[r*n+q[s]*KMajorPanel]
					}
				}
				return &o
			}
			r := 0
			for ; r+4 <= tileRows; r += 4 {
				op := at(r)
				w0, w1 := (*[2]*uint16)(w[0:2]), (*[2]*uint16)(w[2:4])
				o0, o1 := (*[2]*float32)(op[0:2]), (*[2]*float32)(op[2:4])
				if j.pairs {
					xr, xs := xbrow(r)
					kpair4x2(xr, xs, w0, kn/2, o0, os, ac, ahead)
					kpair4x2(xr, xs, w1, kn/2, o1, os, ac, ahead)
				} else {
					xr, xs := xrow(r)
					kmaj4x2(xr, xs, w0, kn, o0, os, ac, ahead)
					kmaj4x2(xr, xs, w1, kn, o1, os, ac, ahead)
				}
			}
			if r+2 <= tileRows {
				if j.pairs {
					xr, xs := xbrow(r)
					kpair2x4(xr, xs, &w, kn/2, at(r), os, ac, ahead)
				} else {
					xr, xs := xrow(r)
					kmaj2x4(xr, xs, &w, kn, at(r), os, ac, ahead)
				}
				r += 2
			}
			if r < tileRows {
				if j.pairs {
					xr, xs := xbrow(r)
					kpair1x4(xr, xs, &w, kn/2, at(r), os, ac, ahead)
				} else {
					xr, xs := xrow(r)
					kmaj1x4(xr, xs, &w, kn, at(r), os, ac, ahead)
				}
			}
		}
		if buffered {
			for s, qs := range q {
				if qs >= p1 {
					continue
				}
				c0 := qs * KMajorPanel
				cols := min(KMajorPanel, n-c0)
				for r := 0; r < rows; r++ {
					copy(out[r*n+c0:r*n+c0+cols], buf[r*os+s*KMajorPanel:])
				}
			}
		}
	}
}

// fewPad holds three x rows' k block and a zero fourth row for kmajFew.
type fewPad struct {
	x  [4 * kmajKC]float32
	xb [4 * kmajKC]uint16
}

// kmajFewPadded is kmajFew for three or seven rows: the last three run
// through the four-row tile with a zero fourth row, one pass over each
// weight stream where the two- and one-row tiles would make two, with
// the same FMA chains.
func kmajFewPadded(j *kmajJob, x int, out []float32, rows, p0, p1 int) {
	var pad fewPad
	kmajFew(j, x, out, rows, p0, p1, &pad)
}

// kmajFewAheadBytes forces kmajFewAhead's answer for benchmarks; -1
// follows the rule.
var kmajFewAheadBytes = -1

// kmajFewAhead returns how many bytes ahead of each weight stream the
// few-row tiles prefetch (two lines a step). Where 512-bit FMAs run at
// full width (the Zen 5 and the Intel Xeon where these tiles were tuned)
// 1,536; where they run as two halves (Zen 4) none: there the hardware
// prefetchers alone read one to five rows' streams 2-9% faster over the
// pool and 1.2-1.4x faster on one goroutine (an expert's product), while
// eight rows against one panel (kmaj8) still gain from the prefetch
// (docs/bench).
func kmajFewAhead() int {
	switch {
	case kmajFewAheadBytes >= 0:
		return kmajFewAheadBytes
	case wideFMA():
		return 1536
	}
	return 0
}

// kmaj8AheadBytes forces kmaj8Ahead's answer for benchmarks; -1 follows
// the rule.
var kmaj8AheadBytes = -1

// kmaj8Ahead returns how many bytes ahead of its panel the eight-row tile
// prefetches (two lines a step): 6,144 where 512-bit FMAs run at full
// width and VDPBF16PS at about twice their rate, which of the CPUs
// measured is the Zen 5: a step's 24 FMAs there take half their time on
// the Zen 4, and 1,536 bytes (16 steps) did not hide the memory's
// latency (docs/bench: eight cold rows 1.15-1.2x as fast, 64 and 256
// rows 1.03x, 12,288 bytes no faster); elsewhere 1,536 (the Zen 4, and
// the Intel Xeon with AMX, where no other distance was measured).
func kmaj8Ahead() int {
	switch {
	case kmaj8AheadBytes >= 0:
		return kmaj8AheadBytes
	case farAhead():
		return 6144
	}
	return 1536
}

// farAhead reports whether the eight-row tiles prefetch 6,144 bytes
// ahead (kmaj8Ahead, kpair8Ahead): where 512-bit FMAs run at full width
// and VDPBF16PS at twice their rate.
func farAhead() bool { return wideFMA() && fastBF16Pays() }

// rows runs rows x rows from element xo of j's x (or its bf16 rows)
// against the panel block at element wo of its weight, kn elements of k.
func (j *kmajJob) rows(xo, rows, wo, kn int, out []float32, os int, acc bool) {
	if j.pairs {
		kpairRows(j.xb[xo:], j.k, rows, j.w[wo:], kn, out, os, acc)
		return
	}
	kmajRows(j.x[xo:], j.k, rows, j.w[wo:], kn, out, os, acc)
}

// kmajRows runs rows x rows (stride xs) against one panel block of kn
// steps, writing 48 outputs per row at out (stride os); acc continues the
// chains from out.
func kmajRows(x []float32, xs, rows int, w []uint16, kn int, out []float32, os int, acc bool) {
	if !hasZMM || kmajGo {
		kmajRowsGo(x, xs, rows, w, kn, out, os, acc)
		return
	}
	ac := 0
	if acc {
		ac = 1
	}
	r := 0
	if rows >= 8 {
		ahead := kmaj8Ahead()
		for ; r+8 <= rows; r += 8 {
			kmaj8(&x[r*xs], xs, &w[0], kn, &out[r*os], os, ac, ahead)
		}
	}
	if r+4 <= rows {
		kmaj4(&x[r*xs], xs, &w[0], kn, &out[r*os], os, ac)
		r += 4
	}
	if r+2 <= rows {
		kmaj2(&x[r*xs], xs, &w[0], kn, &out[r*os], os, ac)
		r += 2
	}
	if r < rows {
		kmaj1(&x[r*xs], xs, &w[0], kn, &out[r*os], os, ac)
	}
}

// kmajGo forces the plain-Go twin, for tests.
var kmajGo bool

// kmajRowsGo is the plain-Go twin of the tiles: the same FMA chains.
func kmajRowsGo(x []float32, xs, rows int, w []uint16, kn int, out []float32, os int, acc bool) {
	var s [KMajorPanel]float32
	for r := 0; r < rows; r++ {
		o := out[r*os : r*os+KMajorPanel]
		if acc {
			copy(s[:], o)
		} else {
			s = [KMajorPanel]float32{}
		}
		xr := x[r*xs : r*xs+kn]
		for kk, xv := range xr {
			wk := w[kk*KMajorPanel : (kk+1)*KMajorPanel]
			for c := range s {
				s[c] = fma32(xv, bf16(wk[c]), s[c])
			}
		}
		copy(o, s[:])
	}
}

// fma32 is a float32 fused multiply-add. The product of two float32 values
// is exact in float64, so one float64 FMA rounds the sum once to float64
// and then to float32; the two roundings differ from one only when the
// first lands exactly half-way between two float32 values.
func fma32(a, b, c float32) float32 {
	return float32(math.FMA(float64(a), float64(b), float64(c)))
}
