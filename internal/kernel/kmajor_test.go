package kernel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// kmajWeights returns n random bf16 weights.
func kmajWeights(r *rand.Rand, n int) []uint16 {
	w, _ := randBF16(r, n)
	return w
}

// kmajTwins runs f on the plain-Go twin and, where the CPU has them, on
// the 512-bit tiles, with the few-row tiles' prefetch of each CPU kind
// (kmajFewAhead: none, or 1,536 bytes ahead).
func kmajTwins(t *testing.T, f func(t *testing.T)) { tileTwins(t, hasZMM, "zmm", f) }

// tileTwins runs f on the plain-Go twin of the k-major driver's tiles
// and, where asm, on the assembly tiles (named name) with the few-row
// tiles' prefetch off and 1,536 bytes ahead.
func tileTwins(t *testing.T, asm bool, name string, f func(t *testing.T)) {
	t.Run("go", func(t *testing.T) {
		kmajGo = true
		defer func() { kmajGo = false }()
		f(t)
	})
	if !asm {
		return
	}
	for _, ahead := range []int{0, 1536} {
		t.Run(fmt.Sprintf("%s/ahead=%d", name, ahead), func(t *testing.T) {
			kmajFewAheadBytes = ahead
			defer func() { kmajFewAheadBytes = -1 }()
			f(t)
		})
	}
}

func TestPackKMajor(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, sh := range [][2]int{{1, 1}, {47, 3}, {48, 5}, {49, 8}, {100, 33}} {
		n, k := sh[0], sh[1]
		w := kmajWeights(r, n*k)
		wp := make([]uint16, KMajorLen(n, k))
		for i := range wp {
			wp[i] = 0xffff // every padding element must be written
		}
		PackKMajor(wp, w, n, k)
		for p := 0; p*KMajorPanel < n; p++ {
			for kk := 0; kk < k; kk++ {
				for j := 0; j < KMajorPanel; j++ {
					want := uint16(0)
					if row := p*KMajorPanel + j; row < n {
						want = w[row*k+kk]
					}
					require.Equal(t, want, wp[(p*k+kk)*KMajorPanel+j], "n %d k %d panel %d k %d col %d", n, k, p, kk, j)
				}
			}
		}
		par := make([]uint16, len(wp))
		pool := NewPool(2)
		pool.PackKMajor(par, w, n, k)
		pool.Close()
		require.Equal(t, wp, par, "n %d k %d: packed on the pool", n, k)
		back := make([]uint16, n*k)
		UnpackKMajor(back, wp, n, k)
		require.Equal(t, w, back, "n %d k %d", n, k)
	}
}

// TestMatMulKMajor checks every output against one FMA chain over k in
// order, bit for bit, on shapes that cover each row tile, partial panels
// and products blocked over k.
func TestMatMulKMajor(t *testing.T) {
	kmajTwins(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 4))
		pool := NewPool(2)
		defer pool.Close()
		for _, sh := range [][3]int{
			{1, 48, 1}, {1, 1, 7}, {2, 96, 64}, {3, 47, 33}, {7, 100, 16},
			{8, 48, 96}, {15, 144, 40}, {9, 50, kmajKC + 3}, {70, 97, 24}, {130, 49, 17},
			// Fewer than eight rows over enough panels for the four-stream
			// tiles, some blocked over k.
			{1, 48 * 9, 64}, {2, 480, kmajKC + 9}, {3, 48*17 + 5, kmajKC + 1}, {5, 48 * 12, 16},
			{6, 48 * 8, 24}, {7, 48*16 + 47, 40}, {5, 48 * 9, kmajKC + 5},
			// Last panels of 16 and 32 columns, which eight rows take on
			// the edge tiles (and the rows past a multiple of eight
			// through the buffer).
			{8, 64, 96}, {16, 32, kmajKC + 3}, {19, 48*2 + 32, 40}, {70, 16, 24}, {67, 48*5 + 16, 2*kmajKC + 5},
		} {
			m, n, k := sh[0], sh[1], sh[2]
			x, w := randSlice(r, m*k), kmajWeights(r, n*k)
			wp := make([]uint16, KMajorLen(n, k))
			PackKMajor(wp, w, n, k)
			got := make([]float32, m*n)
			pool.MatMulKMajor(got, x, wp, m, n, k)
			serial := make([]float32, m*n)
			MatMulKMajorSerial(serial, x, wp, m, n, k)
			for i := 0; i < m; i++ {
				for j := 0; j < n; j++ {
					var s float32
					for q := 0; q < k; q++ {
						s = fma32(x[i*k+q], bf16(w[j*k+q]), s)
					}
					require.Equal(t, math.Float32bits(s), math.Float32bits(got[i*n+j]), "%dx%dx%d: row %d col %d: %v, want %v", m, n, k, i, j, got[i*n+j], s)
				}
			}
			require.Equal(t, got, serial, "%dx%dx%d: serial", m, n, k)
		}
	})
}

