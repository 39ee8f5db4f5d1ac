package cpu

import (
	"fmt"
	"math"
	"sync"

	"k3/compute"
	"k3/internal/floatx"
	"k3/internal/kernel"
)

// MatMul computes dst = x · wᵀ for F32 or BF16 weights.
func (b *Backend) MatMul(dst, x, w compute.Tensor) error {
	if w.Rank != 2 {
		return shapeErr("matmul weight %v is not a matrix", w)
	}
	n, k := w.Dims[0], w.Dims[1]
	if x.Rank == 0 || x.Dim(-1) != k {
		return shapeErr("matmul input %v does not end in %d (weight %v)", x, k, w)
	}
	m := x.Len() / k
	if dst.Len() != m*n || dst.Dim(-1) != n {
		return shapeErr("matmul output %v, want %d rows of %d", dst, m, n)
	}
	xs, err := f32Of("matmul input", x)
	if err != nil {
		return err
	}
	ds, err := f32Of("matmul output", dst)
	if err != nil {
		return err
	}
	return b.matmulHost(ds, xs, w, m)
}

// RMSNorm normalises rows of x.
func (b *Backend) RMSNorm(dst, x, w compute.Tensor, eps float32) error {
	xs, err := f32Of("rmsnorm input", x)
	if err != nil {
		return err
	}
	ds, err := f32Of("rmsnorm output", dst)
	if err != nil {
		return err
	}
	d := x.Dim(-1)
	if len(ds) != len(xs) {
		return shapeErr("rmsnorm output %v for input %v", dst, x)
	}
	var ws []float32
	if !w.IsZero() {
		if ws, err = f32Of("rmsnorm weight", w); err != nil {
			return err
		}
		if len(ws) != d {
			return shapeErr("rmsnorm weight %v for rows of %d", w, d)
		}
	}
	rows := len(xs) / max(d, 1)
	if rows < 32 { // decode: not worth a dispatch
		kernel.RMSNorm(ds, xs, ws, d, eps)
		return nil
	}
	j := normJobPool.Get().(*normJob)
	defer normJobPool.Put(j)
	*j = normJob{dst: ds, x: xs, w: ws, d: d, eps: eps}
	b.pool.Run(rmsRows, kernel.Args{Job: j}, rows, 8)
	return nil
}

// normJob is a row-split RMSNorm: rows are independent.
type normJob struct {
	dst, x, w []float32
	d         int
	eps       float32
}

var normJobPool = sync.Pool{New: func() any { return new(normJob) }}

func rmsRows(args *kernel.Args, lo, hi int) {
	j := args.Job.(*normJob)
	kernel.RMSNorm(j.dst[lo*j.d:hi*j.d], j.x[lo*j.d:hi*j.d], j.w, j.d, j.eps)
}

// LayerNorm normalises rows of x with weight and bias.
func (b *Backend) LayerNorm(dst, x, w, bias compute.Tensor, eps float32) error {
	xs, err := f32Of("layernorm input", x)
	if err != nil {
		return err
	}
	ds, err := f32Of("layernorm output", dst)
	if err != nil {
		return err
	}
	ws, err := f32Of("layernorm weight", w)
	if err != nil {
		return err
	}
	bs, err := f32Of("layernorm bias", bias)
	if err != nil {
		return err
	}
	d := x.Dim(-1)
	if len(ds) != len(xs) || len(ws) != d || len(bs) != d {
		return shapeErr("layernorm x %v dst %v w %v b %v", x, dst, w, bias)
	}
	kernel.LayerNorm(ds, xs, ws, bs, d, eps)
	return nil
}

