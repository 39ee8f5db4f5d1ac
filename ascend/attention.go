package ascend

import (
	"fmt"

	"k3/compute"
)

// Attention implements compute.Backend as a composition of aclnn
// operators, a block of query rows at a time. Each row attends to W
// candidate positions: every cached position below MaxPos (or KVLen;
// dense), or the Kn positions its index list names (sparse), whose keys,
// values and rope keys are gathered by aclnnIndexSelect. A validity mask V
// over the candidates, built on the device from the positions tensor
// (dense: s ≤ pos) and the indices (sparse: an index x is valid when
// 0 ≤ x ≤ lim, lim the row's last visible position), with ind(y ≥ 0) =
// ReLU(y+1) − ReLU(y) for integer y, turns the softmax into
//
//	Z = scale·(Q·Kᵀ + Q_r·K_rᵀ) + (V − 1)·2¹⁰⁰   (aclnnMatmul or BatchMatMul)
//	m = max Z (aclnnAmax),  E = exp(Z − m)·V,  s = E·1
//	Out = (E / max(s, 2⁻¹⁰⁰))·Val,  LSE = m + log s
//
// so a row with nothing valid gets zeros and LSE −∞, as the pure-Go
// backend gives. A paged cache is first gathered into contiguous scratch:
// its first KVLen rows, or, for causal attention, every row of its pages
// (the rows past a query's position are masked, and so the shapes follow
// the pages, not the length: a decode step can be captured while its
// pages stay; the queries' positions are below KVLen, as their own keys
// are cached).
// An index past KVLen is skipped like −1 (the pure-Go backend refuses one
// past the cache, which the device cannot see without a read).
// aclnnSparseFlashAttention replaces all this on a device that has it,
// when the backend was opened with Options.FusedAttention (fused.go).
func (b *Backend) Attention(a *compute.AttnArgs) error {
	g, err := attnShape(a)
	if err != nil {
		return err
	}
	if g.t == 0 {
		return nil
	}
	b.lock()
	defer b.mu.Unlock()
	if b.attentionFusable(a, g) {
		return b.fusedAttend(a, g)
	}
	r := attnRun{b: b, a: a, g: g}
	if err := r.caches(); err != nil {
		return fmt.Errorf("ascend: attention: %w", err)
	}
	defer r.release()
	rb := max(1, min(g.t, attnBudget/r.rowFloats()))
	for r0 := 0; r0 < g.t; r0 += rb {
		if err := r.block(r0, min(rb, g.t-r0)); err != nil {
			return fmt.Errorf("ascend: attention, rows %d..%d: %w", r0, min(r0+rb, g.t)-1, err)
		}
	}
	return nil
}

// attnBudget bounds one block's scratch, in float32 elements.
var attnBudget = 1 << 22

// attnBig pushes an invalid candidate's score far below every valid one;
// attnTiny keeps an empty row's division finite.
const (
	attnBig  = 0x1p100
	attnTiny = 0x1p-100
)

// attnGeom is an Attention call's geometry.
type attnGeom struct {
	t, hq, hkv, dk, dv, dr int
	l                      int // cache rows
	// seen is the rows the composition reads: KVLen, or every row of a
	// paged cache's pages when causal (the rows past a query's position
	// are masked anyway), which keeps a decode step's shapes fixed while
	// its pages are, so that it can be captured.
	seen           int
	lists, kn      int // sparse: index lists per row and entries per list; lists 0: dense
	paged, vShared bool
	pooled         bool // the pages are rows of pools a page table names
}

