package kernel

// Pair-interleaved bf16 weights serve the fast (one bf16 part) product
// the way k-major weights serve the exact one: a weight [N, K] (K even) is
// stored as panels of KMajorPanel weight rows, each panel [K/2][48][2]
// (PackKPairs), the two weights of a k pair side by side in one dword, as
// AVX512_BF16's VDPBF16PS reads them. x is rounded to bf16 (ToBF16), and
// each output is one chain over k's pairs in order, from zero: per pair,
// the odd element's product and then the even one's added to a float32
// lane. The tiles take eight, four, two or one x rows against a panel (or
// several panels' streams for fewer than eight rows, as kmajFew), and
// none of that changes a result's bits, so a row's result is the same
// alone, in a decode batch or in a prefill chunk.

// KPairLen returns the length of the pair-interleaved form of an [n, k]
// weight (k even).
func KPairLen(n, k int) int { return KMajorLen(n, k) }

// PackKPairs writes w [n, k] (k even) in pair-interleaved form into dst
// (KPairLen(n, k) long): panel p, element (kk, j) is at
// (kk/2)·96 + 2j + kk%2 of the panel, w[48p+j][kk], zero where 48p+j >= n.
func PackKPairs(dst, w []uint16, n, k int) {
	checkPairs(len(dst), len(w), n, k)
	packPanels48(dst, w, n, k, 0, (n+KMajorPanel-1)/KMajorPanel, true)
}

// PackKPairs is PackKPairs with the panels split over the pool.
func (p *Pool) PackKPairs(dst, w []uint16, n, k int) {
	checkPairs(len(dst), len(w), n, k)
	j := &p.kmaj
	j.mu.Lock()
	defer j.mu.Unlock()
	j.pdst, j.pw, j.n, j.k, j.pairs = dst, w, n, k, true
	p.Run(packRange, Args{Job: j}, (n+KMajorPanel-1)/KMajorPanel, 1)
	j.pdst, j.pw, j.pairs = nil, nil, false
}

func checkPairs(nd, nw, n, k int) {
	if k%2 != 0 {
		panic("kernel: PackKPairs of an odd k")
	}
	if nd != KPairLen(n, k) || nw < n*k {
		panic("kernel: PackKPairs operand too short")
	}
}

// UnpackKPairs is PackKPairs' inverse.
func UnpackKPairs(w, wp []uint16, n, k int) {
	checkPairs(len(wp), len(w), n, k)
	unpackPanels(w, wp, n, k, true)
}

// KPairsFast reports whether the pair products run on VDPBF16PS here;
// elsewhere the plain-Go twin serves, correct but slow.
func KPairsFast() bool { return hasBF16Dot }

// MatMulKPairs computes dst[m, n] = bf16(x)[m, k] · wᵀ for a bf16 weight w
// [n, k] in pair-interleaved form (PackKPairs), x rounded to bf16 to
// nearest even (over the pool for long products).
func (p *Pool) MatMulKPairs(dst, x []float32, wp []uint16, m, n, k int) {
	checkKPairs(len(dst), len(x), len(wp), m, n, k)
	if m == 0 || n == 0 {
		return
	}
	j := &p.kmaj
	j.mu.Lock()
	defer j.mu.Unlock()
	if cap(j.xb) < m*k {
		j.xb = make([]uint16, m*k)
	}
	j.xb = j.xb[:m*k]
	j.x, j.k = x, k
	p.Run(kpairRoundRange, Args{Job: j}, m, fastRoundRows)
	j.pairs = true
	p.kmajRun(j, dst, nil, wp, m, n, k)
	j.pairs = false
}

// MatMulKPairsSerial is MatMulKPairs on the calling goroutine alone, x
// rounded into xb (at least m·k long).
func MatMulKPairsSerial(dst, x []float32, wp, xb []uint16, m, n, k int) {
	checkKPairs(len(dst), len(x), len(wp), m, n, k)
	if len(xb) < m*k {
		panic("kernel: MatMulKPairsSerial buffer too short")
	}
	if m == 0 || n == 0 {
		return
	}
	ToBF16(xb[:m*k], x[:m*k])
	j := kmajJob{dst: dst, xb: xb, w: wp, m: m, n: n, k: k, pairs: true, panels: (n + KMajorPanel - 1) / KMajorPanel}
	blocks := (m + kmajMC - 1) / kmajMC
	a := Args{Job: &j}
	kmajRange(&a, 0, blocks*j.panels)
}

