package ascend

import (
	"fmt"
	"math"

	"k3/compute"
)

// LightningIndexer implements compute.Backend as a composition, one
// sequence at a time: the scores S = Q·Kᵀ of every query head (MatMul over
// the sequence's keys; a paged cache gathered into scratch first, every
// row of its pages unless Scores is asked for, so that the shapes follow
// the pages and not the length), ReLU,
// the head-weighted sum as a BatchMatMul of W [t, 1, HI] with S
// [t, HI, L], the invisible positions masked to −∞, aclnnTopk (int64
// indices) cast into Indices, and the slots past each row's count set to
// −1. The mask, the counts and the −1 padding are built on the device from
// the positions tensor: with d = pos − s, ind(s ≤ pos) = ReLU(d+1) −
// ReLU(d), the mask is log(ind), a row's count the sum of its first
// min(TopK, L) indicators. A position past its sequence's keys, which the
// pure-Go backend refuses, is not checked. Which key wins an exact tie on
// the device is aclnnTopk's; the host driver and the fake keep the lower
// position, as the pure-Go backend does.
func (b *Backend) LightningIndexer(a *compute.IndexerArgs) error {
	pooled := a.KPages == nil && !a.PageTable.IsZero()
	paged := a.KPages != nil || pooled
	if a.Q.Rank != 3 || a.Q.DType != compute.F32 || a.Q.Dims[2] <= 0 ||
		(!paged && (a.K.Rank != 2 || a.K.DType != compute.F32 || a.Q.Dims[2] != a.K.Dims[1])) {
		return fmt.Errorf("%w: indexer q %v and keys %v, want f32 [T, H, D] and [L, D]", compute.ErrShape, a.Q, a.K)
	}
	if pooled && (a.PageTable.DType != compute.I32 || a.PageTable.Rank != 1 || a.KPool.DType != compute.F32 ||
		a.PageSize <= 0 || a.KPool.Len()%(a.PageSize*a.Q.Dims[2]) != 0) {
		return fmt.Errorf("%w: indexer key pool %v and page table %v for pages of %d", compute.ErrShape, a.KPool, a.PageTable, a.PageSize)
	}
	T, HI := a.Q.Dims[0], a.Q.Dims[1]
	L := 0
	if paged {
		np := pageCount(a.KPages, a.PageTable)
		if a.KLen < 0 || a.KLen > np*a.PageSize || a.CuSeqlensK != nil || a.PageSize <= 0 {
			return fmt.Errorf("ascend: indexer: %d keys in %d pages of %d (one sequence)", a.KLen, np, a.PageSize)
		}
		L = a.KLen
		if a.Scores.IsZero() {
			// Every row of the pages: the keys past a query's position are
			// masked anyway, and the shapes stay fixed while the pages do
			// (a decode step can be captured).
			L = np * a.PageSize
		}
	} else {
		L = a.K.Dims[0]
	}
	if err := compute.CheckShape("indexer weights", a.W, compute.F32, T, HI); err != nil {
		return err
	}
	if a.QPos.DType != compute.I32 || dims(a.QPos) != T || a.TopK <= 0 {
		return fmt.Errorf("%w: indexer: query positions %v for %d rows, top-k %d", compute.ErrShape, a.QPos, T, a.TopK)
	}
	cuQ, cuK := a.CuSeqlensQ, a.CuSeqlensK
	if cuQ == nil {
		cuQ = []int32{0, int32(T)}
	}
	if cuK == nil {
		cuK = []int32{0, int32(L)}
	}
	if len(cuQ) != len(cuK) || cuQ[0] != 0 || cuK[0] != 0 || int(cuQ[len(cuQ)-1]) != T || int(cuK[len(cuK)-1]) != L {
		return fmt.Errorf("%w: indexer cu_seqlens q %v k %v for %d queries and %d keys", compute.ErrShape, cuQ, cuK, T, L)
	}
	if err := compute.CheckShape("indexer indices", a.Indices, compute.I32, T, a.TopK); err != nil {
		return err
	}
	if !a.Counts.IsZero() {
		if err := compute.CheckShape("indexer counts", a.Counts, compute.I32, T); err != nil {
			return err
		}
	}
	width := 0
	if !a.Scores.IsZero() {
		if a.Scores.Rank != 2 || a.Scores.Dims[0] != T || a.Scores.DType != compute.F32 {
			return fmt.Errorf("%w: indexer scores %v for %d rows", compute.ErrShape, a.Scores, T)
		}
		width = a.Scores.Dims[1]
	}
	b.lock()
	defer b.mu.Unlock()
	if b.indexerFusable(a) {
		return b.fusedIndex(a)
	}
	// Every slot starts at -1 (0xff bytes), every count at 0, the scores
	// at -∞.
	if p, err := b.addr(a.Indices); err != nil {
		return err
	} else if err := b.s.Memset(p, 0xff, T*a.TopK*4); err != nil {
		return err
	}
	if !a.Counts.IsZero() {
		if err := b.fillZero(a.Counts); err != nil {
			return err
		}
	}
	if width > 0 {
		inf, err := b.scalar(float32(math.Inf(-1)))
		if err != nil {
			return err
		}
		if err := b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.fill(ts[0], inf) },
			operand{t: a.Scores, view: i64(T * width)}); err != nil {
			return err
		}
	}
	for s := range len(cuQ) - 1 {
		q0, q1 := int(cuQ[s]), int(cuQ[s+1])
		k0, lk := int(cuK[s]), int(cuK[s+1]-cuK[s])
		if q1 == q0 || lk == 0 {
			continue
		}
		if err := b.indexSequence(a, q0, q1-q0, k0, lk, width); err != nil {
			return fmt.Errorf("ascend: indexer, sequence %d: %w", s, err)
		}
	}
	return nil
}

