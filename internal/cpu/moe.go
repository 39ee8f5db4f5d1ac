package cpu

import (
	"fmt"
	"math"
	"sync"

	"k3/compute"
	"k3/internal/kernel"
)

// MoERoute selects experts by biased sigmoid score, group-limited, and
// weights them by the unbiased scores.
func (b *Backend) MoERoute(a *compute.RouteArgs) error {
	logits, err := f32Of("router logits", a.Logits)
	if err != nil {
		return err
	}
	if a.Logits.Rank != 2 {
		return shapeErr("router logits %v, want [T, E]", a.Logits)
	}
	t, e := a.Logits.Dims[0], a.Logits.Dims[1]
	k := a.TopK
	g, kg, err := a.CheckGroups(e)
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	var bias []float32
	if !a.Bias.IsZero() {
		if bias, err = f32Of("router bias", a.Bias); err != nil {
			return err
		}
		if len(bias) != e {
			return shapeErr("router bias %v for %d experts", a.Bias, e)
		}
	}
	idx, wts := I32(a.Indices), F32(a.Weights)
	if a.Indices.DType != compute.I32 || len(idx) != t*k || len(wts) != t*k {
		return shapeErr("router outputs indices %v weights %v, want [%d, %d]", a.Indices, a.Weights, t, k)
	}
	sc := moeScratchPool.Get().(*moeScratch)
	defer moeScratchPool.Put(sc)
	sc.x = grow(sc.x, 2*e+2*g)
	scratch := sc.x
	if cap(sc.rows) < g {
		sc.rows = make([]int32, g)
	}
	gidx := sc.rows[:g]
	for tok := 0; tok < t; tok++ {
		scores, sel := scratch[:e], scratch[e:2*e]
		copy(scores, logits[tok*e:(tok+1)*e])
		kernel.SigmoidSlice(scores) // Sigmoid's bits, sixteen or eight at a time
		if bias != nil {
			kernel.Add(sel, scores, bias)
		} else {
			copy(sel, scores)
		}
		if g > 1 {
			gs := scratch[2*e : 2*e+g]
			per := e / g
			var top2 [2]int32
			for gi := 0; gi < g; gi++ {
				kernel.TopK(top2[:], nil, sel[gi*per:(gi+1)*per], 2)
				gs[gi] = sel[gi*per+int(top2[0])] + sel[gi*per+int(top2[1])]
			}
			kernel.TopK(gidx, nil, gs, kg)
			keep := scratch[2*e+g : 2*e+2*g]
			clear(keep)
			for _, gi := range gidx[:kg] {
				keep[gi] = 1
			}
			for gi := 0; gi < g; gi++ {
				if keep[gi] == 0 {
					for i := gi * per; i < (gi+1)*per; i++ {
						sel[i] = float32(math.Inf(-1))
					}
				}
			}
		}
		ti, tw := idx[tok*k:(tok+1)*k], wts[tok*k:(tok+1)*k]
		kernel.TopK(ti, nil, sel, k)
		var total float32
		for i, ex := range ti {
			tw[i] = scores[ex]
			total += tw[i]
		}
		scale := a.Scale
		if a.Renormalize {
			scale /= total
		}
		kernel.Scale(tw, scale)
	}
	return nil
}

// moeScratch holds one MoEExperts call's grouping and intermediates.
type moeScratch struct {
	x, h, out []float32 // per (expert, token) row: gathered input, hidden, output
	xb        []uint16  // per row: a product's x rounded to bf16 (kPairs weights)
	rows      []int32   // token of each grouped row
	w         []float32 // routing weight of each grouped row
	start     []int32   // first grouped row of each expert (E+1)
	cur       []int32   // placement cursor per expert
	active    []int32   // experts with rows
	job       expertJob
}

var moeScratchPool = sync.Pool{New: func() any { return new(moeScratch) }}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n, max(n, 2*cap(s)))
	}
	return s[:n]
}

func growI(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n, max(n, 2*cap(s)))
	}
	return s[:n]
}

// expertJob runs whole experts on the workers.
type expertJob struct {
	a          *compute.ExpertArgs
	sc         *moeScratch
	din, inter int
	long       bool // amxMinRows tokens or more: a prefill chunk's (serialMatMul)
	err        error
	errMu      sync.Mutex
}