// attnShape checks a's operands as the pure-Go backend does.
func attnShape(a *compute.AttnArgs) (attnGeom, error) {
	var g attnGeom
	if a.Q.Rank != 3 || a.Q.DType != compute.F32 {
		return g, fmt.Errorf("%w: attention q %v, want f32 [T, Hq, Dk]", compute.ErrShape, a.Q)
	}
	g.t, g.hq, g.dk = a.Q.Dims[0], a.Q.Dims[1], a.Q.Dims[2]
	g.pooled = a.KPages == nil && !a.PageTable.IsZero()
	g.paged = a.KPages != nil || g.pooled
	if g.pooled {
		k, v := a.KPool, a.VPool
		if k.Rank != 3 || k.DType != compute.F32 || k.Dims[2] != g.dk || a.PageSize <= 0 || k.Dims[0]%a.PageSize != 0 ||
			a.PageTable.DType != compute.I32 || a.PageTable.Rank != 1 {
			return g, fmt.Errorf("%w: attention key pool %v and page table %v for q %v and page size %d", compute.ErrShape, k, a.PageTable, a.Q, a.PageSize)
		}
		if a.PageSize%64 != 0 {
			return g, fmt.Errorf("ascend: attention: page size %d is not a multiple of 64", a.PageSize)
		}
		g.hkv, g.dv, g.l, g.vShared = k.Dims[1], g.dk, a.PageTable.Len()*a.PageSize, v.IsZero()
		if !g.vShared {
			if v.Rank != 3 || v.DType != compute.F32 || v.Dims[0] != k.Dims[0] || v.Dims[1] != g.hkv {
				return g, fmt.Errorf("%w: attention value pool %v for key pool %v", compute.ErrShape, v, k)
			}
			g.dv = v.Dims[2]
		}
	} else if g.paged {
		k0 := a.KPages[0]
		if k0.Rank != 3 || k0.DType != compute.F32 || k0.Dims[0] != a.PageSize || k0.Dims[2] != g.dk {
			return g, fmt.Errorf("%w: attention key pages %v for q %v and page size %d", compute.ErrShape, k0, a.Q, a.PageSize)
		}
		if a.PageSize <= 0 || a.PageSize%64 != 0 {
			return g, fmt.Errorf("ascend: attention: page size %d is not a multiple of 64", a.PageSize)
		}
		g.hkv, g.dv, g.l, g.vShared = k0.Dims[1], g.dk, len(a.KPages)*a.PageSize, a.VPages == nil
		if !g.vShared {
			v0 := a.VPages[0]
			if len(a.VPages) != len(a.KPages) || v0.Rank != 3 || v0.DType != compute.F32 || v0.Dims[0] != a.PageSize || v0.Dims[1] != g.hkv {
				return g, fmt.Errorf("%w: attention value pages (%d of %v) for %d key pages of %v", compute.ErrShape, len(a.VPages), v0, len(a.KPages), k0)
			}
			g.dv = v0.Dims[2]
		}
		for i := range a.KPages {
			if a.KPages[i].Len() != k0.Len() || (!g.vShared && a.VPages[i].Len() != a.VPages[0].Len()) {
				return g, fmt.Errorf("%w: attention page %d differs from page 0", compute.ErrShape, i)
			}
		}
	} else {
		if a.K.Rank != 3 || a.V.Rank != 3 || a.K.DType != compute.F32 || a.V.DType != compute.F32 {
			return g, fmt.Errorf("%w: attention k %v v %v, want f32 rank 3", compute.ErrShape, a.K, a.V)
		}
		g.hkv, g.dv, g.l = a.K.Dims[1], a.V.Dims[2], a.K.Dims[0]
		if a.K.Dims[2] != g.dk || a.V.Dims[0] != g.l || a.V.Dims[1] != g.hkv {
			return g, fmt.Errorf("%w: attention q %v k %v v %v", compute.ErrShape, a.Q, a.K, a.V)
		}
		g.vShared = a.K.Mem == a.V.Mem && a.K.Off == a.V.Off && g.dk == g.dv
	}
	if g.hkv == 0 || g.hq%g.hkv != 0 {
		return g, fmt.Errorf("%w: attention: %d query heads over %d kv heads", compute.ErrShape, g.hq, g.hkv)
	}
	if !a.QRope.IsZero() {
		g.dr = a.QRope.Dim(-1)
		if a.QRope.Rank != 3 || a.QRope.DType != compute.F32 || a.QRope.Dims[0] != g.t || a.QRope.Dims[1] != g.hq {
			return g, fmt.Errorf("%w: attention q rope %v for q %v", compute.ErrShape, a.QRope, a.Q)
		}
		if g.pooled {
			if a.KRopePool.DType != compute.F32 || a.KRopePool.Len() != a.KPool.Dims[0]*g.dr {
				return g, fmt.Errorf("%w: attention: rope key pool %v for a key pool of %d rows and rope width %d", compute.ErrShape, a.KRopePool, a.KPool.Dims[0], g.dr)
			}
		} else if g.paged {
			if len(a.KRopePages) != len(a.KPages) || a.KRopePages[0].DType != compute.F32 || a.KRopePages[0].Len() != a.PageSize*g.dr {
				return g, fmt.Errorf("%w: attention: %d rope key pages for %d key pages of %d×%d", compute.ErrShape, len(a.KRopePages), len(a.KPages), a.PageSize, g.dr)
			}
		} else if a.KRope.Rank != 2 || a.KRope.DType != compute.F32 || a.KRope.Dims[0] != g.l || a.KRope.Dims[1] != g.dr {
			return g, fmt.Errorf("%w: attention rope keys %v, want [%d, %d]", compute.ErrShape, a.KRope, g.l, g.dr)
		}
	}
	if a.KVLen < 0 || a.KVLen > g.l {
		return g, fmt.Errorf("ascend: attention: kv length %d outside the cache of %d", a.KVLen, g.l)
	}
	g.seen = a.KVLen
	if g.paged && a.Causal {
		g.seen = g.l
	}
	if a.QPos.DType != compute.I32 || dims(a.QPos) != g.t || a.MaxPos < 0 {
		return g, fmt.Errorf("%w: attention: query positions %v below %d for %d rows", compute.ErrShape, a.QPos, a.MaxPos, g.t)
	}
	if err := compute.CheckShape("attention output", a.Out, compute.F32, g.t, g.hq, g.dv); err != nil {
		return g, err
	}
	if !a.LSE.IsZero() {
		if err := compute.CheckShape("attention lse", a.LSE, compute.F32, g.t, g.hq); err != nil {
			return g, err
		}
	}
	if !a.Indices.IsZero() {
		ix := a.Indices
		if ix.Rank != 3 || ix.Dims[0] != g.t || (ix.Dims[1] != g.hkv && ix.Dims[1] != 1) || ix.DType != compute.I32 || ix.Dims[2] == 0 {
			return g, fmt.Errorf("%w: attention indices %v, want I32 [%d, %d or 1, K]", compute.ErrShape, ix, g.t, g.hkv)
		}
		g.lists, g.kn = ix.Dims[1], ix.Dims[2]
	}
	return g, nil
}