// indexSequence runs the indexer for the tq query rows from q0 over the
// lk keys from k0; b.mu is held.
func (b *Backend) indexSequence(a *compute.IndexerArgs, q0, tq, k0, lk, width int) error {
	HI, DI, K := a.Q.Dims[1], a.Q.Dims[2], a.TopK
	kk := min(K, lk)
	// Scratch: the keys when paged, S [tq·HI, lk], Z [tq, lk], D and M
	// [tq, lk] (the positions' differences, then the indicators and the
	// mask), the top values, the positions, the pads and the counts (as
	// floats); then int32 room for the int64 indices, the valid flags and
	// the pads.
	keys := 0
	if a.KPages != nil {
		keys = lk * DI
	} else if !a.PageTable.IsZero() {
		keys = a.PageTable.Len() * a.PageSize * DI // whole pages, gathered at once
	}
	f, err := b.allocTensor(compute.F32, keys+tq*HI*lk+3*tq*lk+tq*kk+tq+tq*kk+tq)
	if err != nil {
		return err
	}
	defer b.freeBuf(f.Mem.(*devBuf))
	ints, err := b.allocTensor(compute.I32, 2*tq*kk+2*tq*kk)
	if err != nil {
		return err
	}
	defer b.freeBuf(ints.Mem.(*devBuf))
	off := 0
	next := func(n int) compute.Tensor { t := part(f, off, n); off += n; return t }
	kc, S, Z := next(keys), next(tq*HI*lk), next(tq*lk)
	D, M, vals := next(tq*lk), next(tq*lk), next(tq*kk)
	posF, padF, cntF := next(tq), next(tq*kk), next(tq)
	idx64 := ints // int64 elements [0, tq·kk)
	valid, pad := part(ints, 2*tq*kk, tq*kk), part(ints, 3*tq*kk, tq*kk)
	ar, err := b.iota(lk)
	if err != nil {
		return err
	}
	unit, err := b.constOf(1, 1)
	if err != nil {
		return err
	}
	ones, err := b.constOf(kk, 1)
	if err != nil {
		return err
	}
	one, err := b.scalar(1)
	if err != nil {
		return err
	}
	qpos := a.QPos
	qpos.Off += q0
	grid := func(t compute.Tensor) operand { return operand{t: t, view: i64(tq, lk)} }
	firstK := func(t compute.Tensor) operand { return operand{t: t, view: i64(tq, kk), strides: i64(lk, 1)} }
	flags := func(t compute.Tensor) operand { return operand{t: t, view: i64(tq, kk)} }
	unit11 := operand{t: unit, view: i64(1, 1)}
	for _, step := range []func() error{
		func() error {
			return b.opCast(operand{t: qpos, view: i64(tq)}, compute.F32, operand{t: posF, view: i64(tq)})
		},
		func() error { // D = pos − s
			return b.opAdd(operand{t: posF, view: i64(tq, 1)}, operand{t: ar, view: i64(1, lk)}, grid(D), -1)
		},
		func() error { return b.opAdd(grid(D), unit11, grid(M), 1) }, // M = D + 1
		func() error { return b.opUnary("aclnnRelu", grid(M), grid(M)) },
		func() error { return b.opUnary("aclnnRelu", grid(D), grid(D)) },
		func() error { return b.opAdd(grid(M), grid(D), grid(M), -1) }, // M = ind(s ≤ pos)
		func() error { return b.opCast(firstK(M), compute.I32, flags(valid)) },
		func() error { return b.opAdd(firstK(M), unit11, flags(padF), -1) }, // 0 or −1
		func() error { return b.opCast(flags(padF), compute.I32, flags(pad)) },
		func() error {
			if a.Counts.IsZero() {
				return nil
			}
			if err := b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.matmul("aclnnMatmul", ts[0], ts[1], ts[2], 0) },
				firstK(M), operand{t: ones, view: i64(kk, 1)}, operand{t: cntF, view: i64(tq, 1)}); err != nil {
				return err
			}
			cnt := a.Counts
			cnt.Off += q0
			return b.opCast(operand{t: cntF, view: i64(tq)}, compute.I32, operand{t: cnt, view: i64(tq)})
		},
		func() error { return b.opUnary("aclnnLog", grid(M), grid(M)) }, // the mask: 0 or −∞
	} {
		if err := step(); err != nil {
			return fmt.Errorf("the mask: %w", err)
		}
	}
	mask := M

	// The keys: a view of the packed cache, or the pages gathered.
	kop := operand{t: a.K, view: i64(DI, lk), strides: i64(1, DI)}
	kop.t.Off += k0 * DI
	if a.KPages != nil {
		for p := 0; p*a.PageSize < lk; p++ {
			n := min(a.PageSize, lk-p*a.PageSize)
			dst := kc
			dst.Off += p * a.PageSize * DI
			if err := b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.inplaceCopy(ts[0], ts[1]) },
				operand{t: dst, view: i64(n, DI)}, operand{t: a.KPages[p], view: i64(n, DI)}); err != nil {
				return err
			}
		}
		kop = operand{t: kc, view: i64(DI, lk), strides: i64(1, DI)}
	} else if !a.PageTable.IsZero() {
		if err := b.gatherPages(kc, a.KPool, a.PageTable, a.PageSize*DI); err != nil {
			return err
		}
		kop = operand{t: kc, view: i64(DI, lk), strides: i64(1, DI)}
	}
	q := a.Q
	q.Off += q0 * HI * DI
	w := a.W
	w.Off += q0 * HI
	iv := a.Indices
	iv.Off += q0 * K
	indices := operand{t: iv, view: i64(tq, kk), strides: i64(K, 1)}
	steps := []func() error{
		func() error { // S = Q·Kᵀ per head
			return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.matmul("aclnnMatmul", ts[0], ts[1], ts[2], 0) },
				operand{t: q, view: i64(tq*HI, DI)}, kop, operand{t: S, view: i64(tq*HI, lk)})
		},
		func() error {
			return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.unary("aclnnRelu", ts[0], ts[1]) },
				operand{t: S, view: i64(tq*HI, lk)}, operand{t: S, view: i64(tq*HI, lk)})
		},
		func() error { // Z = Σ_h W[t,h]·S[t,h,:]
			return b.run(func(ts []tensorDesc) (prepared, error) {
				return b.drv.matmul("aclnnBatchMatMul", ts[0], ts[1], ts[2], 0)
			},
				operand{t: w, view: i64(tq, 1, HI), strides: i64(HI, HI, 1)}, operand{t: S, view: i64(tq, HI, lk)},
				operand{t: Z, view: i64(tq, 1, lk)})
		},
		func() error {
			return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.add(ts[0], ts[1], one, ts[2]) },
				operand{t: Z, view: i64(tq, lk)}, operand{t: mask, view: i64(tq, lk)}, operand{t: Z, view: i64(tq, lk)})
		},
		func() error {
			return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.topk(ts[0], kk, 1, ts[1], ts[2]) },
				operand{t: Z, view: i64(tq, lk)}, operand{t: vals, view: i64(tq, kk)}, operand{t: idx64, view: i64(tq, kk), i64: true})
		},
		func() error {
			return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.cast(ts[0], aclType(compute.I32), ts[1]) },
				operand{t: idx64, view: i64(tq, kk), i64: true}, indices)
		},
		func() error { // slots past the count: idx·valid + pad
			return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.binary("aclnnMul", ts[0], ts[1], ts[2]) },
				indices, operand{t: valid, view: i64(tq, kk)}, indices)
		},
		func() error {
			return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.add(ts[0], ts[1], one, ts[2]) },
				indices, operand{t: pad, view: i64(tq, kk)}, indices)
		},
	}
	if width > 0 {
		sc := a.Scores
		sc.Off += q0 * width
		n := min(lk, width)
		steps = append(steps, func() error {
			return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.inplaceCopy(ts[0], ts[1]) },
				operand{t: sc, view: i64(tq, n), strides: i64(width, 1)}, operand{t: Z, view: i64(tq, n), strides: i64(lk, 1)})
		})
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// iota returns a tensor holding 0, 1, ..., n-1 (F32) at least; b.mu is
// held. It grows by doubling; an outgrown tensor stays allocated, since a
// captured graph may read it.
func (b *Backend) iota(n int) (compute.Tensor, error) {
	if dims(b.ar) >= n && !b.ar.IsZero() {
		return b.ar, nil
	}
	c := max(256, 2*dims(b.ar))
	for c < n {
		c *= 2
	}
	t, err := b.allocTensor(compute.F32, c)
	if err != nil {
		return t, err
	}
	v := make([]float32, c)
	for i := range v {
		v[i] = float32(i)
	}
	if err := b.put(t, v); err != nil {
		b.freeBuf(t.Mem.(*devBuf))
		return t, err
	}
	b.ar = t
	return t, nil
}

// pageCount is the pages a paged operand has: its page list's, or its
// table's.
func pageCount(pages []compute.Tensor, table compute.Tensor) int {
	if pages != nil {
		return len(pages)
	}
	return table.Len()
}

// gatherPages copies the pool's pages the I32 table names, pageElems
// floats each, into dst in table order (aclnnIndexSelect): a device's
// block table read on the device; b.mu is held.
func (b *Backend) gatherPages(dst, pool, table compute.Tensor, pageElems int) error {
	n, p := pool.Len()/pageElems, table.Len()
	return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.indexSelect(ts[0], 0, ts[1], ts[2]) },
		operand{t: pool, view: i64(n, pageElems)}, operand{t: table, view: i64(p)}, operand{t: dst, view: i64(p, pageElems)})
}
