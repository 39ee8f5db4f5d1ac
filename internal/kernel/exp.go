package kernel

import (
	"math"
)

// Exp returns e^x in float32, about ten times faster than math.Exp and
// within 3e-7 relative of it for x in [-87, 88]. Results that would be
// subnormal flush to 0; above 88.72 it returns +Inf; NaN stays NaN.
//
// ExpSlice computes exactly the same values eight at a time; the steps
// below (round to nearest even, separate multiplies and adds, no fused
// multiply-add) are the ones the assembly takes, so the two agree bit for
// bit.
func Exp(x float32) float32 {
	switch {
	case x != x:
		return x
	case x < expLow:
		return 0
	case x > expHigh:
		return float32(math.Inf(1))
	}
	n := float32(math.RoundToEven(float64(x * log2e)))
	// x = n·ln2 + r with |r| <= ln2/2; ln2 in two parts so n·ln2Hi is exact.
	// Every product is converted explicitly: the conversion rounds it, which
	// keeps the compiler from fusing it into a multiply-add (the vector code
	// does not fuse either).
	r := x - float32(n*ln2Hi)
	r -= float32(n * ln2Lo)
	p := c6 + float32(r*c7)
	p = c5 + float32(r*p)
	p = c4 + float32(r*p)
	p = c3 + float32(r*p)
	p = c2 + float32(r*p)
	p = c1 + float32(r*p)
	p = c0 + float32(r*p)
	if n > 127 { // x in (88.03, 88.72]: 2^128 itself is not a float32
		return float32(p*2) * math.Float32frombits(uint32(int32(n)+126)<<23)
	}
	return p * math.Float32frombits(uint32(int32(n)+127)<<23)
}

const (
	expLow  = -87.3
	expHigh = 88.72
	log2e   = float32(1.44269504088896341)
	ln2Hi   = float32(0.693145751953125)
	ln2Lo   = float32(1.42860682030941723212e-6)
	c0      = float32(1)
	c1      = float32(1)
	c2      = float32(1.0 / 2)
	c3      = float32(1.0 / 6)
	c4      = float32(1.0 / 24)
	c5      = float32(1.0 / 120)
	c6      = float32(1.0 / 720)
	c7      = float32(1.0 / 5040)
)

// ExpSlice replaces every element of x by Exp of it.
func ExpSlice(x []float32) { expSliceWith(x, &expConsts) }

// ExpSliceFlush replaces every element of x by Exp of it, or by 0 where it
// is below low (low >= -87.3, where Exp flushes anyway). Where x is a
// decay's log, the factors it drops would only carry values toward the
// subnormal range, whose arithmetic some CPUs run a hundred times slower.
func ExpSliceFlush(x []float32, low float32) {
	k := expConsts
	k[0] = max(low, expLow)
	expSliceWith(x, &k)
}

// expSliceWith is ExpSlice with the constants k, whose first entry is the
// bound below which a result is 0.
func expSliceWith(x []float32, k *[16]float32) {
	i := 0
	if len(x) >= 16 && expWide() {
		i = len(x) &^ 15
		expZMM(&x[0], i, k)
	}
	if useAVX2 && len(x)-i >= 8 {
		n := (len(x) - i) &^ 7
		expAVX2(&x[i], n, k)
		i += n
	}
	for ; i < len(x); i++ {
		if x[i] < k[0] {
			x[i] = 0
		} else {
			x[i] = Exp(x[i])
		}
	}
}

// ExpScale sets, for rows rows of n floats, d1 = x1 ⊙ e and, where d2 is
// not nil, d2 = x2 ⊙ e, with e = Exp(a - b) (b nil: Exp(a)), or 0 where
// a - b is below low, as ExpSliceFlush makes it. Row r of a starts at
// r·as and of b at r·bs (a stride of 0: one row for all); the others' rows
// are n apart. The bits are those of Sub, ExpSliceFlush and Mul; where the
// 512-bit exponential runs it is one pass with e kept in registers,
// elsewhere those passes through e (scratch of rows·n floats).
func ExpScale(d1, d2, x1, x2, a []float32, as int, b []float32, bs, rows, n int, low float32, e []float32) {
	if rows == 0 || n == 0 {
		return
	}
	last := (rows-1)*n + n
	_, _ = d1[last-1], x1[last-1]
	_ = a[(rows-1)*as+n-1]
	if d2 != nil {
		_, _ = d2[last-1], x2[last-1]
	}
	if b != nil {
		_ = b[(rows-1)*bs+n-1]
	} else {
		bs = 0
	}
	k := expConsts
	k[0] = max(low, expLow)
	if n%16 == 0 && expWide() {
		var p2, px2, pb *float32
		if d2 != nil {
			p2, px2 = &d2[0], &x2[0]
		}
		if b != nil {
			pb = &b[0]
		}
		expScaleZMM(&d1[0], p2, &x1[0], px2, &a[0], as, pb, bs, rows, n, &k)
		return
	}
	e = e[:last]
	for r := range rows {
		er := e[r*n : (r+1)*n]
		if b != nil {
			Sub(er, a[r*as:r*as+n], b[r*bs:r*bs+n])
		} else {
			copy(er, a[r*as:r*as+n])
		}
	}
	expSliceWith(e, &k)
	Mul(d1[:last], x1[:last], e)
	if d2 != nil {
		Mul(d2[:last], x2[:last], e)
	}
}

// SigmoidSlice replaces every element of x by Sigmoid of it.
func SigmoidSlice(x []float32) {
	i := 0
	if len(x) >= 16 && expWide() {
		i = len(x) &^ 15
		sigmoidZMM(&x[0], i, &expConsts)
	}
	if useAVX2 && len(x)-i >= 8 {
		n := (len(x) - i) &^ 7
		sigmoidAVX2(&x[i], n, &expConsts)
		i += n
	}
	for ; i < len(x); i++ {
		x[i] = Sigmoid(x[i])
	}
}

// expConsts feeds the assembly: broadcast constants, in this order.
var expConsts = [16]float32{
	expLow, expHigh, log2e, ln2Hi, ln2Lo, c7, c6, c5, c4, c3, c2, c1, c0,
	float32(math.Inf(1)), 2, 0,
}

// expTileBits forces the vector exponential's register width for tests
// and benchmarks: 0 follows hasZMM, 256 and 512 force that many bits
// (512 needs hasZMM). Both widths give the same bits.
var expTileBits int

// expWide reports whether ExpSlice and SigmoidSlice take sixteen lanes at
// a time on zmm registers (expZMM, sigmoidZMM: expBody's operations with
// the constants held in registers). They do wherever the CPU has the
// 512-bit kernels, whatever its FMA width: on Zen 4, whose 512-bit FMAs
// run as two halves, ExpSlice still runs 1.9x its 256-bit twin (fewer
// instructions, no constant reloads; docs/bench).
func expWide() bool {
	switch expTileBits {
	case 256:
		return false
	case 512:
		return hasZMM
	}
	return hasZMM
}

// wideElementwise reports whether the elementwise kernels that have a
// 512-bit form (MulScale, Scale) take sixteen lanes at a time: where the
// vector exponential does (tests force both widths through expTileBits).
// Each lane's arithmetic is the 256-bit kernels', so the bits are theirs.
func wideElementwise() bool { return expWide() }