// attnRun is one Attention call in progress; b.mu is held.
type attnRun struct {
	b *Backend
	a *compute.AttnArgs
	g attnGeom
	// The caches as contiguous rows: [l, hkv·dk], [l, hkv·dv], [l, dr].
	k, v, kr compute.Tensor
	owned    []*devBuf // scratch to free at the end
}

func (r *attnRun) release() {
	for _, d := range r.owned {
		r.b.freeBuf(d)
	}
}

// scratch allocates n elements of dt freed when the call ends.
func (r *attnRun) scratch(dt compute.DType, n int) (compute.Tensor, error) {
	t, err := r.b.allocTensor(dt, max(n, 1))
	if err != nil {
		return t, err
	}
	r.owned = append(r.owned, t.Mem.(*devBuf))
	return t, nil
}

// caches sets k, v and kr, gathering a paged cache's first g.seen rows.
func (r *attnRun) caches() error {
	a, g := r.a, r.g
	if !g.paged {
		r.k, r.v, r.kr = a.K, a.V, a.KRope
		return nil
	}
	n := g.seen
	// A kind's rows into scratch: whole pages by the table on the device
	// when the pages are rows of a pool, else the first n rows page by
	// page.
	gather := func(pages []compute.Tensor, pool compute.Tensor, width int) (compute.Tensor, error) {
		if g.pooled {
			dst, err := r.scratch(compute.F32, g.l*width)
			if err != nil {
				return dst, err
			}
			return dst, r.b.gatherPages(dst, pool, a.PageTable, a.PageSize*width)
		}
		dst, err := r.scratch(compute.F32, n*width)
		if err != nil {
			return dst, err
		}
		for p := 0; p*a.PageSize < n; p++ {
			rows := min(a.PageSize, n-p*a.PageSize)
			d := dst
			d.Off += p * a.PageSize * width
			if err := r.copyOp(operand{t: d, view: i64(rows, width)}, operand{t: pages[p], view: i64(rows, width)}); err != nil {
				return dst, err
			}
		}
		return dst, nil
	}
	var err error
	if r.k, err = gather(a.KPages, a.KPool, g.hkv*g.dk); err != nil {
		return err
	}
	r.v = r.k
	if !g.vShared {
		if r.v, err = gather(a.VPages, a.VPool, g.hkv*g.dv); err != nil {
			return err
		}
	}
	if g.dr > 0 {
		r.kr, err = gather(a.KRopePages, a.KRopePool, g.dr)
	}
	return err
}

