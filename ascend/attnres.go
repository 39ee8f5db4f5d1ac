package ascend

import (
	"fmt"
	"math"

	"k3/compute"
)

// AttnResPrepare implements compute.Backend as a composition, in two
// passes over the blocks instead of the pure-Go backend's online softmax:
// each block's logits Z_i = RMSNorm(B_i) · Qᵀ ([T, S], one MatMul), their
// elementwise maximum M (aclnnMaximum), then Sum = Σ exp(Z_i − M) and
// Num = Σ exp(Z_i − M) · B_i with the logits read as [S, T, 1] through
// strides.
func (b *Backend) AttnResPrepare(a *compute.AttnResPrepareArgs) error {
	if a.Queries.Rank != 2 || a.Queries.DType != compute.F32 || a.Num.DType != compute.F32 || a.Max.DType != compute.F32 || a.Sum.DType != compute.F32 {
		return fmt.Errorf("%w: attnres queries %v, num %v, max %v, sum %v", compute.ErrShape, a.Queries, a.Num, a.Max, a.Sum)
	}
	S, D := a.Queries.Dims[0], a.Queries.Dims[1]
	T := a.Max.Len() / max(S, 1)
	if a.Num.Len() != S*T*D || a.Max.Len() != S*T || a.Sum.Len() != S*T {
		return fmt.Errorf("%w: attnres outputs num %v max %v sum %v for %d queries of width %d", compute.ErrShape, a.Num, a.Max, a.Sum, S, D)
	}
	for i, bt := range a.Blocks {
		if bt.DType != compute.F32 || bt.Len() != T*D {
			return fmt.Errorf("%w: attnres block %d is %v, want [%d, %d]", compute.ErrShape, i, bt, T, D)
		}
	}
	b.lock()
	defer b.mu.Unlock()
	num, mx, sum := operand{t: a.Num, view: i64(S, T, D)}, operand{t: a.Max, view: i64(S, T)}, operand{t: a.Sum, view: i64(S, T)}
	fill := func(o operand, v float32) error {
		sc, err := b.scalar(v)
		if err != nil {
			return err
		}
		return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.fill(ts[0], sc) }, o)
	}
	for _, f := range []func() error{
		func() error { return fill(num, 0) },
		func() error { return fill(sum, 0) },
		func() error { return fill(mx, -math.MaxFloat32) },
	} {
		if err := f(); err != nil {
			return err
		}
	}
	n := len(a.Blocks)
	if n == 0 {
		return nil
	}
	// Scratch: every block's logits [T, S], its normalised rows [T, D],
	// the per-row roots, and one [S, T, D] product.
	s, err := b.allocTensor(compute.F32, n*T*S+T*D+T+S*T*D)
	if err != nil {
		return err
	}
	defer b.freeBuf(s.Mem.(*devBuf))
	at := func(off, size int) compute.Tensor { return part(s, off, size) }
	norm, rstd, prod := at(n*T*S, T*D), at(n*T*S+T*D, T), at(n*T*S+T*D+T, S*T*D)
	ones, err := b.constOf(D, 1)
	if err != nil {
		return err
	}
	one, minus, err := b.units()
	if err != nil {
		return err
	}
	// logitsST views block i's logits [T, S] as [S, T].
	logits := func(i int) compute.Tensor { return at(i*T*S, T*S) }
	logitsST := func(i int) operand { return operand{t: logits(i), view: i64(S, T), strides: i64(1, S)} }
	for i, bt := range a.Blocks {
		steps := []func() error{
			func() error {
				return b.run(func(ts []tensorDesc) (prepared, error) {
					return b.drv.rmsNorm(ts[0], ts[1], float64(a.Eps), ts[2], ts[3])
				},
					flat(bt, D), operand{t: ones, view: i64(D)}, flat(norm, D), flat(rstd, 1))
			},
			func() error {
				return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.matmul("aclnnMatmul", ts[0], ts[1], ts[2], 0) },
					flat(norm, D), operand{t: a.Queries, view: i64(D, S), strides: i64(1, D)}, operand{t: logits(i), view: i64(T, S)})
			},
			func() error {
				return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.binary("aclnnMaximum", ts[0], ts[1], ts[2]) },
					mx, logitsST(i), mx)
			},
		}
		for _, f := range steps {
			if err := f(); err != nil {
				return fmt.Errorf("ascend: attnres prepare, block %d: %w", i, err)
			}
		}
	}
	for i, bt := range a.Blocks {
		e := logitsST(i)
		steps := []func() error{
			func() error { // e = exp(Z_i - M), in place
				return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.add(ts[0], ts[1], minus, ts[2]) }, e, mx, e)
			},
			func() error {
				return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.unary("aclnnExp", ts[0], ts[1]) }, e, e)
			},
			func() error {
				return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.add(ts[0], ts[1], one, ts[2]) }, sum, e, sum)
			},
			func() error {
				return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.binary("aclnnMul", ts[0], ts[1], ts[2]) },
					operand{t: logits(i), view: i64(S, T, 1), strides: i64(1, S, 1)}, operand{t: bt, view: i64(T, D)},
					operand{t: prod, view: i64(S, T, D)})
			},
			func() error {
				return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.add(ts[0], ts[1], one, ts[2]) },
					num, operand{t: prod, view: i64(S, T, D)}, num)
			},
		}
		for _, f := range steps {
			if err := f(); err != nil {
				return fmt.Errorf("ascend: attnres prepare, block %d: %w", i, err)
			}
		}
	}
	return nil
}

