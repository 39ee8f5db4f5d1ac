package attnres

import (
	"errors"
	"fmt"
	"math"

	"k3/compute"
)

// Prepare runs phase 1 on b: its fused AttnResPrepare, or, on a backend
// that does not have it (compute.ErrUnsupported), the same statistics
// composed from smaller operations (PrepareComposed).
func Prepare(b compute.Backend, a *compute.AttnResPrepareArgs) error {
	if err := b.AttnResPrepare(a); !errors.Is(err, compute.ErrUnsupported) {
		return err
	}
	return PrepareComposed(b, a)
}

// Update runs phase 2 on b: its fused AttnResUpdate, or the composition
// (UpdateComposed).
func Update(b compute.Backend, a *compute.AttnResUpdateArgs) error {
	if err := b.AttnResUpdate(a); !errors.Is(err, compute.ErrUnsupported) {
		return err
	}
	return UpdateComposed(b, a)
}

// normAfter writes a's pre-norm of H into Normed, where asked
// (compute.AttnResUpdateArgs), for an update that did not fuse it.
func normAfter(b compute.Backend, a *compute.AttnResUpdateArgs) error {
	if a.Normed.IsZero() {
		return nil
	}
	d := a.Query.Len()
	t := a.H.Len() / max(d, 1)
	return b.RMSNorm(a.Normed.Reshape(t, d), a.H.Reshape(t, d), a.NormWeight, a.NormEps)
}

// PrepareComposed is phase 1 from RMSNorm, MatMul, Copy, Fill and the
// elementwise operations, in two passes over the blocks instead of the
// fused operation's online softmax:
//
//	Z_i = Q · RMSNorm(B_i)ᵀ          [S, T], one MatMul per block
//	Max = max_i Z_i,  E_i = exp(Z_i − Max)
//	Sum = Σ_i E_i,    Num[s] = Σ_i E_i[s] ⊙ B_i   (E_i[s] a column [T, 1])
func PrepareComposed(b compute.Backend, a *compute.AttnResPrepareArgs) error {
	if a.Queries.Rank != 2 {
		return fmt.Errorf("%w: attnres queries %v", compute.ErrShape, a.Queries)
	}
	s, d := a.Queries.Dims[0], a.Queries.Dims[1]
	t := a.Max.Len() / max(s, 1)
	if a.Num.Len() != s*t*d || a.Max.Len() != s*t || a.Sum.Len() != s*t {
		return fmt.Errorf("%w: attnres outputs num %v max %v sum %v for %d queries of width %d", compute.ErrShape, a.Num, a.Max, a.Sum, s, d)
	}
	num, mx, sum := a.Num.Reshape(s, t, d), a.Max.Reshape(s, t), a.Sum.Reshape(s, t)
	for _, f := range []struct {
		t compute.Tensor
		v float32
	}{{num, 0}, {sum, 0}, {mx, -math.MaxFloat32}} {
		if err := b.Fill(f.t, f.v); err != nil {
			return err
		}
	}
	n := len(a.Blocks)
	if n == 0 || t == 0 {
		return nil
	}
	for i, blk := range a.Blocks {
		if blk.Len() != t*d {
			return fmt.Errorf("%w: attnres block %d is %v, want [%d, %d]", compute.ErrShape, i, blk, t, d)
		}
	}
	// Scratch: every block's logits [S, T], one normalised block [T, D],
	// one exponential [S, T] and one product [T, D].
	scratch, err := b.Alloc(compute.F32, n*s*t+2*t*d+s*t)
	if err != nil {
		return err
	}
	defer b.Free(scratch)
	flat := scratch.Reshape(-1)
	at := func(off, size int) compute.Tensor { return flat.Rows(off, off+size) }
	z := func(i int) compute.Tensor { return at(i*s*t, s*t).Reshape(s, t) }
	norm, prod := at(n*s*t, t*d).Reshape(t, d), at(n*s*t+t*d, t*d).Reshape(t, d)
	e := at(n*s*t+2*t*d, s*t).Reshape(s, t)
	for i, blk := range a.Blocks {
		blk = blk.Reshape(t, d)
		if err := b.RMSNorm(norm, blk, compute.Tensor{}, a.Eps); err != nil {
			return err
		}
		if err := b.MatMul(z(i), a.Queries, norm); err != nil {
			return err
		}
		if i == 0 {
			err = b.Copy(mx, z(0))
		} else {
			err = b.Binary(compute.Max, mx, mx, z(i))
		}
		if err != nil {
			return err
		}
	}
	for i, blk := range a.Blocks {
		blk = blk.Reshape(t, d)
		if err := b.Binary(compute.Sub, e, z(i), mx); err != nil {
			return err
		}
		if err := b.Unary(compute.Exp, e, e); err != nil {
			return err
		}
		if err := b.Binary(compute.Add, sum, sum, e); err != nil {
			return err
		}
		for q := range s {
			if err := b.Binary(compute.Mul, prod, blk, e.Rows(q, q+1).Reshape(t, 1)); err != nil {
				return err
			}
			nq := num.Rows(q, q+1).Reshape(t, d)
			if err := b.Binary(compute.Add, nq, nq, prod); err != nil {
				return err
			}
		}
	}
	return nil
}