// Unary applies an elementwise function.
func (b *Backend) Unary(op compute.UnaryOp, dst, x compute.Tensor) error {
	xs, err := f32Of("unary input", x)
	if err != nil {
		return err
	}
	ds, err := f32Of("unary output", dst)
	if err != nil {
		return err
	}
	if len(ds) != len(xs) {
		return shapeErr("unary output %v for input %v", dst, x)
	}
	if op < compute.SiLU || op > compute.Exp {
		return fmt.Errorf("cpu: unary op %d: %w", op, compute.ErrUnsupported)
	}
	if len(xs) < elementwiseMin {
		unarySlice(op, ds, xs)
		return nil
	}
	b.split(&elementwiseJob{unary: op, ds: ds, xs: xs}, unaryRange, len(xs), elementwiseGrain)
	return nil
}

// elementwiseMin is the fewest elements (or, for row-wise operations, rows
// times their width) an elementwise operation splits over the pool: a
// prefill chunk's activations, not a decode step's rows, whose dispatch
// would cost more than the split saves. Every element is computed alone,
// so the split changes no result.
const elementwiseMin = 1 << 15

// elementwiseGrain keeps the pieces of a split whole vectors.
const elementwiseGrain = 64

// elementwiseJob is one split Unary, Binary or AttnResUpdate call; calls
// take one from elementwisePool, so a split allocates nothing.
type elementwiseJob struct {
	unary      compute.UnaryOp
	binary     compute.BinaryOp
	mode       int // binaryColumns, binaryRows or binaryElements
	ds, xs, ys []float32
	width      int // row width, for row-wise operations
	// AttnResUpdate's operands
	q, h, num       []float32
	mx, sum, p      []float32
	delta           []float32
	eps             float32
	addDelta, merge bool      // add the delta to the partial (else copy it); merge the partial
	normed, normW   []float32 // the pre-norm's output (nil: none) and weight
	normEps         float32
}

var elementwisePool = sync.Pool{New: func() any { return new(elementwiseJob) }}

// split runs fn over n items (in pieces of grain) on the pool with a
// pooled copy of j, which it clears afterwards so that the pool holds no
// caller's slices.
func (b *Backend) split(j *elementwiseJob, fn func(*kernel.Args, int, int), n, grain int) {
	pj := elementwisePool.Get().(*elementwiseJob)
	defer elementwisePool.Put(pj)
	*pj = *j
	b.pool.Run(fn, kernel.Args{Job: pj}, n, grain)
	*pj = elementwiseJob{}
}

func unaryRange(a *kernel.Args, lo, hi int) {
	j := a.Job.(*elementwiseJob)
	unarySlice(j.unary, j.ds[lo:hi], j.xs[lo:hi])
}

// unarySlice writes op(xs) to ds (of a supported op).
func unarySlice(op compute.UnaryOp, ds, xs []float32) {
	switch op {
	case compute.SiLU:
		copy(ds, xs)
		kernel.SiLUInPlace(ds)
	case compute.Sigmoid:
		copy(ds, xs)
		kernel.SigmoidSlice(ds)
	case compute.Softplus:
		copy(ds, xs)
		kernel.SoftplusSlice(ds)
	case compute.Exp:
		for i, v := range xs {
			ds[i] = float32(math.Exp(float64(v)))
		}
	}
}

// Binary applies an elementwise operation with row or column
// broadcasting of b.
func (b *Backend) Binary(op compute.BinaryOp, dst, x, y compute.Tensor) error {
	xs, err := f32Of("binary a", x)
	if err != nil {
		return err
	}
	ys, err := f32Of("binary b", y)
	if err != nil {
		return err
	}
	ds, err := f32Of("binary output", dst)
	if err != nil {
		return err
	}
	if len(ds) != len(xs) || len(ys) == 0 {
		return shapeErr("binary a %v, b %v, dst %v", x, y, dst)
	}
	if op < compute.Add || op > compute.Div {
		return fmt.Errorf("cpu: binary op %d: %w", op, compute.ErrUnsupported)
	}
	j := elementwiseJob{binary: op, ds: ds, xs: xs, ys: ys}
	n, grain := 0, 1
	switch {
	case compute.IsColumn(x, y):
		j.mode, j.width, n = binaryColumns, x.Dim(-1), len(ys)
	case len(ys) == len(xs):
		j.mode, n, grain = binaryElements, len(xs), elementwiseGrain
	case len(xs)%len(ys) != 0 || len(ys) != x.Dim(-1):
		return shapeErr("binary a %v, b %v, dst %v", x, y, dst)
	default:
		j.mode, j.width, n = binaryRows, len(ys), len(xs)/len(ys)
	}
	if len(xs) < elementwiseMin {
		binaryPart(&j, 0, n)
		return nil
	}
	b.split(&j, binaryRange, n, grain)
	return nil
}