// rowFloats is the scratch one query row needs.
func (r *attnRun) rowFloats() int {
	g := r.g
	w, lists := g.seen, 1
	if g.lists > 0 {
		w, lists = g.kn, g.lists
	}
	n := 2*g.hq*w + 3*lists*w + 4*g.hq + 1
	if g.lists > 0 {
		n += lists * w * (g.hkv*g.dk + g.hkv*g.dv + g.dr)
	}
	return n
}

// Operator helpers; b.mu is held.

func (r *attnRun) copyOp(dst, src operand) error {
	return r.b.run(func(ts []tensorDesc) (prepared, error) { return r.b.drv.inplaceCopy(ts[0], ts[1]) }, dst, src)
}

func (r *attnRun) mm(name string, x, w, out operand) error {
	return r.b.run(func(ts []tensorDesc) (prepared, error) { return r.b.drv.matmul(name, ts[0], ts[1], ts[2], 0) }, x, w, out)
}

// cnst is a one-element constant v, broadcast by the elementwise operators.
func (r *attnRun) cnst(v float32) (operand, error) {
	t, err := r.b.constOf(1, v)
	return operand{t: t, view: i64(1)}, err
}

// view is t from element off, viewed as shape with strides (nil: contiguous).
func view(t compute.Tensor, off int, shape, strides []int64) operand {
	t.Off += off
	return operand{t: t, view: shape, strides: strides}
}

