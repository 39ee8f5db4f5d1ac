package ascend

import "k3/compute"

// The fused DSA route (Options.FusedAttention): aclnnLightningIndexer and
// aclnnSparseFlashAttention in place of the compositions, for a sequence
// whose caches are rows of pools read through a page table.
//
// Both operators take 16-bit caches while the model keeps float32 ones,
// so the backend keeps a bf16 mirror of every buffer the route reads
// through a page table, made by one cast at its first fused read and
// kept in step by the writes that pass through the backend into the
// buffer: ScatterRows (the rows cast and scattered into the mirror too),
// Copy, Fill and Write (the span written cast again). An operator's
// output written into a mirrored buffer by any other call is not seen;
// the model writes its pools only through those four.
//
// The operators align causality at the last key: query t of T sees the
// keys up to K−T+t, K the key count. The backend derives K on the device
// as the last query's position plus one (so a captured step stays right
// as the cache grows), which is the seam's causal limit when the queries
// are the sequence's last T positions, as every pass of the model has
// them.

// fusedOps are the fused operators a backend opened with
// Options.FusedAttention takes: those its device's operator libraries
// have, found at open.
type fusedOps struct{ indexer, attention bool }

// FusedCalls reports how many Lightning Indexer and Attention calls took
// the fused operators, and how many mirrors were made.
func (b *Backend) FusedCalls() (indexer, attention, mirrors int64) {
	b.lock()
	defer b.mu.Unlock()
	return b.fusedIndexer, b.fusedAttention, b.mirrors
}

// mirrorOf returns t, a view of a float32 buffer, as the same view of the
// buffer's bf16 mirror, making the mirror on first use; b.mu is held.
func (b *Backend) mirrorOf(t compute.Tensor) (compute.Tensor, error) {
	d, err := bufOf(t)
	if err != nil {
		return t, err
	}
	if d.mirror == nil {
		n := d.n / 4
		m, err := b.alloc(2 * n)
		if err != nil {
			return t, err
		}
		whole := compute.NewTensor(d, 0, compute.F32, n)
		if err := b.opCast(operand{t: whole, view: i64(n)}, compute.BF16, operand{t: compute.NewTensor(m, 0, compute.BF16, n), view: i64(n)}); err != nil {
			b.freeBuf(m)
			return t, err
		}
		d.mirror = m
		b.mirrors++
	}
	t.DType, t.Mem = compute.BF16, d.mirror
	return t, nil
}

// mirrorWrite casts the float32 elements of dst, just written, into its
// buffer's mirror if it has one; b.mu is held. A write of another type
// (raw bits) casts the whole buffer again.
func (b *Backend) mirrorWrite(dst compute.Tensor) error {
	d, ok := dst.Mem.(*devBuf)
	if !ok || d.mirror == nil {
		return nil
	}
	n := dims(dst)
	if dst.DType != compute.F32 {
		n = d.n / 4
		dst = compute.NewTensor(d, 0, compute.F32, n)
	}
	m := dst
	m.DType, m.Mem = compute.BF16, d.mirror
	return b.castBF16(operand{t: dst, view: i64(n)}, operand{t: m, view: i64(n)})
}

// castBF16 casts x into the bf16 out with a repeatable executor (a
// decode step's cache appends repeat it); b.mu is held.
func (b *Backend) castBF16(x, out operand) error {
	return b.runAs("aclnnCast bf16", func(ts []tensorDesc) (prepared, error) { return b.drv.cast(ts[0], aclType(compute.BF16), ts[1]) },
		x, out)
}

// mirrorScatter is ScatterRows' twin into dst's mirror, if it has one:
// the rows of src cast into scratch and scattered by the same indices;
// b.mu is held.
func (b *Backend) mirrorScatter(dst, idx, src compute.Tensor, w int) error {
	d, ok := dst.Mem.(*devBuf)
	if !ok || d.mirror == nil {
		return nil
	}
	if src.DType != compute.F32 {
		return b.mirrorWrite(dst)
	}
	rows := src.Dims[0]
	sc, err := b.alloc(max(2*rows*w, 1))
	if err != nil {
		return err
	}
	defer b.freeBuf(sc)
	s16 := compute.NewTensor(sc, 0, compute.BF16, rows, w)
	m := dst
	m.DType, m.Mem = compute.BF16, d.mirror
	if err := b.castBF16(operand{t: src, view: i64(rows * w)}, operand{t: s16, view: i64(rows * w)}); err != nil {
		return err
	}
	return b.runAs("aclnnInplaceIndexCopy", func(ts []tensorDesc) (prepared, error) { return b.drv.indexCopy(ts[0], 0, ts[1], ts[2]) },
		operand{t: m, view: i64(dst.Dims[0], w)}, operand{t: idx, view: i64(rows)}, operand{t: s16, view: i64(rows, w)})
}