// How a split Binary's items map to its operands.
const (
	binaryColumns  = iota + 1 // item r: row r of a against b[r]
	binaryRows                // item r: row r of a against all of b
	binaryElements            // item i: element i of a against b[i]
)

func binaryRange(a *kernel.Args, lo, hi int) { binaryPart(a.Job.(*elementwiseJob), lo, hi) }

// binaryPart computes Binary's items [lo, hi).
func binaryPart(j *elementwiseJob, lo, hi int) {
	d := j.width
	switch j.mode {
	case binaryColumns:
		for r := lo; r < hi; r++ {
			binaryScalar(j.binary, j.ds[r*d:(r+1)*d], j.xs[r*d:(r+1)*d], j.ys[r])
		}
	case binaryRows:
		for r := lo; r < hi; r++ {
			binaryVector(j.binary, j.ds[r*d:(r+1)*d], j.xs[r*d:(r+1)*d], j.ys)
		}
	case binaryElements:
		binaryVector(j.binary, j.ds[lo:hi], j.xs[lo:hi], j.ys[lo:hi])
	}
}

// binaryVector is d = op(a, y) element by element.
func binaryVector(op compute.BinaryOp, d, a, y []float32) {
	switch op {
	case compute.Add:
		kernel.Add(d, a, y)
	case compute.Mul:
		kernel.Mul(d, a, y)
	case compute.Sub:
		for i := range d {
			d[i] = a[i] - y[i]
		}
	case compute.Max:
		for i := range d {
			d[i] = max(a[i], y[i])
		}
	case compute.Div:
		for i := range d {
			d[i] = a[i] / y[i]
		}
	}
}

// binaryScalar is dst = op(a, v) for one row and one value.
func binaryScalar(op compute.BinaryOp, dst, a []float32, v float32) {
	for i, x := range a {
		switch op {
		case compute.Add:
			dst[i] = x + v
		case compute.Mul:
			dst[i] = x * v
		case compute.Sub:
			dst[i] = x - v
		case compute.Max:
			dst[i] = max(x, v)
		case compute.Div:
			dst[i] = x / v
		}
	}
}

// GatedAct computes act(gate) * up.
func (b *Backend) GatedAct(act compute.Activation, dst, gate, up compute.Tensor) error {
	gs, err := f32Of("gate", gate)
	if err != nil {
		return err
	}
	us, err := f32Of("up", up)
	if err != nil {
		return err
	}
	ds, err := f32Of("gated output", dst)
	if err != nil {
		return err
	}
	if len(gs) != len(us) || len(ds) != len(gs) {
		return shapeErr("gate %v, up %v, dst %v", gate, up, dst)
	}
	if act.Kind != compute.SwiGLU && act.Kind != compute.SiTU && act.Kind != compute.SigmoidGate {
		return fmt.Errorf("cpu: activation %d: %w", act.Kind, compute.ErrUnsupported)
	}
	if len(gs) < gatedParallel {
		gated(act, ds, gs, us)
		return nil
	}
	// Elementwise, so the pool splits it anywhere: a prefill chunk's dense
	// MLP (256 × 2048 and more) cost milliseconds on one core.
	j := gatedJobPool.Get().(*gatedJob)
	defer gatedJobPool.Put(j)
	j.act = act
	b.pool.Run(gatedRange, kernel.Args{Dst: ds, X: gs, Y: us, Job: j}, len(gs), 64)
	return nil
}