// MoEExperts runs each selected expert once over all tokens routed to it.
// Tokens are grouped by expert on the caller; then every worker takes
// whole experts (gather, gate and up products, activation, down product),
// so each active expert's weights are read once per call and small experts
// cost no dispatch of their own. In a call of amxMinRows tokens or more
// (a prefill chunk) the products of k-major experts that longOnTiles
// admits run on the AMX tiles, as such a chunk's projections do.
func (b *Backend) MoEExperts(a *compute.ExpertArgs) error {
	x, err := f32Of("expert input", a.X)
	if err != nil {
		return err
	}
	out, err := f32Of("expert output", a.Out)
	if err != nil {
		return err
	}
	if a.X.Rank != 2 {
		return shapeErr("expert input %v, want [T, D]", a.X)
	}
	t, din := a.X.Dims[0], a.X.Dims[1]
	idx, wts := I32(a.Indices), F32(a.Weights)
	if a.Indices.DType != compute.I32 || a.Indices.Rank != 2 || a.Indices.Dims[0] != t || len(wts) != len(idx) || len(out) != t*din {
		return shapeErr("experts: x %v indices %v weights %v out %v", a.X, a.Indices, a.Weights, a.Out)
	}
	ne := len(a.W1)
	if len(a.W3) != ne || len(a.W2) != ne || ne == 0 {
		return shapeErr("experts: %d w1, %d w3, %d w2 tensors", len(a.W1), len(a.W3), len(a.W2))
	}
	inter := a.W1[0].Dim(0)
	k := a.Indices.Dims[1]
	sc := moeScratchPool.Get().(*moeScratch)
	defer moeScratchPool.Put(sc)
	// Counting sort of the (token, slot) pairs by expert.
	sc.start = growI(sc.start, ne+1)
	clear(sc.start)
	for _, ex := range idx {
		if ex == -1 {
			continue // an expert another rank holds
		}
		if ex < 0 || int(ex) >= ne {
			return fmt.Errorf("cpu: experts: expert index %d outside 0..%d", ex, ne-1)
		}
		sc.start[ex+1]++
	}
	sc.active = sc.active[:0]
	for e := 0; e < ne; e++ {
		if sc.start[e+1] > 0 {
			sc.active = append(sc.active, int32(e))
			w1, w3, w2 := a.W1[e], a.W3[e], a.W2[e]
			if w1.Rank != 2 || w1.Dims[1] != din || w1.Dims[0] != inter || w3.Dims != w1.Dims || w2.Rank != 2 || w2.Dims[0] != din || w2.Dims[1] != inter {
				return shapeErr("expert %d: w1 %v w3 %v w2 %v for input width %d", e, w1, w3, w2, din)
			}
		}
		sc.start[e+1] += sc.start[e]
	}
	n := int(sc.start[ne])
	sc.rows, sc.w = growI(sc.rows, n), grow(sc.w, n)
	// Place the pairs in expert order, token order within an expert.
	sc.cur = growI(sc.cur, ne)
	copy(sc.cur, sc.start[:ne])
	for i, ex := range idx {
		if ex < 0 {
			continue
		}
		p := sc.cur[ex]
		sc.cur[ex]++
		sc.rows[p] = int32(i / k)
		sc.w[p] = wts[i]
	}
	sc.x, sc.h, sc.out = grow(sc.x, n*din), grow(sc.h, 2*n*inter), grow(sc.out, n*din)
	sc.xb = sc.xb[:0]
	if b.packing() == kPairs {
		need := n * max(din, inter)
		if cap(sc.xb) < need {
			sc.xb = make([]uint16, need, max(need, 2*cap(sc.xb)))
		}
		sc.xb = sc.xb[:need]
	}
	sc.job = expertJob{a: a, sc: sc, din: din, inter: inter, long: t >= amxMinRows}
	b.pool.Run(expertRange, kernel.Args{Job: &sc.job, X: x}, len(sc.active), 1)
	if sc.job.err != nil {
		return sc.job.err
	}
	clear(out)
	for p := 0; p < n; p++ {
		r := int(sc.rows[p])
		kernel.Axpy(out[r*din:(r+1)*din], sc.w[p], sc.out[p*din:(p+1)*din])
	}
	return nil
}