// UpdateComposed is phase 2 from the same operations: the delta added to
// the partial P (or copied into it), then with no partial H = Num / Sum,
// and otherwise, with the partial's logit s = RMSNorm(P) · q,
//
//	m = max(Max, s),  e1 = exp(Max − m),  e2 = exp(s − m)
//	H = (Num ⊙ e1 + P ⊙ e2) / (Sum ⊙ e1 + e2)
//
// (per token), and where Normed is set, RMSNorm(H) into it. A token with
// neither a history nor a partial divides by zero here; the fused
// operation reports it.
func UpdateComposed(b compute.Backend, a *compute.AttnResUpdateArgs) error {
	d, t := a.Query.Len(), a.Max.Len()
	if a.H.Len() != t*d || a.Num.Len() != t*d || a.Sum.Len() != t {
		return fmt.Errorf("%w: attnres update: h %v num %v max %v sum %v for query width %d", compute.ErrShape, a.H, a.Num, a.Max, a.Sum, d)
	}
	if !a.Delta.IsZero() && (a.Partial.IsZero() || a.Delta.Len() != t*d || a.Partial.Len() != t*d) {
		return fmt.Errorf("%w: attnres delta %v needs a partial buffer of [%d, %d]", compute.ErrShape, a.Delta, t, d)
	}
	h, num := a.H.Reshape(t, d), a.Num.Reshape(t, d)
	col := func(x compute.Tensor) compute.Tensor { return x.Reshape(t, 1) }
	if !a.Delta.IsZero() {
		p, delta := a.Partial.Reshape(t, d), a.Delta.Reshape(t, d)
		var err error
		if a.HasPartial {
			err = b.Binary(compute.Add, p, p, delta)
		} else {
			err = b.Copy(p, delta)
		}
		if err != nil {
			return err
		}
		a.HasPartial = true
	}
	if !a.HasPartial {
		if err := b.Binary(compute.Div, h, num, col(a.Sum)); err != nil {
			return err
		}
		return normAfter(b, a)
	}
	if a.Partial.Len() != t*d {
		return fmt.Errorf("%w: attnres partial %v, want [%d, %d]", compute.ErrShape, a.Partial, t, d)
	}
	p := a.Partial.Reshape(t, d)
	// Scratch: the normalised partial and a product [T, D]; s, m, e1, e2
	// and the denominator [T].
	scratch, err := b.Alloc(compute.F32, 2*t*d+5*t)
	if err != nil {
		return err
	}
	defer b.Free(scratch)
	flat := scratch.Reshape(-1)
	at := func(off, size int) compute.Tensor { return flat.Rows(off, off+size) }
	norm, prod := at(0, t*d).Reshape(t, d), at(t*d, t*d).Reshape(t, d)
	sv, m, e1, e2, den := col(at(2*t*d, t)), col(at(2*t*d+t, t)), col(at(2*t*d+2*t, t)), col(at(2*t*d+3*t, t)), col(at(2*t*d+4*t, t))
	mx, sum := col(a.Max), col(a.Sum)
	for _, f := range []func() error{
		func() error { return b.RMSNorm(norm, p, compute.Tensor{}, a.Eps) },
		func() error { return b.MatMul(sv, norm, a.Query.Reshape(1, d)) },
		func() error { return b.Binary(compute.Max, m, mx, sv) },
		func() error { return b.Binary(compute.Sub, e1, mx, m) },
		func() error { return b.Unary(compute.Exp, e1, e1) },
		func() error { return b.Binary(compute.Sub, e2, sv, m) },
		func() error { return b.Unary(compute.Exp, e2, e2) },
		func() error { return b.Binary(compute.Mul, den, sum, e1) },
		func() error { return b.Binary(compute.Add, den, den, e2) },
		func() error { return b.Binary(compute.Mul, h, num, e1) },
		func() error { return b.Binary(compute.Mul, prod, p, e2) },
		func() error { return b.Binary(compute.Add, h, h, prod) },
		func() error { return b.Binary(compute.Div, h, h, den) },
	} {
		if err := f(); err != nil {
			return fmt.Errorf("attnres: update: %w", err)
		}
	}
	return normAfter(b, a)
}