// gatedParallel is the element count from which GatedAct runs on the pool.
const gatedParallel = 8192

type gatedJob struct{ act compute.Activation }

var gatedJobPool = sync.Pool{New: func() any { return new(gatedJob) }}

func gatedRange(a *kernel.Args, lo, hi int) {
	gated(a.Job.(*gatedJob).act, a.Dst[lo:hi], a.X[lo:hi], a.Y[lo:hi])
}

func gated(act compute.Activation, dst, gate, up []float32) {
	switch act.Kind {
	case compute.SwiGLU:
		kernel.SwiGLU(dst, gate, up)
	case compute.SigmoidGate:
		kernel.SigmoidMul(dst, gate, up)
	default:
		kernel.SiTU(dst, gate, up, act.Beta, act.LinearBeta)
	}
}

// Embedding gathers table rows.
func (b *Backend) Embedding(dst, table, ids compute.Tensor) error {
	if table.Rank != 2 {
		return shapeErr("embedding table %v is not a matrix", table)
	}
	vocab, d := table.Dims[0], table.Dims[1]
	is := I32(ids)
	ds, err := f32Of("embedding output", dst)
	if err != nil {
		return err
	}
	if ids.DType != compute.I32 || len(ds) != len(is)*d {
		return shapeErr("embedding of ids %v into %v (width %d)", ids, dst, d)
	}
	for i, id := range is {
		if id < 0 || int(id) >= vocab {
			return fmt.Errorf("cpu: embedding: token id %d outside the vocabulary 0..%d", id, vocab-1)
		}
		out := ds[i*d : (i+1)*d]
		switch table.DType {
		case compute.F32:
			copy(out, F32(table)[int(id)*d:])
		case compute.BF16:
			src := U16(table)[int(id)*d:]
			for j := range out {
				out[j] = floatx.FromBF16(src[j])
			}
		default:
			return fmt.Errorf("cpu: embedding table %v: %w", table.DType, compute.ErrUnsupported)
		}
	}
	return nil
}

// Copy copies src into dst.
func (b *Backend) Copy(dst, src compute.Tensor) error {
	if dst.DType != src.DType || dst.Len() != src.Len() {
		return shapeErr("copy %v into %v", src, dst)
	}
	switch src.DType {
	case compute.F32:
		copy(F32(dst), F32(src))
	case compute.I32:
		copy(I32(dst), I32(src))
	default:
		copy(U16(dst), U16(src))
	}
	return nil
}

// ScatterRows copies row i of src into row idx[i] of dst.
func (b *Backend) ScatterRows(dst, idx, src compute.Tensor) error {
	if dst.Rank == 0 || src.Rank == 0 || dst.DType != src.DType || dst.Len()/max(dst.Dims[0], 1) != src.Len()/max(src.Dims[0], 1) {
		return shapeErr("scatter rows of %v into %v", src, dst)
	}
	n, w := src.Dims[0], src.Len()/max(src.Dims[0], 1)
	if err := compute.CheckShape("scatter indices", idx, compute.I32, n); err != nil {
		return err
	}
	rows := I32(idx)
	for i, r := range rows {
		if r < 0 || int(r) >= dst.Dims[0] {
			return shapeErr("scatter index %d of row %d outside %d rows", r, i, dst.Dims[0])
		}
		for _, q := range rows[:i] {
			if q == r {
				return shapeErr("scatter index %d given to two rows", r)
			}
		}
	}
	for i, r := range rows {
		switch src.DType {
		case compute.F32:
			copy(F32(dst)[int(r)*w:int(r+1)*w], F32(src)[i*w:(i+1)*w])
		case compute.I32:
			copy(I32(dst)[int(r)*w:int(r+1)*w], I32(src)[i*w:(i+1)*w])
		default:
			copy(U16(dst)[int(r)*w:int(r+1)*w], U16(src)[i*w:(i+1)*w])
		}
	}
	return nil
}

