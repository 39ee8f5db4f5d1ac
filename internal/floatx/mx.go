package floatx

import (
	"encoding/binary"
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

// e2m1Pairs holds the two e2m1 values of each byte: low nibble first.
var e2m1Pairs = func() (t [256][2]float32) {
	for b := range t {
		t[b] = [2]float32{e2m1[b&0xf], e2m1[b>>4]}
	}
	return t
}()

// DequantMXFP4 expands an MXFP4 matrix of rows×cols into dst (rows*cols
// float32s). packed holds two e2m1 values a byte, row-major, column 2j in
// the low nibble and 2j+1 in the high one (rows×cols/2 bytes: cols must be
// even); scale holds one E8M0 code per MXGroup columns of a row
// (rows×ceil(cols/MXGroup), the last group of a row may be partial). The
// values are exact: an e2m1 value has at most two significant bits. A NaN
// scale, or a value past float32's range, is an error naming its place.
func DequantMXFP4(dst []float32, packed, scale []uint8, rows, cols int) error {
	if err := checkMXFP4(len(packed), len(scale), rows, cols); err != nil {
		return err
	}
	if len(dst) != rows*cols {
		return fmt.Errorf("floatx: destination has %d elements, want %d×%d", len(dst), rows, cols)
	}
	groups := (cols + MXGroup - 1) / MXGroup
	for r := range rows {
		if err := mxfp4Row(dst[r*cols:(r+1)*cols], packed[r*cols/2:(r+1)*cols/2], scale[r*groups:(r+1)*groups], r); err != nil {
			return err
		}
	}
	return nil
}

// DequantMXFP4BF16 is DequantMXFP4 writing bfloat16 (little-endian, two
// bytes a value) into dst: exact, as the values are.
func DequantMXFP4BF16(dst []byte, packed, scale []uint8, rows, cols int) error {
	if err := checkMXFP4(len(packed), len(scale), rows, cols); err != nil {
		return err
	}
	if len(dst) != 2*rows*cols {
		return fmt.Errorf("floatx: destination has %d bytes, want 2×%d×%d", len(dst), rows, cols)
	}
	groups := (cols + MXGroup - 1) / MXGroup
	for r := range rows {
		prow, srow := packed[r*cols/2:(r+1)*cols/2], scale[r*groups:(r+1)*groups]
		if err := checkMXFP4Row(prow, srow, r, cols); err != nil {
			return err
		}
		out := dst[2*r*cols : 2*(r+1)*cols]
		for g, s := range srow {
			f := FromE8M0(s)
			for c := g * MXGroup; c < min((g+1)*MXGroup, cols); c += 2 {
				p := &e2m1Pairs[prow[c/2]]
				// Exact values: a bf16 is the float32's upper half.
				binary.LittleEndian.PutUint32(out[2*c:], math.Float32bits(p[0]*f)>>16|math.Float32bits(p[1]*f)&0xffff0000)
			}
		}
	}
	return nil
}

func checkMXFP4(packed, scale, rows, cols int) error {
	switch {
	case rows < 0 || cols < 0 || cols%2 != 0:
		return fmt.Errorf("floatx: MXFP4 matrix of %d×%d: the columns must be a non-negative even number", rows, cols)
	case packed != rows*cols/2:
		return fmt.Errorf("floatx: MXFP4 matrix has %d bytes, want %d×%d/2", packed, rows, cols)
	case scale != rows*((cols+MXGroup-1)/MXGroup):
		return fmt.Errorf("floatx: MXFP4 scale has %d entries, want %d×%d (groups of %d)", scale, rows, (cols+MXGroup-1)/MXGroup, MXGroup)
	}
	return nil
}

// checkMXFP4Row reports a NaN scale or a value past float32's range in
// row r.
func checkMXFP4Row(packed, scale []uint8, r, cols int) error {
	for g, s := range scale {
		if s < 253 { // only scales of 2^126 and up can take e2m1's 6 past float32's range
			continue
		}
		lo, hi := g*MXGroup, min((g+1)*MXGroup, cols)
		if s == E8M0NaN {
			return fmt.Errorf("floatx: MXFP4 row %d, columns %d-%d: scale is the NaN code %#x", r, lo, hi-1, s)
		}
		for c := lo; c < hi; c++ {
			n := packed[c/2] >> (4 * (c & 1)) & 0xf
			if v := e2m1[n] * FromE8M0(s); math.IsInf(float64(v), 0) {
				return fmt.Errorf("floatx: MXFP4 row %d, column %d: %g × 2^%d overflows float32", r, c, e2m1[n], int(s)-127)
			}
		}
	}
	return nil
}

// mxfp4Row expands row r. Groups start at even columns (MXGroup is even),
// so a byte's two values never straddle groups.
func mxfp4Row(dst []float32, packed, scale []uint8, r int) error {
	cols := len(dst)
	if err := checkMXFP4Row(packed, scale, r, cols); err != nil {
		return err
	}
	for g, s := range scale {
		f := FromE8M0(s)
		for c := g * MXGroup; c < min((g+1)*MXGroup, cols); c += 2 {
			p := &e2m1Pairs[packed[c/2]]
			dst[c], dst[c+1] = p[0]*f, p[1]*f
		}
	}
	return nil
}
