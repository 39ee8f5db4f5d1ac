package ascend

import (
	"fmt"
	"math"

	"k3/compute"
)

// RoPE implements compute.Backend as a composition: the cos and sin of
// every (position, pair) are computed on the host exactly as the pure-Go
// backend computes them and uploaded, then each pair (u, v), a strided
// view of X (halves or interleaved), becomes (u·c − v·s, u·s + v·c) by
// Mul and Add into scratch and copied back. The positions are host values
// today (the device-ready seam will make them a tensor, and the tables a
// device computation).
func (b *Backend) RoPE(a *compute.RopeArgs) error {
	x := a.X
	if x.DType != compute.F32 || x.Rank < 2 || len(a.Pos) != x.Dims[0] {
		return fmt.Errorf("%w: rope input %v with %d positions", compute.ErrShape, x, len(a.Pos))
	}
	d := x.Dim(-1)
	r := a.Dims
	if r == 0 {
		r = d
	}
	if r > d || r%2 != 0 || (a.Freqs == nil && !(a.Theta > 0)) || (a.Freqs != nil && len(a.Freqs) != r/2) {
		return fmt.Errorf("%w: rope over %d of %d dims with theta %g and %d frequencies", compute.ErrShape, r, d, a.Theta, len(a.Freqs))
	}
	scale := a.Scale
	if scale == 0 {
		scale = 1
	}
	T, half := x.Dims[0], r/2
	perRow := dims(x) / T
	heads := perRow / d
	table := make([]float32, 2*T*half) // cos, then sin
	for t, p := range a.Pos {
		for i := range half {
			sin, cos := math.Sincos(a.Angle(p, i, r))
			table[t*half+i], table[T*half+t*half+i] = float32(cos*scale), float32(sin*scale)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	// Scratch: the tables, then three [T, heads, half] temporaries.
	s, err := b.allocTensor(compute.F32, 2*T*half+3*T*heads*half)
	if err != nil {
		return err
	}
	defer b.freeBuf(s.Mem.(*devBuf))
	if err := b.putAsync(s, table); err != nil {
		return err
	}
	at := func(t compute.Tensor, off int) compute.Tensor { t.Off += off; return t }
	view := i64(T, heads, half)
	trig := func(off int) operand { return operand{t: at(s, off), view: i64(T, 1, half)} }
	cos, sin := trig(0), trig(T*half)
	tmp := func(k int) operand { return operand{t: at(s, 2*T*half+k*T*heads*half), view: view} }
	u := operand{t: x, view: view, strides: i64(perRow, d, 1)}
	v := operand{t: at(x, half), view: view, strides: i64(perRow, d, 1)}
	if a.Interleaved {
		u.strides = i64(perRow, d, 2)
		v = operand{t: at(x, 1), view: view, strides: i64(perRow, d, 2)}
	}
	one, minus, err := b.units()
	if err != nil {
		return err
	}
	mul := func(p, q, out operand) error {
		return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.binary("aclnnMul", ts[0], ts[1], ts[2]) }, p, q, out)
	}
	add := func(p, q operand, alpha scalar) error {
		return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.add(ts[0], ts[1], alpha, ts[2]) }, p, q, p)
	}
	cp := func(dst, src operand) error {
		return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.inplaceCopy(ts[0], ts[1]) }, dst, src)
	}
	for _, step := range []func() error{
		func() error { return mul(u, cos, tmp(0)) }, // u·c
		func() error { return mul(v, sin, tmp(1)) }, // v·s
		func() error { return add(tmp(0), tmp(1), minus) },
		func() error { return mul(u, sin, tmp(1)) }, // u·s
		func() error { return mul(v, cos, tmp(2)) }, // v·c
		func() error { return add(tmp(1), tmp(2), one) },
		func() error { return cp(u, tmp(0)) },
		func() error { return cp(v, tmp(1)) },
	} {
		if err := step(); err != nil {
			return fmt.Errorf("ascend: rope: %w", err)
		}
	}
	return nil
}