// TestKMajorRowsAlone checks that each row of a k-major product of 1 to 300
// rows gets, bit for bit, what it gets alone: the promise that lets decode
// batches, scheduler passes and prefill chunks of any length agree.
func TestKMajorRowsAlone(t *testing.T) {
	kmajTwins(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		pool := NewPool(2)
		defer pool.Close()
		// Rows alone take the four-stream tiles; k 72 is one k block, k
		// 2·kmajKC+24 three, the last short (three rows go through the
		// four-row tiles a k block at a time).
		// The last panels hold 7, 32 and 16 columns.
		for _, c := range []struct{ n, k, most int }{{48*9 + 7, 72, 300}, {48*9 + 7, 2*kmajKC + 24, 40}, {48*4 + 32, 72, 140}, {64, kmajKC + 24, 70}} {
			n, k, most := c.n, c.k, c.most
			w := kmajWeights(r, n*k)
			wp := make([]uint16, KMajorLen(n, k))
			PackKMajor(wp, w, n, k)
			x := randSlice(r, most*k)
			alone := make([]float32, most*n)
			for i := 0; i < most; i++ {
				pool.MatMulKMajor(alone[i*n:(i+1)*n], x[i*k:(i+1)*k], wp, 1, n, k)
			}
			got := make([]float32, most*n)
			for _, m := range []int{2, 3, 5, 7, 8, 12, 17, 24, 33, 64, 65, 129, 300} {
				if m > most {
					continue
				}
				t.Run(fmt.Sprint(k, "/", m), func(t *testing.T) {
					// Rows from an offset, so that a row sits in a different
					// place of the tiles than when it starts a product.
					off := (most - m) / 2
					pool.MatMulKMajor(got[:m*n], x[off*k:(off+m)*k], wp, m, n, k)
					require.Equal(t, alone[off*n:(off+m)*n], got[:m*n])
					// Serially too (an expert's product), three rows among them.
					MatMulKMajorSerial(got[:m*n], x[off*k:(off+m)*k], wp, m, n, k)
					require.Equal(t, alone[off*n:(off+m)*n], got[:m*n])
				})
			}
		}
	})
}

// TestKMajorAllocs: a warm k-major product allocates nothing, on the pool
// and serially (the experts' products), at decode and prefill sizes.
func TestKMajorAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	r := rand.New(rand.NewPCG(9, 10))
	pool := NewPool(2)
	defer pool.Close()
	n, k := 48*9+5, 64
	wp := make([]uint16, KMajorLen(n, k))
	PackKMajor(wp, kmajWeights(r, n*k), n, k)
	for _, m := range []int{1, 3, 8, 70} {
		x, y := randSlice(r, m*k), make([]float32, m*n)
		require.Zero(t, testing.AllocsPerRun(20, func() { pool.MatMulKMajor(y, x, wp, m, n, k) }), "%d rows on the pool", m)
		require.Zero(t, testing.AllocsPerRun(20, func() { MatMulKMajorSerial(y, x, wp, m, n, k) }), "%d rows serially", m)
	}
}