// keyCount writes the last of the positions pos plus one into the I32
// tensor cnt [1], on the device; b.mu is held.
func (b *Backend) keyCount(pos compute.Tensor, cnt compute.Tensor) error {
	f, err := b.allocTensor(compute.F32, 1)
	if err != nil {
		return err
	}
	defer b.freeBuf(f.Mem.(*devBuf))
	one, err := b.constOf(1, 1)
	if err != nil {
		return err
	}
	last := pos
	last.Off += dims(pos) - 1
	v := i64(1)
	if err := b.opCast(operand{t: last, view: v}, compute.F32, operand{t: f, view: v}); err != nil {
		return err
	}
	if err := b.opAdd(operand{t: f, view: v}, operand{t: one, view: v}, operand{t: f, view: v}, 1); err != nil {
		return err
	}
	return b.opCast(operand{t: f, view: v}, compute.I32, operand{t: cnt, view: v})
}

// indexerFusable reports whether a may take aclnnLightningIndexer: a
// pooled cache, neither scores nor counts asked for, and the shapes the
// operator takes (D 128, at most 64 heads, blocks of 16k ≤ 1024 rows, a
// sparse count in 1..2048 or 3072..8192).
func (b *Backend) indexerFusable(a *compute.IndexerArgs) bool {
	k := a.TopK
	return b.fuse.indexer && a.KPages == nil && !a.PageTable.IsZero() && a.Scores.IsZero() && a.Counts.IsZero() &&
		a.CuSeqlensQ == nil && a.CuSeqlensK == nil && a.Q.Dims[2] == 128 && a.Q.Dims[1] <= 64 && a.Q.Dims[0] > 0 &&
		a.PageSize%16 == 0 && a.PageSize <= 1024 && ((k >= 1 && k <= 2048) || (k >= 3072 && k <= 8192))
}

// fusedIndex runs a (indexerFusable) through aclnnLightningIndexer; b.mu
// is held.
func (b *Backend) fusedIndex(a *compute.IndexerArgs) error {
	T, HI, DI, K, P := a.Q.Dims[0], a.Q.Dims[1], a.Q.Dims[2], a.TopK, a.PageTable.Len()
	blocks := a.KPool.Len() / (a.PageSize * DI)
	sc, err := b.alloc(2 * (T*HI*DI + T*HI))
	if err != nil {
		return err
	}
	defer b.freeBuf(sc)
	cnt, err := b.allocTensor(compute.I32, 1)
	if err != nil {
		return err
	}
	defer b.freeBuf(cnt.Mem.(*devBuf))
	q16 := compute.NewTensor(sc, 0, compute.BF16, T*HI*DI)
	w16 := compute.NewTensor(sc, T*HI*DI, compute.BF16, T*HI)
	keys, err := b.mirrorOf(a.KPool)
	if err != nil {
		return err
	}
	if err := b.opCast(operand{t: a.Q, view: i64(T * HI * DI)}, compute.BF16, operand{t: q16, view: i64(T * HI * DI)}); err != nil {
		return err
	}
	if err := b.opCast(operand{t: a.W, view: i64(T * HI)}, compute.BF16, operand{t: w16, view: i64(T * HI)}); err != nil {
		return err
	}
	if err := b.keyCount(a.QPos, cnt); err != nil {
		return err
	}
	if err := b.run(func(ts []tensorDesc) (prepared, error) {
		return b.drv.lightningIndexer(ts[0], ts[1], ts[2], ts[3], ts[4], K, ts[5])
	},
		operand{t: q16, view: i64(1, T, HI, DI)}, operand{t: keys, view: i64(blocks, a.PageSize, 1, DI)}, operand{t: w16, view: i64(1, T, HI)},
		operand{t: cnt, view: i64(1)}, operand{t: a.PageTable, view: i64(1, P)}, operand{t: a.Indices, view: i64(1, T, 1, K)}); err != nil {
		return err
	}
	b.fusedIndexer++
	return nil
}