// AttnResUpdate implements compute.Backend as a composition: the delta is
// added to the partial (aclnnAdd, or a copy when there is none yet); with
// no partial H = Num / Sum; otherwise the partial's logit s = RMSNorm(P)
// · q joins the statistics: m = max(Max, s), e1 = exp(Max − m), e2 =
// exp(s − m), H = (Num·e1 + P·e2) / (Sum·e1 + e2). A token with neither
// a history nor a partial divides by zero on the device instead of the
// pure-Go backend's error. A pre-norm asked for (Normed) runs after it as
// RMSNorm.
func (b *Backend) AttnResUpdate(a *compute.AttnResUpdateArgs) error {
	if !a.Normed.IsZero() {
		D := a.Query.Len()
		if a.Normed.DType != compute.F32 || a.Normed.Len() != a.H.Len() || a.H.Len()%max(D, 1) != 0 {
			return fmt.Errorf("%w: attnres normed output %v for h %v", compute.ErrShape, a.Normed, a.H)
		}
		if err := b.attnResUpdate(a); err != nil {
			return err
		}
		T := a.H.Len() / max(D, 1)
		return b.RMSNorm(a.Normed.Reshape(T, D), a.H.Reshape(T, D), a.NormWeight, a.NormEps)
	}
	return b.attnResUpdate(a)
}

