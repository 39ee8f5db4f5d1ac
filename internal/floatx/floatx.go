// Package floatx converts between float32 and the narrow float formats that
// checkpoints store: bfloat16, IEEE binary16, fp8 e4m3fn with per-block
// scales and MXFP4 (fp4 e2m1 values with E8M0 scales).
//
// Every narrowing conversion rounds to nearest, ties to even, and keeps
// NaN, ±Inf, ±0 and subnormals exact where the target format has them.
package floatx

import "math"

// BF16 returns f rounded to bfloat16 (the upper 16 bits of a float32),
// ties to even. NaNs stay NaN (quieted); values too large round to ±Inf.
func BF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		// A NaN whose payload lives only in the low 16 bits would truncate
		// to Inf; setting the quiet bit keeps it a NaN.
		return uint16(b>>16) | 0x0040
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// FromBF16 widens a bfloat16 to float32 exactly.
func FromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F16 returns f rounded to IEEE binary16, ties to even, with gradual
// underflow to half-precision subnormals and overflow to ±Inf.
func F16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00 | uint16(man>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 31 {
		return sign | 0x7c00
	}
	if e <= 0 {
		if e < -10 {
			return sign
		}
		m := man | 0x800000
		shift := uint(14 - e)
		r := m >> shift
		rem := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || rem == half && r&1 == 1 {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || rem == 0x1000 && r&1 == 1 {
		r++ // a carry into the exponent is the correct rounding, up to Inf
	}
	return sign | uint16(r)
}

// FromF16 widens an IEEE binary16 to float32 exactly.
func FromF16(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
	case man == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: normalise the mantissa into a float32 normal.
	e := uint32(113)
	for man&0x400 == 0 {
		man <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (man&0x3ff)<<13)
}

// e4m3 holds the float32 value of every fp8 e4m3fn byte.
var e4m3 = func() (t [256]float32) {
	for i := range t {
		b := uint8(i)
		exp := int(b>>3) & 0xf
		man := float64(b & 7)
		var v float64
		switch {
		case exp == 0xf && man == 7:
			v = math.NaN()
		case exp == 0:
			v = man / 8 * math.Ldexp(1, -6)
		default:
			v = (1 + man/8) * math.Ldexp(1, exp-7)
		}
		if b&0x80 != 0 {
			v = -v
		}
		t[i] = float32(v)
	}
	return t
}()

// FromE4M3 widens an fp8 e4m3fn byte (bias 7, no infinities, 0x7f and 0xff
// are NaN, largest finite 448) to float32 exactly.
func FromE4M3(b uint8) float32 { return e4m3[b] }

// MaxE4M3 is the largest finite e4m3fn value.
const MaxE4M3 = 448

// E4M3 rounds f to fp8 e4m3fn, ties to even. Values beyond ±448 saturate to
// ±448 (the convention of DeepSeek's activation quantiser, which has no Inf
// to overflow to); NaN maps to NaN.
func E4M3(f float32) uint8 {
	var sign uint8
	if math.Signbit(float64(f)) {
		sign = 0x80
		f = -f
	}
	if f != f {
		return sign | 0x7f
	}
	if f >= MaxE4M3 {
		return sign | 0x7e
	}
	// Quantum of the binade f falls in: subnormals share the smallest one.
	_, e := math.Frexp(float64(f)) // f = m * 2^e, m in [0.5,1)
	q := e - 1 - 3
	if q < -9 {
		q = -9
	}
	n := math.RoundToEven(float64(f) / math.Ldexp(1, q)) // exact: scaling by a power of two
	v := n * math.Ldexp(1, q)
	if v >= MaxE4M3 {
		return sign | 0x7e
	}
	// Encode v exactly; binary search over the monotone positive half.
	lo, hi := 0, 0x7e
	for lo < hi {
		mid := (lo + hi) / 2
		if float64(e4m3[mid]) < v {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return sign | uint8(lo)
}