// attentionFusable reports whether a (of geometry g) may take
// aclnnSparseFlashAttention in MLA-absorb mode: pooled caches, one kv
// head whose keys are the values, a rope part, one shared index list per
// row, causal.
func (b *Backend) attentionFusable(a *compute.AttnArgs, g attnGeom) bool {
	return b.fuse.attention && g.pooled && g.vShared && g.hkv == 1 && g.lists == 1 && g.dr > 0 && a.Causal &&
		!a.KRopePool.IsZero()
}

// fusedAttend runs a (attentionFusable) through
// aclnnSparseFlashAttention; b.mu is held.
func (b *Backend) fusedAttend(a *compute.AttnArgs, g attnGeom) error {
	T, N, Dc, Dr, K, P := g.t, g.hq, g.dk, g.dr, g.kn, a.PageTable.Len()
	blocks := a.KPool.Dims[0] / a.PageSize
	h16, err := b.alloc(2 * (2*T*N*Dc + T*N*Dr))
	if err != nil {
		return err
	}
	defer b.freeBuf(h16)
	f, err := b.allocTensor(compute.F32, 2*T*N)
	if err != nil {
		return err
	}
	defer b.freeBuf(f.Mem.(*devBuf))
	cnt, err := b.allocTensor(compute.I32, 1)
	if err != nil {
		return err
	}
	defer b.freeBuf(cnt.Mem.(*devBuf))
	nq, err := b.constInts([]int32{int32(T)})
	if err != nil {
		return err
	}
	q16 := compute.NewTensor(h16, 0, compute.BF16, T*N*Dc)
	o16 := compute.NewTensor(h16, T*N*Dc, compute.BF16, T*N*Dc)
	qr16 := compute.NewTensor(h16, 2*T*N*Dc, compute.BF16, T*N*Dr)
	mx, sum := part(f, 0, T*N), part(f, T*N, T*N)
	kv, err := b.mirrorOf(a.KPool)
	if err != nil {
		return err
	}
	kr, err := b.mirrorOf(a.KRopePool)
	if err != nil {
		return err
	}
	flat := func(t compute.Tensor, n int) operand { return operand{t: t, view: i64(n)} }
	if err := b.opCast(flat(a.Q, T*N*Dc), compute.BF16, flat(q16, T*N*Dc)); err != nil {
		return err
	}
	if err := b.opCast(flat(a.QRope, T*N*Dr), compute.BF16, flat(qr16, T*N*Dr)); err != nil {
		return err
	}
	if err := b.keyCount(a.QPos, cnt); err != nil {
		return err
	}
	if err := b.run(func(ts []tensorDesc) (prepared, error) {
		return b.drv.sparseFlashAttention(ts[0], ts[1], ts[2], ts[3], ts[4], ts[5], ts[6], ts[7], float64(a.Scale), ts[8], ts[9], ts[10])
	},
		operand{t: q16, view: i64(T, N, Dc)}, operand{t: kv, view: i64(blocks, a.PageSize, 1, Dc)}, operand{t: a.Indices, view: i64(T, 1, K)},
		operand{t: a.PageTable, view: i64(1, P)}, operand{t: nq, view: i64(1)}, operand{t: cnt, view: i64(1)},
		operand{t: qr16, view: i64(T, N, Dr)}, operand{t: kr, view: i64(blocks, a.PageSize, 1, Dr)},
		operand{t: o16, view: i64(T, N, Dc)}, operand{t: mx, view: i64(1, T, N)}, operand{t: sum, view: i64(1, T, N)}); err != nil {
		return err
	}
	if err := b.opCast(flat(o16, T*N*Dc), compute.F32, flat(a.Out, T*N*Dc)); err != nil {
		return err
	}
	if !a.LSE.IsZero() { // LSE = max + log(sum)
		if err := b.opUnary("aclnnLog", flat(sum, T*N), flat(sum, T*N)); err != nil {
			return err
		}
		if err := b.opAdd(flat(mx, T*N), flat(sum, T*N), flat(a.LSE, T*N), 1); err != nil {
			return err
		}
	}
	b.fusedAttention++
	return nil
}