// attnResUpdate is AttnResUpdate without the pre-norm.
func (b *Backend) attnResUpdate(a *compute.AttnResUpdateArgs) error {
	if a.Query.DType != compute.F32 || a.H.DType != compute.F32 || a.Num.DType != compute.F32 || a.Max.DType != compute.F32 || a.Sum.DType != compute.F32 {
		return fmt.Errorf("%w: attnres update operands", compute.ErrShape)
	}
	D, T := a.Query.Len(), a.Max.Len()
	if a.H.Len() != T*D || a.Num.Len() != T*D || a.Sum.Len() != T {
		return fmt.Errorf("%w: attnres update: h %v num %v max %v sum %v for query width %d", compute.ErrShape, a.H, a.Num, a.Max, a.Sum, D)
	}
	if !a.Partial.IsZero() && (a.Partial.DType != compute.F32 || a.Partial.Len() != T*D) {
		return fmt.Errorf("%w: attnres partial %v, want [%d, %d]", compute.ErrShape, a.Partial, T, D)
	}
	if !a.Delta.IsZero() && (a.Partial.IsZero() || a.Delta.DType != compute.F32 || a.Delta.Len() != T*D) {
		return fmt.Errorf("%w: attnres delta %v needs a partial buffer of [%d, %d]", compute.ErrShape, a.Delta, T, D)
	}
	b.lock()
	defer b.mu.Unlock()
	one, minus, err := b.units()
	if err != nil {
		return err
	}
	rows := func(t compute.Tensor) operand { return flat(t, D) }
	col := func(t compute.Tensor) operand { return operand{t: t, view: i64(T, 1)} }
	binary := func(name string, x, y, out operand) error {
		return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.binary(name, ts[0], ts[1], ts[2]) }, x, y, out)
	}
	add := func(x, y, out operand, alpha scalar) error {
		return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.add(ts[0], ts[1], alpha, ts[2]) }, x, y, out)
	}
	exp := func(x operand) error {
		return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.unary("aclnnExp", ts[0], ts[1]) }, x, x)
	}
	if !a.Delta.IsZero() {
		if a.HasPartial {
			err = add(rows(a.Partial), rows(a.Delta), rows(a.Partial), one)
		} else {
			err = b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.inplaceCopy(ts[0], ts[1]) }, rows(a.Partial), rows(a.Delta))
			a.HasPartial = true
		}
		if err != nil {
			return err
		}
	}
	if !a.HasPartial {
		return binary("aclnnDiv", rows(a.Num), col(a.Sum), rows(a.H))
	}
	// Scratch: the normalised partial [T, D], then s, m, e1, e2, the
	// denominator and a root per token, and one [T, D] product.
	sc, err := b.allocTensor(compute.F32, 2*T*D+6*T)
	if err != nil {
		return err
	}
	defer b.freeBuf(sc.Mem.(*devBuf))
	at := func(off, size int) compute.Tensor { return part(sc, off, size) }
	norm, prod := at(0, T*D), at(T*D, T*D)
	sv, m, e1, e2, den, rstd := at(2*T*D, T), at(2*T*D+T, T), at(2*T*D+2*T, T), at(2*T*D+3*T, T), at(2*T*D+4*T, T), at(2*T*D+5*T, T)
	ones, err := b.constOf(D, 1)
	if err != nil {
		return err
	}
	for _, f := range []func() error{
		func() error {
			return b.run(func(ts []tensorDesc) (prepared, error) {
				return b.drv.rmsNorm(ts[0], ts[1], float64(a.Eps), ts[2], ts[3])
			},
				rows(a.Partial), operand{t: ones, view: i64(D)}, rows(norm), col(rstd))
		},
		func() error {
			return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.matmul("aclnnMatmul", ts[0], ts[1], ts[2], 0) },
				rows(norm), operand{t: a.Query, view: i64(D, 1)}, col(sv))
		},
		func() error { return binary("aclnnMaximum", col(a.Max), col(sv), col(m)) },
		func() error { return add(col(a.Max), col(m), col(e1), minus) },
		func() error { return exp(col(e1)) },
		func() error { return add(col(sv), col(m), col(e2), minus) },
		func() error { return exp(col(e2)) },
		func() error { return binary("aclnnMul", col(a.Sum), col(e1), col(den)) },
		func() error { return add(col(den), col(e2), col(den), one) },
		func() error { return binary("aclnnMul", rows(a.Num), col(e1), rows(a.H)) },
		func() error { return binary("aclnnMul", rows(a.Partial), col(e2), rows(prod)) },
		func() error { return add(rows(a.H), rows(prod), rows(a.H), one) },
		func() error { return binary("aclnnDiv", rows(a.H), col(den), rows(a.H)) },
	} {
		if err := f(); err != nil {
			return fmt.Errorf("ascend: attnres update: %w", err)
		}
	}
	return nil
}

// part is the size elements of scratch t from element off, as a vector.
func part(t compute.Tensor, off, size int) compute.Tensor {
	t.Off += off
	t.Rank, t.Dims = 1, [compute.MaxRank]int{size}
	return t
}
