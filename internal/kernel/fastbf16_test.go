package kernel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestToBF16(t *testing.T) {
	cases := []struct {
		in   uint32
		want uint16
	}{
		{0x3f800000, 0x3f80}, // 1
		{0x3f808000, 0x3f80}, // halfway, to even (down)
		{0x3f818000, 0x3f82}, // halfway, to even (up)
		{0x3f808001, 0x3f81}, // above halfway
		{0xbf807fff, 0xbf80}, // below halfway, negative
		{0x7f7fffff, 0x7f80}, // the largest float32 rounds to +Inf
		{0x7f800000, 0x7f80}, // +Inf
		{0xff800000, 0xff80}, // -Inf
		{0x00000001, 0x0000}, // the smallest subnormal rounds to 0
	}
	for _, c := range cases {
		got := make([]uint16, 1)
		ToBF16(got, []float32{math.Float32frombits(c.in)})
		assert.Equal(t, c.want, got[0], "%#08x", c.in)
	}
	nan := make([]uint16, 1)
	ToBF16(nan, []float32{float32(math.NaN())})
	assert.True(t, math.IsNaN(float64(bf16(nan[0]))), "NaN stays NaN: %#04x", nan[0])
	ToBF16(nan, []float32{math.Float32frombits(0x7f800001)}) // a NaN whose top half is +Inf's
	assert.True(t, math.IsNaN(float64(bf16(nan[0]))), "a low-payload NaN stays NaN: %#04x", nan[0])
}

// TestToBF16Wide: the sixteen-wide rounding (where the CPU runs it) gives
// the scalar loop's bits for every kind of value (ties both ways, the
// largest finite values, infinities, NaNs of every payload, subnormals),
// at every length and alignment.
func TestToBF16Wide(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	special := []uint32{0, 0x80000000, 0x3f808000, 0x3f818000, 0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000,
		0x7f800001, 0xffffffff, 0x7fc00000, 0x7f807fff, 0x00000001, 0x807fffff, 0x00008000, 0x00018000}
	bits := make([]uint32, 1027)
	for i := range bits {
		switch i % 3 {
		case 0:
			bits[i] = special[r.IntN(len(special))]
		case 1:
			bits[i] = r.Uint32()
		default:
			bits[i] = r.Uint32()&0xffff0000 | 0x8000 // a tie
		}
	}
	src := make([]float32, len(bits))
	for i, b := range bits {
		src[i] = math.Float32frombits(b)
	}
	for _, n := range []int{0, 1, 15, 16, 17, 31, 32, 33, 1000, 1026} {
		for _, off := range []int{0, 1} {
			got, want := make([]uint16, n), make([]uint16, n)
			ToBF16(got, src[off:off+n])
			toBF16Scalar(want, src[off:off+n])
			require.Equal(t, want, got, "%d elements from %d", n, off)
		}
	}
}

// normF32 returns n draws of N(0, 1).
func normF32(r *rand.Rand, n int) []float32 {
	f := make([]float32, n)
	for i := range f {
		f[i] = float32(r.NormFloat64())
	}
	return f
}

// normBF16 returns n draws of N(0, 1) rounded to bf16.
func normBF16(r *rand.Rand, n int) []uint16 {
	b := make([]uint16, n)
	ToBF16(b, normF32(r, n))
	return b
}

// TestTileBF16: the tile (assembly where the CPU has VDPBF16PS) and its
// plain-Go twin give each dot product within float32 rounding of the
// float64 one, with strides of a row and 0 (a repeated row), into an
// output with a row stride of its own; how the instruction rounds inside
// a lane's pair is the CPU's, so the two are compared with the float64
// product rather than bit for bit.
func TestTileBF16(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, k := range []int{32, 96, 2048} {
		x, w := normBF16(r, 4*k), normBF16(r, 4*k)
		for _, s := range [][2]int{{k, k}, {0, k}, {k, 0}} {
			const ostride = 7
			asm, twin := make([]float32, 3*ostride+fastTile), make([]float32, 3*ostride+fastTile)
			tileBF16(x, s[0], w, s[1], k, asm, ostride)
			tileBF16Go(x, s[0], w, s[1], k, twin, ostride)
			for q := range fastTile {
				for c := range fastTile {
					var want, mag float64
					for e := range k {
						p := float64(bf16(x[q*s[0]+e])) * float64(bf16(w[c*s[1]+e]))
						want += p
						mag += math.Abs(p)
					}
					i := q*ostride + c
					assert.InDelta(t, want, asm[i], 1e-6*mag, "k %d strides %v tile (%d, %d)", k, s, q, c)
					assert.InDelta(t, want, twin[i], 1e-6*mag, "twin: k %d strides %v tile (%d, %d)", k, s, q, c)
				}
			}
		}
	}
}

