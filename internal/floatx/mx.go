package floatx

import (
	"fmt"
	"math"
)

// MXGroup is how many consecutive values of a row share one scale in the
// OCP MX formats (MXFP4: e2m1 values, E8M0 scales).
const MXGroup = 32

// e2m1 is the value of each fp4 e2m1 nibble: bit 3 the sign, bits 0-2 an
// index into the eight magnitudes (exponent bias 1, one mantissa bit).
var e2m1 = [16]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, float32(math.Copysign(0, -1)), -0.5, -1, -1.5, -2, -3, -4, -6}

// FromE2M1 widens the fp4 e2m1 value in the low four bits of n.
func FromE2M1(n uint8) float32 { return e2m1[n&0xf] }

// E8M0NaN is the E8M0 code that encodes NaN; every other code s is
// 2^(s-127).
const E8M0NaN = 0xff

// FromE8M0 returns the power of two an E8M0 scale encodes, 2^(s-127)
// (exact in float32: 2^-127 is a float32 subnormal), or NaN for E8M0NaN.
func FromE8M0(s uint8) float32 {
	if s == E8M0NaN {
		return float32(math.NaN())
	}
	return float32(math.Ldexp(1, int(s)-127))
}

// DequantMXFP4 expands an MXFP4 matrix of rows×cols into dst (rows*cols
// float32s). packed holds two e2m1 values a byte, row-major, column 2j in
// the low nibble and 2j+1 in the high one (rows×cols/2 bytes: cols must be
// even); scale holds one E8M0 code per MXGroup columns of a row
// (rows×ceil(cols/MXGroup), the last group of a row may be partial). The
// values are exact: an e2m1 value has at most two significant bits. A NaN
// scale, or a value past float32's range, is an error naming its place.
func DequantMXFP4(dst []float32, packed, scale []uint8, rows, cols int) error {
	groups := (cols + MXGroup - 1) / MXGroup
	switch {
	case rows < 0 || cols < 0 || cols%2 != 0:
		return fmt.Errorf("floatx: MXFP4 matrix of %d×%d: the columns must be a non-negative even number", rows, cols)
	case len(packed) != rows*cols/2:
		return fmt.Errorf("floatx: MXFP4 matrix has %d bytes, want %d×%d/2", len(packed), rows, cols)
	case len(scale) != rows*groups:
		return fmt.Errorf("floatx: MXFP4 scale has %d entries, want %d×%d (groups of %d)", len(scale), rows, groups, MXGroup)
	case len(dst) != rows*cols:
		return fmt.Errorf("floatx: destination has %d elements, want %d×%d", len(dst), rows, cols)
	}
	for r := 0; r < rows; r++ {
		prow, drow := packed[r*cols/2:(r+1)*cols/2], dst[r*cols:(r+1)*cols]
		for g, s := range scale[r*groups : (r+1)*groups] {
			if s == E8M0NaN {
				return fmt.Errorf("floatx: MXFP4 row %d, columns %d-%d: scale is the NaN code %#x", r, g*MXGroup, min((g+1)*MXGroup, cols)-1, s)
			}
			f := FromE8M0(s)
			lo, hi := g*MXGroup, min((g+1)*MXGroup, cols)
			for c := lo; c < hi; c++ {
				n := prow[c/2] >> (4 * (c & 1)) & 0xf
				v := e2m1[n] * f
				if math.IsInf(float64(v), 0) {
					return fmt.Errorf("floatx: MXFP4 row %d, column %d: %g × 2^%d overflows float32", r, c, e2m1[n], int(s)-127)
				}
				drow[c] = v
			}
		}
	}
	return nil
}
