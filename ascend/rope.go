package ascend

import (
	"encoding/binary"
	"fmt"
	"math"

	"k3/compute"
)

// RoPE implements compute.Backend as a composition: each row's cos and
// sin are gathered (aclnnIndexSelect) by the positions tensor from a table
// of every position below MaxPos (ropeTable: computed on the host exactly
// as the pure-Go backend computes its angles, uploaded when it grows),
// then each pair (u, v), a strided view of X (halves or interleaved),
// becomes (u·c − v·s, u·s + v·c) by Mul and Add into scratch and copied
// back. Nothing of a call reads or writes the host once the table covers
// MaxPos, so a captured step rotates by the positions written before its
// replay.
func (b *Backend) RoPE(a *compute.RopeArgs) error {
	x := a.X
	if x.DType != compute.F32 || x.Rank < 2 || a.Pos.DType != compute.I32 || dims(a.Pos) != x.Dims[0] || a.MaxPos <= 0 {
		return fmt.Errorf("%w: rope input %v with positions %v below %d", compute.ErrShape, x, a.Pos, a.MaxPos)
	}
	d := x.Dim(-1)
	r := a.Dims
	if r == 0 {
		r = d
	}
	if r > d || r%2 != 0 || (a.Freqs == nil && !(a.Theta > 0)) || (a.Freqs != nil && len(a.Freqs) != r/2) {
		return fmt.Errorf("%w: rope over %d of %d dims with theta %g and %d frequencies", compute.ErrShape, r, d, a.Theta, len(a.Freqs))
	}
	T, half := x.Dims[0], r/2
	perRow := dims(x) / T
	heads := perRow / d
	b.lock()
	defer b.mu.Unlock()
	tab, err := b.ropeTable(a, r, a.MaxPos)
	if err != nil {
		return err
	}
	// Scratch: each row's cos and sin, then three [T, heads, half]
	// temporaries.
	s, err := b.allocTensor(compute.F32, 2*T*half+3*T*heads*half)
	if err != nil {
		return err
	}
	defer b.freeBuf(s.Mem.(*devBuf))
	for i, src := range []compute.Tensor{tab.cos, tab.sin} {
		if err := b.runAs("aclnnIndexSelect", func(ts []tensorDesc) (prepared, error) { return b.drv.indexSelect(ts[0], 0, ts[1], ts[2]) },
			flat(src, half), operand{t: a.Pos, view: i64(T)}, operand{t: part(s, i*T*half, T*half), view: i64(T, half)}); err != nil {
			return fmt.Errorf("ascend: rope angles: %w", err)
		}
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

// ropeKey names a table of angles: the frequencies (or theta), the
// rotated dimensions and the scale.
type ropeKey struct {
	theta, scale float64
	r            int
	freqs        string // the frequencies' float64 bits
}

// ropeTab holds cos and sin [n, r/2] of every position below n, computed
// on the host in float64 as the pure-Go backend computes its angles
// (cos(p·f) in float32 on the device would lose the angle at long
// positions), times the scale.
type ropeTab struct {
	cos, sin compute.Tensor
	n        int
}

// ropeTable returns a's table, grown to at least max positions (doubling,
// from 256). A grown table is a new buffer; the old one stays allocated
// with the backend, since a captured graph may read it. b.mu is held.
func (b *Backend) ropeTable(a *compute.RopeArgs, r, max int) (*ropeTab, error) {
	k := ropeKey{theta: a.Theta, scale: a.Scale, r: r}
	if a.Freqs != nil {
		bits := make([]byte, 8*len(a.Freqs))
		for i, f := range a.Freqs {
			binary.LittleEndian.PutUint64(bits[8*i:], math.Float64bits(f))
		}
		k.theta, k.freqs = 0, string(bits)
	}
	tab := b.ropes[k]
	if tab != nil && tab.n >= max {
		return tab, nil
	}
	n := 256
	if tab != nil {
		n = 2 * tab.n
	}
	for n < max {
		n *= 2
	}
	scale := a.Scale
	if scale == 0 {
		scale = 1
	}
	half := r / 2
	vals := make([]float32, 2*n*half) // cos, then sin
	for p := range n {
		for i := range half {
			sin, cos := math.Sincos(a.Angle(int32(p), i, r))
			vals[p*half+i], vals[n*half+p*half+i] = float32(cos*scale), float32(sin*scale)
		}
	}
	t, err := b.allocTensor(compute.F32, 2*n*half)
	if err != nil {
		return nil, err
	}
	if err := b.put(t, vals); err != nil {
		b.freeBuf(t.Mem.(*devBuf))
		return nil, fmt.Errorf("ascend: rope table of %d positions: %w", n, err)
	}
	tab = &ropeTab{cos: part(t, 0, n*half), sin: part(t, n*half, n*half), n: n}
	if b.ropes == nil {
		b.ropes = map[ropeKey]*ropeTab{}
	}
	b.ropes[k] = tab
	return tab, nil
}
