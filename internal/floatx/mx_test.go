package floatx

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// e2m1Def is an fp4 e2m1 nibble's value from the format's definition:
// sign bit 3, a two-bit exponent with bias 1 (0 is subnormal), one
// mantissa bit.
func e2m1Def(n uint8) float64 {
	e, m := int(n>>1&3), float64(n&1)
	v := (1 + m/2) * math.Ldexp(1, e-1)
	if e == 0 {
		v = m / 2
	}
	if n&8 != 0 {
		v = -v
	}
	return v
}

func TestE2M1(t *testing.T) {
	for n := range uint8(16) {
		got := FromE2M1(n)
		assert.Equal(t, e2m1Def(n), float64(got), "nibble %#x", n)
		assert.Equal(t, n&8 != 0, math.Signbit(float64(got)), "nibble %#x sign", n)
		assert.Equal(t, got, FromE2M1(n|0xf0), "high bits of %#x must be ignored", n)
	}
}

func TestE8M0(t *testing.T) {
	for s := range 255 {
		assert.Equal(t, math.Ldexp(1, s-127), float64(FromE8M0(uint8(s))), "code %d", s)
	}
	assert.True(t, math.IsNaN(float64(FromE8M0(E8M0NaN))))
}

// mxfp4Ref dequantises from the definitions, one element at a time.
func mxfp4Ref(packed, scale []uint8, rows, cols int) []float64 {
	groups := (cols + 31) / 32
	out := make([]float64, rows*cols)
	for r := range rows {
		for c := range cols {
			b := packed[(r*cols+c)/2]
			n := b & 0xf
			if c%2 == 1 {
				n = b >> 4
			}
			out[r*cols+c] = e2m1Def(n) * math.Ldexp(1, int(scale[r*groups+c/32])-127)
		}
	}
	return out
}

func TestDequantMXFP4(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, sh := range [][2]int{{1, 32}, {3, 70}, {5, 64}, {2, 2}, {4, 96}, {0, 32}} {
		rows, cols := sh[0], sh[1]
		groups := (cols + 31) / 32
		packed := make([]uint8, rows*cols/2)
		for i := range packed {
			packed[i] = uint8(rng.IntN(256))
		}
		scale := make([]uint8, rows*groups)
		for i := range scale {
			scale[i] = uint8(rng.IntN(40)) + 107 // 2^-20 .. 2^19
		}
		if len(scale) > 1 {
			scale[0] = 0   // the smallest scale, 2^-127: subnormal products
			scale[1] = 252 // 6 × 2^125, the largest reachable without overflow
		}
		dst := make([]float32, rows*cols)
		require.NoError(t, DequantMXFP4(dst, packed, scale, rows, cols))
		want := mxfp4Ref(packed, scale, rows, cols)
		bf := make([]byte, 2*rows*cols)
		require.NoError(t, DequantMXFP4BF16(bf, packed, scale, rows, cols))
		for i := range dst {
			require.Equal(t, want[i], float64(dst[i]), "%dx%d element %d", rows, cols, i)
			require.Equal(t, dst[i], FromBF16(BF16(dst[i])), "%dx%d element %d is not exact in bf16", rows, cols, i)
			require.Equal(t, BF16(dst[i]), uint16(bf[2*i])|uint16(bf[2*i+1])<<8, "%dx%d element %d in bf16", rows, cols, i)
		}
	}
}

func TestDequantMXFP4Errors(t *testing.T) {
	packed := make([]uint8, 2*48/2)
	scale := make([]uint8, 2*2)
	for i := range scale {
		scale[i] = 127
	}
	dst := make([]float32, 2*48)
	require.NoError(t, DequantMXFP4(dst, packed, scale, 2, 48))

	scale[3] = E8M0NaN
	err := DequantMXFP4(dst, packed, scale, 2, 48)
	require.ErrorContains(t, err, "row 1, columns 32-47")
	require.ErrorContains(t, err, "NaN")

	scale[3] = 254       // 2^127: 1.5 fits, 2 overflows
	packed[24+20] = 0x03 // row 1, columns 40 (1.5) and 41 (0)
	require.NoError(t, DequantMXFP4(dst, packed, scale, 2, 48))
	assert.Equal(t, float32(1.5*math.Ldexp(1, 127)), dst[48+40])
	packed[24+20] = 0xc3 // column 41: -2
	require.ErrorContains(t, DequantMXFP4(dst, packed, scale, 2, 48), "row 1, column 41: -2 × 2^127 overflows")

	require.ErrorContains(t, DequantMXFP4(make([]float32, 2*47), packed, scale, 2, 47), "even")
	require.ErrorContains(t, DequantMXFP4(dst, packed[1:], scale, 2, 48), "bytes")
	require.ErrorContains(t, DequantMXFP4(dst, packed, scale[1:], 2, 48), "scale has 3 entries")
	require.ErrorContains(t, DequantMXFP4(dst[1:], packed, scale, 2, 48), "destination")
	require.ErrorContains(t, DequantMXFP4BF16(make([]byte, 2*2*48), packed, scale, 2, 48), "row 1, column 41")
	require.ErrorContains(t, DequantMXFP4BF16(make([]byte, 2*48), packed, scale, 2, 48), "destination")
}

func FuzzDequantMXFP4(f *testing.F) {
	f.Add([]byte{0x12, 0x34}, []byte{127}, 1, 4)
	f.Add([]byte{0xff, 0xff}, []byte{254}, 1, 4)
	f.Fuzz(func(t *testing.T, packed, scale []byte, rows, cols int) {
		if rows < -4 || rows > 64 || cols < -4 || cols > 256 {
			return
		}
		dst := make([]float32, max(rows*cols, 0))
		if err := DequantMXFP4(dst, packed, scale, rows, cols); err != nil {
			return
		}
		want := mxfp4Ref(packed, scale, rows, cols)
		bf := make([]byte, 2*len(dst))
		if err := DequantMXFP4BF16(bf, packed, scale, rows, cols); err != nil {
			t.Fatalf("bf16: %v", err)
		}
		for i, v := range dst {
			if float64(v) != want[i] || math.IsInf(float64(v), 0) || v != v {
				t.Fatalf("element %d = %g, want %g", i, v, want[i])
			}
			if h := uint16(bf[2*i]) | uint16(bf[2*i+1])<<8; FromBF16(h) != v {
				t.Fatalf("element %d: bf16 %#04x, want %g", i, h, v)
			}
		}
	})
}

// BenchmarkDequantMXFP4BF16: loading one of the released K3's expert
// matrices (3072×3584), bytes counted as the values written.
func BenchmarkDequantMXFP4BF16(b *testing.B) {
	rows, cols := 3072, 3584
	packed := make([]uint8, rows*cols/2)
	scale := make([]uint8, rows*cols/MXGroup)
	for i := range packed {
		packed[i] = uint8(i * 7)
	}
	for i := range scale {
		scale[i] = uint8(100 + i%40)
	}
	dst := make([]byte, 2*rows*cols)
	b.SetBytes(int64(len(dst)))
	for b.Loop() {
		if err := DequantMXFP4BF16(dst, packed, scale, rows, cols); err != nil {
			b.Fatal(err)
		}
	}
}