// Fill sets every element of dst to v.
func (b *Backend) Fill(dst compute.Tensor, v float32) error {
	switch dst.DType {
	case compute.F32:
		d := F32(dst)
		for i := range d {
			d[i] = v
		}
	case compute.I32:
		d := I32(dst)
		for i := range d {
			d[i] = int32(v)
		}
	case compute.BF16, compute.F16:
		h := floatx.BF16(v)
		if dst.DType == compute.F16 {
			h = floatx.F16(v)
		}
		d := U16(dst)
		for i := range d {
			d[i] = h
		}
	default:
		return shapeErr("fill of %v", dst)
	}
	return nil
}

// headMMScratch holds one head's gathered rows for HeadMatMul.
type headMMScratch struct{ x, y []float32 }

var headMMPool = sync.Pool{New: func() any { return new(headMMScratch) }}

// HeadMatMul multiplies each head's rows by that head's matrix: the head's
// rows are gathered so that each head matrix is read once per call.
func (b *Backend) HeadMatMul(dst, x, w compute.Tensor) error {
	if x.Rank != 3 || w.Rank != 3 || dst.Rank != 3 || w.Dims[0] != x.Dims[1] || w.Dims[2] != x.Dims[2] ||
		dst.Dims[0] != x.Dims[0] || dst.Dims[1] != x.Dims[1] || dst.Dims[2] != w.Dims[1] {
		return shapeErr("head matmul x %v, w %v, dst %v; want [T,H,K], [H,N,K], [T,H,N]", x, w, dst)
	}
	t, h, k, n := x.Dims[0], x.Dims[1], x.Dims[2], w.Dims[1]
	xs, err := f32Of("head matmul input", x)
	if err != nil {
		return err
	}
	ds, err := f32Of("head matmul output", dst)
	if err != nil {
		return err
	}
	if w.DType != compute.F32 && w.DType != compute.BF16 {
		return fmt.Errorf("cpu: head matmul with %v weights: %w", w.DType, compute.ErrUnsupported)
	}
	// One work item per head: a decode step's heads are small products, and
	// one dispatch for all of them costs less than one per head.
	j := headJobPool.Get().(*headJob)
	defer headJobPool.Put(j)
	*j = headJob{xs: xs, ds: ds, w: w, t: t, h: h, k: k, n: n}
	if t >= amxMinRows {
		j.kmaj = b.headCopyOf(w)
	}
	b.pool.Run(headHeads, kernel.Args{Job: j}, h, 1)
	*j = headJob{}
	return nil
}

// headJob is one HeadMatMul call, shared by the workers.
type headJob struct {
	xs, ds     []float32
	w          compute.Tensor
	t, h, k, n int
	kmaj       []uint16 // the heads' k-major copy for a long call, or nil
}

// headCopy is the k-major form of a per-head bf16 weight [H, N, K], head
// after head, made by its first call of amxMinRows rows or more (a
// prefill chunk's absorbed queries and lifted values): such a call then
// runs each head as a k-major product, one FMA chain per output as the
// prepared weights' long products (PrepareMatMul's kmajCopy), faster than
// the dot-form tiles at those row counts (docs/bench). Shorter calls keep
// the stored weight, so decode batches and scheduler passes keep their
// bits.
type headCopy struct {
	once    sync.Once
	h, n, k int
	packed  []uint16
}

// headCopyOf returns the k-major copy of head weight w where the backend
// lays bf16 weights out k-major and w's heads are wide enough for it
// (kmajCopy), making it on first use; else nil. The copy belongs to w's
// storage, whole: a view of part of it, or of another shape than the
// first one asked for, gets none.
func (b *Backend) headCopyOf(w compute.Tensor) []uint16 {
	h, n, k := w.Dims[0], w.Dims[1], w.Dims[2]
	buf, ok := w.Mem.(*buffer)
	if !ok || b.packing() != kMajor || w.DType != compute.BF16 || len(buf.u16) != h*n*k || !kmajCopy(n) {
		return nil
	}
	b.tapsMu.Lock()
	if buf.heads == nil {
		buf.heads = &headCopy{h: h, n: n, k: k}
	}
	hc := buf.heads
	b.tapsMu.Unlock()
	if hc.h != h || hc.n != n || hc.k != k {
		return nil
	}
	hc.once.Do(func() {
		per := kernel.KMajorLen(n, k)
		hc.packed = make([]uint16, h*per)
		for hh := range h {
			kernel.PackKMajor(hc.packed[hh*per:(hh+1)*per], buf.u16[hh*n*k:(hh+1)*n*k], n, k)
		}
	})
	return hc.packed
}