func expertRange(args *kernel.Args, lo, hi int) {
	j := args.Job.(*expertJob)
	sc, a, din, inter := j.sc, j.a, j.din, j.inter
	x := args.X
	for _, e := range sc.active[lo:hi] {
		r0, r1 := int(sc.start[e]), int(sc.start[e+1])
		m := r1 - r0
		xs := sc.x[r0*din : r1*din]
		for i, r := range sc.rows[r0:r1] {
			copy(xs[i*din:(i+1)*din], x[int(r)*din:(int(r)+1)*din])
		}
		gate := sc.h[2*r0*inter : 2*r0*inter+m*inter]
		up := sc.h[2*r0*inter+m*inter : 2*r1*inter]
		var xb []uint16 // the expert's rows' share of sc.xb
		if len(sc.xb) > 0 {
			wide := max(din, inter)
			xb = sc.xb[r0*wide : r1*wide]
		}
		err := serialMatMul(gate, xs, xb, a.W1[e], m, j.long)
		if err == nil {
			err = serialMatMul(up, xs, xb, a.W3[e], m, j.long)
		}
		if err == nil {
			switch a.Act.Kind {
			case compute.SwiGLU:
				kernel.SwiGLU(gate, gate, up)
			case compute.SiTU:
				kernel.SiTU(gate, gate, up, a.Act.Beta, a.Act.LinearBeta)
			default:
				err = fmt.Errorf("cpu: experts: activation %d: %w", a.Act.Kind, compute.ErrUnsupported)
			}
		}
		if err == nil {
			err = serialMatMul(sc.out[r0*din:r1*din], gate, xb, a.W2[e], m, j.long)
		}
		if err != nil {
			j.errMu.Lock()
			if j.err == nil {
				j.err = err
			}
			j.errMu.Unlock()
			return
		}
	}
}

// serialMatMul computes dst[m, N] = x[m, K] · wᵀ on the calling goroutine.
// A product of a long call (long: amxMinRows tokens or more) of a k-major
// weight that longOnTiles admits runs on the AMX tiles, the weight
// repacked for it alone. Weights in the stored layout (narrower than
// kernel.KMajorMinN, such as the 100M preset's 64x384 experts) stay on
// the dot-form tiles: packing them for every product did not pay
// (docs/bench). A pair-interleaved weight's product rounds x into xb.
func serialMatMul(dst, x []float32, xb []uint16, w compute.Tensor, m int, long bool) error {
	n, k := w.Dims[0], w.Dims[1]
	if wp, how, err := packedOf(w); wp != nil || err != nil {
		switch {
		case err != nil:
		case how == kPairs:
			if len(xb) < m*k {
				xb = make([]uint16, m*k) // only a weight of another backend's making
			}
			kernel.MatMulKPairsSerial(dst, x, wp, xb, m, n, k)
		case how == amxTiles:
			kernel.MatMulAMXSerial(dst, x, wp, m, n, k)
		case long && longOnTiles(how, k):
			kernel.MatMulKMajorAMXSerial(dst, x, wp, m, n, k)
		default:
			kernel.MatMulKMajorSerial(dst, x, wp, m, n, k)
		}
		return err
	}
	switch w.DType {
	case compute.F32:
		kernel.MatMulSerial(dst, x, F32(w), m, n, k)
	case compute.BF16:
		kernel.MatMulBF16Serial(dst, x, U16(w), m, n, k)
	default:
		return fmt.Errorf("cpu: matmul with %v weights: %w", w.DType, compute.ErrUnsupported)
	}
	return nil
}

// matmulHost computes dst[m, N] = x[m, K] · wᵀ on host slices.
func (b *Backend) matmulHost(dst, x []float32, w compute.Tensor, m int) error {
	n, k := w.Dims[0], w.Dims[1]
	if wp, how, err := packedOf(w); wp != nil || err != nil {
		switch {
		case err != nil:
		case how == kPairs:
			b.pool.MatMulKPairs(dst, x, wp, m, n, k)
		case how == amxTiles && b.roundsX(m):
			b.pool.MatMulAMXFast(dst, x, wp, m, n, k)
		case how == amxTiles:
			b.pool.MatMulAMX(dst, x, wp, m, n, k)
		case b.roundsX(m) && longOnTiles(how, k):
			b.pool.MatMulKMajorAMXFast(dst, x, wp, m, n, k)
		case m >= amxMinRows && longOnTiles(how, k):
			b.pool.MatMulKMajorAMX(dst, x, wp, m, n, k)
		default:
			b.pool.MatMulKMajor(dst, x, wp, m, n, k)
		}
		return err
	}
	switch w.DType {
	case compute.F32:
		b.pool.MatMul(dst, x, F32(w), m, n, k)
	case compute.BF16:
		var tiles []uint16
		if m >= amxMinRows {
			tiles = tilesFor(w)
		}
		switch {
		case tiles == nil:
			b.matMulBF16(dst, x, U16(w), m, n, k)
		case pairCopy(w):
			b.pool.MatMulKPairs(dst, x, tiles, m, n, k)
		case b.roundsX(m):
			b.pool.MatMulAMXFast(dst, x, tiles, m, n, k)
		default:
			b.pool.MatMulAMX(dst, x, tiles, m, n, k)
		}
	default:
		return fmt.Errorf("cpu: matmul with %v weights: %w", w.DType, compute.ErrUnsupported)
	}
	return nil
}