func checkKPairs(nd, nx, nw, m, n, k int) {
	if k%2 != 0 {
		panic("kernel: MatMulKPairs of an odd k")
	}
	checkKMajor(nd, nx, nw, m, n, k)
}

// kpairRoundRange rounds x rows [lo, hi) to bf16 into the job's buffer.
func kpairRoundRange(a *Args, lo, hi int) {
	j := a.Job.(*kmajJob)
	ToBF16(j.xb[lo*j.k:hi*j.k], j.x[lo*j.k:hi*j.k])
}

// kpairRows runs rows bf16 x rows (stride xs) against one panel block of
// kn elements of k (kn even), writing 48 outputs per row at out (stride
// os); acc continues the chains from out.
func kpairRows(x []uint16, xs, rows int, w []uint16, kn int, out []float32, os int, acc bool) {
	if !hasBF16Dot || kmajGo {
		kpairRowsGo(x, xs, rows, w, kn, out, os, acc)
		return
	}
	ac := 0
	if acc {
		ac = 1
	}
	kp := kn / 2
	r := 0
	if rows >= 8 {
		ahead := kpair8Ahead()
		for ; r+8 <= rows; r += 8 {
			kpair8(&x[r*xs], xs, &w[0], kp, &out[r*os], os, ac, ahead)
		}
	}
	if r+4 <= rows {
		kpair4(&x[r*xs], xs, &w[0], kp, &out[r*os], os, ac)
		r += 4
	}
	if r+2 <= rows {
		kpair2(&x[r*xs], xs, &w[0], kp, &out[r*os], os, ac)
		r += 2
	}
	if r < rows {
		kpair1(&x[r*xs], xs, &w[0], kp, &out[r*os], os, ac)
	}
}

// kpair8Ahead returns how many bytes ahead of its weight stream kpair8
// prefetches: 6,144 where 512-bit FMAs run at full width and VDPBF16PS at
// twice their rate (the Zen 5, as kmaj8Ahead: eight cold rows 1.2x as
// fast as at 1,536, docs/bench); 1,536 where only the FMAs do (the
// distance the single-panel tiles were tuned with); where they run as
// two halves (Zen 4) 0, the prefetches falling on the lines each step
// loads. There eight rows of VDPBF16PS against cold panels ran up to 8%
// faster on the hardware prefetchers alone, while kmaj8, which issues
// twice the instructions per weight, still gains from its prefetch; long
// products, whose panels come from cache, ran the same either way.
func kpair8Ahead() int {
	switch {
	case kpair8AheadBytes >= 0:
		return kpair8AheadBytes
	case farAhead():
		return 6144
	case wideFMA():
		return 1536
	}
	return 0
}

// kpair8AheadBytes forces kpair8Ahead's answer for benchmarks; -1 follows
// the rule.
var kpair8AheadBytes = -1

// kpairRowsGo is the plain-Go twin of the pair tiles, in VDPBF16PS's
// documented order (the odd element's product first). The products of two
// bf16 values are exact in float32; only the additions round, and how a
// CPU rounds inside a pair (and its flushing of denormals) is its own, so
// the tests hold the tiles to the float64 product, not to these bits.
func kpairRowsGo(x []uint16, xs, rows int, w []uint16, kn int, out []float32, os int, acc bool) {
	var s [KMajorPanel]float32
	for r := 0; r < rows; r++ {
		o := out[r*os : r*os+KMajorPanel]
		if acc {
			copy(s[:], o)
		} else {
			s = [KMajorPanel]float32{}
		}
		xr := x[r*xs : r*xs+kn]
		for q := 0; q < kn; q += 2 {
			x0, x1 := bf16(xr[q]), bf16(xr[q+1])
			wq := w[q*KMajorPanel : (q+2)*KMajorPanel]
			for c := range s {
				s[c] += x1 * bf16(wq[2*c+1])
				s[c] += x0 * bf16(wq[2*c])
			}
		}
		copy(o, s[:])
	}
}