// block runs rows r0..r0+n−1.
func (r *attnRun) block(r0, n int) error {
	a, g := r.a, r.g
	hq, hkv := g.hq, g.hkv
	sparse := g.lists > 0
	lists, w := 1, 0
	if sparse {
		lists, w = g.lists, g.kn
	} else {
		// Every position below the bound: the positions are on the device.
		w = g.seen
		if a.MaxPos > 0 {
			w = min(w, a.MaxPos)
		}
	}
	lw := lists * w // candidates per row
	f, err := r.b.allocTensor(compute.F32, 2*n*hq*w+3*n*lw+3*n*hq+n)
	if err != nil {
		return err
	}
	defer r.b.freeBuf(f.Mem.(*devBuf))
	S, S2 := part(f, 0, n*hq*w), part(f, n*hq*w, n*hq*w)
	valid, bias, tmp := part(f, 2*n*hq*w, n*lw), part(f, 2*n*hq*w+n*lw, n*lw), part(f, 2*n*hq*w+2*n*lw, n*lw)
	m, sum, lg := part(f, 2*n*hq*w+3*n*lw, n*hq), part(f, 2*n*hq*w+3*n*lw+n*hq, n*hq), part(f, 2*n*hq*w+3*n*lw+2*n*hq, n*hq)
	lim := part(f, 2*n*hq*w+3*n*lw+3*n*hq, n)
	one, err := r.cnst(1)
	if err != nil {
		return err
	}

	// The candidates' keys, values and rope keys, each [n·lw, width].
	k, v, kr := r.k, r.v, r.kr
	if sparse {
		if err := r.validSparse(r0, n, valid, bias, tmp, part(S, 0, n*lw), part(S2, 0, n*lw), lim, one); err != nil {
			return err
		}
		ints, err := r.b.allocTensor(compute.I32, n*lw)
		if err != nil {
			return err
		}
		defer r.b.freeBuf(ints.Mem.(*devBuf))
		// bias holds the clamped indices as floats.
		if err := r.b.run(func(ts []tensorDesc) (prepared, error) { return r.b.drv.cast(ts[0], aclType(compute.I32), ts[1]) },
			view(bias, 0, i64(n*lw), nil), view(ints, 0, i64(n*lw), nil)); err != nil {
			return err
		}
		sel, err := r.b.allocTensor(compute.F32, n*lw*(hkv*g.dk+hkv*g.dv+g.dr))
		if err != nil {
			return err
		}
		defer r.b.freeBuf(sel.Mem.(*devBuf))
		gather := func(src compute.Tensor, width, off int) (compute.Tensor, error) {
			dst := part(sel, off, n*lw*width)
			err := r.b.run(func(ts []tensorDesc) (prepared, error) { return r.b.drv.indexSelect(ts[0], 0, ts[1], ts[2]) },
				view(src, 0, i64(g.seen, width), nil), view(ints, 0, i64(n*lw), nil), view(dst, 0, i64(n*lw, width), nil))
			return dst, err
		}
		if k, err = gather(r.k, hkv*g.dk, 0); err != nil {
			return err
		}
		v = k
		if !g.vShared {
			if v, err = gather(r.v, hkv*g.dv, n*lw*hkv*g.dk); err != nil {
				return err
			}
		}
		if g.dr > 0 {
			if kr, err = gather(r.kr, g.dr, n*lw*(hkv*g.dk+hkv*g.dv)); err != nil {
				return err
			}
		}
	} else if err := r.validDense(r0, n, w, valid, bias, tmp, lim, one); err != nil {
		return err
	}
	// bias = (valid − 1)·2¹⁰⁰
	if err := r.b.opAdd(view(valid, 0, i64(n*lw), nil), one, view(bias, 0, i64(n*lw), nil), -1); err != nil {
		return err
	}
	if err := r.b.opMuls(view(bias, 0, i64(n*lw), nil), attnBig, view(bias, 0, i64(n*lw), nil)); err != nil {
		return err
	}

	// Scores S [n, hq, w].
	if err := r.scores(r0, n, w, S, k, a.Q, g.dk, hkv); err != nil {
		return err
	}
	if g.dr > 0 {
		if err := r.scores(r0, n, w, S2, kr, a.QRope, g.dr, 0); err != nil {
			return err
		}
		if err := r.b.opAdd(view(S, 0, i64(n*hq*w), nil), view(S2, 0, i64(n*hq*w), nil), view(S, 0, i64(n*hq*w), nil), 1); err != nil {
			return err
		}
	}

	// The masked softmax, over S viewed [n, lists, hq/lists, w] against
	// the mask [n, lists, 1, w].
	rows := view(S, 0, i64(n*hq, w), nil)
	col := func(t compute.Tensor) operand { return view(t, 0, i64(n*hq, 1), nil) }
	S4 := view(S, 0, i64(n, lists, hq/lists, w), nil)
	mask4 := func(t compute.Tensor) operand { return view(t, 0, i64(n, lists, 1, w), nil) }
	ones, err := r.b.constOf(w, 1)
	if err != nil {
		return err
	}
	tiny, err := r.cnst(attnTiny)
	if err != nil {
		return err
	}
	steps := []func() error{
		func() error { return r.b.opMuls(rows, a.Scale, rows) },
		func() error { return r.b.opAdd(S4, mask4(bias), S4, 1) },
		func() error {
			return r.b.run(func(ts []tensorDesc) (prepared, error) { return r.b.drv.amax(ts[0], ts[1]) }, rows, col(m))
		},
		func() error { return r.b.opAdd(rows, col(m), rows, -1) },
		func() error { return r.b.opUnary("aclnnExp", rows, rows) },
		func() error { return r.b.opBinary("aclnnMul", S4, mask4(valid), S4) },
		func() error { return r.mm("aclnnMatmul", rows, view(ones, 0, i64(w, 1), nil), col(sum)) },
	}
	if !a.LSE.IsZero() {
		steps = append(steps,
			func() error { return r.b.opUnary("aclnnLog", col(sum), col(lg)) },
			func() error { return r.b.opAdd(col(m), col(lg), view(a.LSE, r0*hq, i64(n*hq, 1), nil), 1) })
	}
	steps = append(steps,
		func() error { return r.b.opBinary("aclnnMaximum", col(sum), tiny, col(sum)) },
		func() error { return r.b.opBinary("aclnnDiv", rows, col(sum), rows) },
		func() error { return r.values(r0, n, w, S, v) })
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// validSparse sets valid [n, lists·kn] to 1 where rows r0.. have a usable
// index x (0 ≤ x ≤ lim) and to 0 elsewhere, and idx to the indices as
// floats with the unusable ones replaced by 0; t1, t2, t3 (n·lists·kn
// each) and lim (n) are scratch.
func (r *attnRun) validSparse(r0, n int, valid, idx, t1, t2, t3, lim compute.Tensor, one operand) error {
	a, g := r.a, r.g
	lw := g.lists * g.kn
	if err := r.limits(r0, n, lim, r.a.Causal); err != nil {
		return err
	}
	mat := func(t compute.Tensor) operand { return view(t, 0, i64(n, lw), nil) }
	x, v, tmp, d, u := mat(idx), mat(valid), mat(t1), mat(t2), mat(t3)
	// ind writes ind(y ≥ 0) = ReLU(y+1) − ReLU(y) for the integers y.
	ind := func(y, dst operand) []func() error {
		return []func() error{
			func() error { return r.b.opAdd(y, one, dst, 1) },
			func() error { return r.b.opUnary("aclnnRelu", dst, dst) },
			func() error { return r.b.opUnary("aclnnRelu", y, tmp) },
			func() error { return r.b.opAdd(dst, tmp, dst, -1) },
		}
	}
	steps := []func() error{
		func() error {
			return r.b.run(func(ts []tensorDesc) (prepared, error) { return r.b.drv.cast(ts[0], aclType(compute.F32), ts[1]) },
				view(a.Indices, r0*lw, i64(n, lw), nil), x)
		},
	}
	steps = append(steps, ind(x, v)...) // x ≥ 0
	steps = append(steps, func() error { return r.b.opAdd(view(lim, 0, i64(n, 1), nil), x, d, -1) })
	steps = append(steps, ind(d, u)...) // lim − x ≥ 0
	steps = append(steps,
		func() error { return r.b.opBinary("aclnnMul", v, u, v) },
		func() error { return r.b.opBinary("aclnnMul", x, v, x) })
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// scores writes S [n, hq, w] = Q·Kᵀ for rows r0.. over the candidate keys
// k of width d per kv head: the cache's first w rows [w, heads·d]
// (dense) or the gathered candidates [n, lists, kn, heads·d] (sparse).
// heads is the key's head count (0: one key shared by every query head,
// the rope part).
func (r *attnRun) scores(r0, n, w int, S, k, q compute.Tensor, d, heads int) error {
	g := r.g
	hq := g.hq
	kh := max(heads, 1) // heads in a key row
	if g.lists == 0 {
		if heads <= 1 { // every query head reads the same key row: one matmul
			return r.mm("aclnnMatmul", view(q, r0*hq*d, i64(n*hq, d), nil), view(k, 0, i64(d, w), i64(1, d)), view(S, 0, i64(n*hq, w), nil))
		}
		hg := hq / heads
		for h := range hq {
			if err := r.mm("aclnnMatmul", view(q, (r0*hq+h)*d, i64(n, d), i64(hq*d, 1)),
				view(k, (h/hg)*d, i64(d, w), i64(1, kh*d)), view(S, h*w, i64(n, w), i64(hq*w, 1))); err != nil {
				return err
			}
		}
		return nil
	}
	// Sparse: one BatchMatMul over the rows per index list and kv head.
	lists, kn := g.lists, g.kn
	groups := max(heads, lists) // query-head groups that read one (list, key head)
	hg := hq / groups
	for gi := range groups {
		list, kvh := gi%lists, 0 // lists is 1 or groups
		if heads > 1 {
			kvh = gi
		}
		if err := r.mm("aclnnBatchMatMul",
			view(q, (r0*hq+gi*hg)*d, i64(n, hg, d), i64(hq*d, d, 1)),
			view(k, (list*kn*kh+kvh)*d, i64(n, d, kn), i64(lists*kn*kh*d, 1, kh*d)),
			view(S, gi*hg*kn, i64(n, hg, kn), i64(hq*kn, kn, 1))); err != nil {
			return err
		}
	}
	return nil
}

// values writes Out for rows r0.. from the probabilities P [n, hq, w] and
// the candidate values v, laid out as scores reads keys.
func (r *attnRun) values(r0, n, w int, P, v compute.Tensor) error {
	a, g := r.a, r.g
	hq, hkv, dv := g.hq, g.hkv, g.dv
	hg := hq / hkv
	if g.lists == 0 {
		if hkv == 1 {
			return r.mm("aclnnMatmul", view(P, 0, i64(n*hq, w), nil), view(v, 0, i64(w, dv), nil), view(a.Out, r0*hq*dv, i64(n*hq, dv), nil))
		}
		for h := range hq {
			if err := r.mm("aclnnMatmul", view(P, h*w, i64(n, w), i64(hq*w, 1)),
				view(v, (h/hg)*dv, i64(w, dv), i64(hkv*dv, 1)), view(a.Out, (r0*hq+h)*dv, i64(n, dv), i64(hq*dv, 1))); err != nil {
				return err
			}
		}
		return nil
	}
	lists, kn := g.lists, g.kn
	for kvh := range hkv {
		list := 0
		if lists > 1 {
			list = kvh
		}
		if err := r.mm("aclnnBatchMatMul",
			view(P, kvh*hg*kn, i64(n, hg, kn), i64(hq*kn, kn, 1)),
			view(v, (list*kn*hkv+kvh)*dv, i64(n, kn, dv), i64(lists*kn*hkv*dv, hkv*dv, 1)),
			view(a.Out, (r0*hq+kvh*hg)*dv, i64(n, hg, dv), i64(hq*dv, dv, 1))); err != nil {
			return err
		}
	}
	return nil
}

// limits writes each of rows r0..r0+n−1's last visible position into lim
// (n, as floats): min(pos, c) when causal, c = KVLen−1 otherwise (the
// last of the rows the composition reads), from the positions tensor on
// the device. c is read from the backend's 0, 1, 2, ... at offset c, so
// no constant is made per cache length, and min(x, c) = c − ReLU(c − x).
func (r *attnRun) limits(r0, n int, lim compute.Tensor, causal bool) error {
	a := r.a
	l := view(lim, 0, i64(n), nil)
	last := r.g.seen - 1
	ar, err := r.b.iota(r.g.seen)
	if err != nil {
		return err
	}
	c := view(ar, last, i64(1), nil)
	var steps []func() error
	if causal {
		steps = []func() error{
			func() error { return r.b.opCast(view(a.QPos, r0, i64(n), nil), compute.F32, l) },
			func() error { return r.b.opAdd(c, l, l, -1) }, // c − x
			func() error { return r.b.opUnary("aclnnRelu", l, l) },
			func() error { return r.b.opAdd(c, l, l, -1) },
		}
	} else {
		zero, err := r.b.scalar(0)
		if err != nil {
			return err
		}
		steps = []func() error{
			func() error {
				return r.b.run(func(ts []tensorDesc) (prepared, error) { return r.b.drv.fill(ts[0], zero) }, l)
			},
			func() error { return r.b.opAdd(l, c, l, 1) },
		}
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// validDense sets valid [n, w] to ind(s ≤ pos) for rows r0.. (dense
// attention is causal) and the candidate positions s < w: with d = pos − s
// (over the backend's 0, 1, 2, ...), ind(d ≥ 0) = ReLU(d+1) − ReLU(d). d
// and t (n·w) and lim (n) are scratch.
func (r *attnRun) validDense(r0, n, w int, valid, d, t, lim compute.Tensor, one operand) error {
	if err := r.limits(r0, n, lim, true); err != nil {
		return err
	}
	ar, err := r.b.iota(w)
	if err != nil {
		return err
	}
	mat := func(x compute.Tensor) operand { return view(x, 0, i64(n, w), nil) }
	for _, f := range []func() error{
		func() error { return r.b.opAdd(view(lim, 0, i64(n, 1), nil), view(ar, 0, i64(1, w), nil), mat(d), -1) },
		func() error { return r.b.opAdd(mat(d), one, mat(valid), 1) },
		func() error { return r.b.opUnary("aclnnRelu", mat(valid), mat(valid)) },
		func() error { return r.b.opUnary("aclnnRelu", mat(d), mat(t)) },
		func() error { return r.b.opAdd(mat(valid), mat(t), mat(valid), -1) },
	} {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}