// TestMatMulBF16Fast: every output is the dot product of the bf16-rounded
// x row with the weight row, within float32 rounding, for shapes with
// short last tiles of rows and columns; the result differs from the exact
// product by no more than rounding x to bf16 allows; a row's result does
// not depend on the other rows; and a depth that is not a multiple of 32
// runs the exact product.
func TestMatMulBF16Fast(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	r := rand.New(rand.NewPCG(3, 4))
	for _, sh := range [][3]int{{1, 1, 32}, {3, 5, 64}, {5, 13, 96}, {67, 64, 256}, {130, 37, 2048}} {
		m, n, k := sh[0], sh[1], sh[2]
		x := normF32(r, m*k)
		w := normBF16(r, n*k)
		got := make([]float32, m*n)
		p.MatMulBF16Fast(got, x, w, m, n, k)
		if !FastBF16Available() {
			// Without VDPBF16PS the fast product is the exact one.
			exact := make([]float32, m*n)
			p.MatMulBF16(exact, x, w, m, n, k)
			require.Equal(t, exact, got, "shape %v", sh)
			continue
		}
		xb := make([]uint16, m*k)
		ToBF16(xb, x)
		for i := range m {
			for j := range n {
				var want, exact, mag float64
				for e := range k {
					wv := float64(bf16(w[j*k+e]))
					want += float64(bf16(xb[i*k+e])) * wv
					exact += float64(x[i*k+e]) * wv
					mag += math.Abs(float64(x[i*k+e]) * wv)
				}
				require.InDelta(t, want, got[i*n+j], 1e-6*mag, "shape %v (%d, %d)", sh, i, j)
				require.InDelta(t, exact, got[i*n+j], math.Ldexp(mag, -8), "shape %v (%d, %d): against the exact product", sh, i, j)
			}
		}
		for _, i := range []int{0, m - 1} {
			alone := make([]float32, n)
			p.MatMulBF16Fast(alone, x[i*k:(i+1)*k], w, 1, n, k)
			require.Equal(t, got[i*n:(i+1)*n], alone, "shape %v: row %d alone", sh, i)
		}
	}
	// k not a multiple of 32: the exact product.
	m, n, k := 9, 7, 40
	x := normF32(r, m*k)
	w := normBF16(r, n*k)
	fast, exact := make([]float32, m*n), make([]float32, m*n)
	p.MatMulBF16Fast(fast, x, w, m, n, k)
	p.MatMulBF16(exact, x, w, m, n, k)
	assert.Equal(t, exact, fast)
	t.Logf("VDPBF16PS path: %v", FastBF16Available())
}

// BenchmarkMatMulBF16Fast times the fast product beside the exact one at
// the GEMM shapes of k3 bench kernels (GFLOP/s in the metric).
func BenchmarkMatMulBF16Fast(b *testing.B) {
	p := NewPool(0)
	defer p.Close()
	r := rand.New(rand.NewPCG(5, 6))
	for _, sh := range [][3]int{{512, 2304, 768}, {256, 2048, 2048}, {1024, 1024, 1024}} {
		m, n, k := sh[0], sh[1], sh[2]
		x := normF32(r, m*k)
		w := normBF16(r, n*k)
		y := make([]float32, m*n)
		for _, fast := range []bool{false, true} {
			name := fmt.Sprintf("%dx%dx%d/exact", m, n, k)
			if fast {
				name = fmt.Sprintf("%dx%dx%d/fast", m, n, k)
			}
			b.Run(name, func(b *testing.B) {
				for b.Loop() {
					if fast {
						p.MatMulBF16Fast(y, x, w, m, n, k)
					} else {
						p.MatMulBF16(y, x, w, m, n, k)
					}
				}
				b.ReportMetric(2*float64(m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