var headJobPool = sync.Pool{New: func() any { return new(headJob) }}

// headHeads computes heads [lo, hi): each head's rows gathered, one serial
// product (the arithmetic of MatMul: results do not depend on how the
// heads are spread), the outputs scattered.
func headHeads(args *kernel.Args, lo, hi int) {
	j := args.Job.(*headJob)
	t, h, k, n := j.t, j.h, j.k, j.n
	sc := headMMPool.Get().(*headMMScratch)
	defer headMMPool.Put(sc)
	sc.x, sc.y = grow(sc.x, t*k), grow(sc.y, t*n)
	for hh := lo; hh < hi; hh++ {
		for r := 0; r < t; r++ {
			copy(sc.x[r*k:(r+1)*k], j.xs[(r*h+hh)*k:])
		}
		wh := j.w.Rows(hh, hh+1).Reshape(n, k)
		if j.kmaj != nil {
			per := kernel.KMajorLen(n, k)
			kernel.MatMulKMajorSerial(sc.y, sc.x, j.kmaj[hh*per:(hh+1)*per], t, n, k)
		} else if j.w.DType == compute.BF16 {
			kernel.MatMulBF16Serial(sc.y, sc.x, U16(wh), t, n, k)
		} else {
			kernel.MatMulSerial(sc.y, sc.x, F32(wh), t, n, k)
		}
		for r := 0; r < t; r++ {
			copy(j.ds[(r*h+hh)*n:(r*h+hh+1)*n], sc.y[r*n:(r+1)*n])
		}
	}
}

// RoPE rotates rows of X in place.
func (b *Backend) RoPE(a *compute.RopeArgs) error {
	x, err := f32Of("rope input", a.X)
	if err != nil {
		return err
	}
	pos := I32(a.Pos)
	if a.X.Rank < 2 || a.Pos.DType != compute.I32 || pos == nil || len(pos) != a.X.Dims[0] {
		return shapeErr("rope input %v with positions %v", a.X, a.Pos)
	}
	for t, p := range pos {
		if p < 0 || int(p) >= a.MaxPos {
			return fmt.Errorf("%w: rope position %d of row %d outside [0, %d)", compute.ErrShape, p, t, a.MaxPos)
		}
	}
	d := a.X.Dim(-1)
	r := a.Dims
	if r == 0 {
		r = d
	}
	if r > d || r%2 != 0 || (a.Freqs == nil && !(a.Theta > 0)) || (a.Freqs != nil && len(a.Freqs) != r/2) {
		return fmt.Errorf("cpu: rope over %d of %d dims with theta %g and %d frequencies", r, d, a.Theta, len(a.Freqs))
	}
	scale := a.Scale
	if scale == 0 {
		scale = 1
	}
	perRow := len(x) / a.X.Dims[0]
	for t, p := range pos {
		rows := x[t*perRow : (t+1)*perRow]
		for i := 0; i < r/2; i++ {
			sin, cos := math.Sincos(a.Angle(p, i, r))
			s, c := float32(sin*scale), float32(cos*scale)
			for off := 0; off < len(rows); off += d {
				i0, i1 := off+i, off+i+r/2
				if a.Interleaved {
					i0, i1 = off+2*i, off+2*i+1
				}
				u, v := rows[i0], rows[i1]
				rows[i0], rows[i1] = u*c-v*s, u*s+v*c
			}
		}
	}
	return nil
}
