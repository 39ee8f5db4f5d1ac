package kernel

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// kpairTwins runs f on the plain-Go twin and, where the CPU has
// VDPBF16PS, on the pair tiles with the few-row tiles' prefetch off and on.
func kpairTwins(t *testing.T, f func(t *testing.T)) { tileTwins(t, hasBF16Dot, "vdpbf16ps", f) }

func TestPackKPairs(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	pool := NewPool(3)
	defer pool.Close()
	for _, sh := range [][2]int{{1, 2}, {47, 4}, {48, 6}, {49, 8}, {100, 34}, {200, 2}} {
		n, k := sh[0], sh[1]
		w := kmajWeights(r, n*k)
		wp := make([]uint16, KPairLen(n, k))
		for i := range wp {
			wp[i] = 0xffff // every padding element must be written
		}
		PackKPairs(wp, w, n, k)
		for p := 0; p*KMajorPanel < n; p++ {
			for kk := 0; kk < k; kk++ {
				for j := 0; j < KMajorPanel; j++ {
					want := uint16(0)
					if row := p*KMajorPanel + j; row < n {
						want = w[row*k+kk]
					}
					at := p*KMajorPanel*k + kk/2*2*KMajorPanel + 2*j + kk%2
					require.Equal(t, want, wp[at], "n %d k %d panel %d k %d col %d", n, k, p, kk, j)
				}
			}
		}
		par := make([]uint16, len(wp))
		pool.PackKPairs(par, w, n, k)
		require.Equal(t, wp, par, "n %d k %d: over the pool", n, k)
		back := make([]uint16, n*k)
		UnpackKPairs(back, wp, n, k)
		require.Equal(t, w, back, "n %d k %d: unpacked", n, k)
	}
	require.Panics(t, func() { PackKPairs(make([]uint16, KPairLen(4, 3)), make([]uint16, 12), 4, 3) }, "odd k")
}

// kpairRef is the float64 product of x rounded to bf16 and w, and the sum
// of the terms' magnitudes (the scale a float32 chain's error follows).
func kpairRef(x []float32, w []uint16, m, n, k int) (ref, mag []float64) {
	xb := make([]uint16, m*k)
	ToBF16(xb, x)
	ref, mag = make([]float64, m*n), make([]float64, m*n)
	for r := range m {
		for c := range n {
			var s, a float64
			for kk := range k {
				p := float64(bf16(xb[r*k+kk])) * float64(bf16(w[c*k+kk]))
				s += p
				a += math.Abs(p)
			}
			ref[r*n+c], mag[r*n+c] = s, a
		}
	}
	return ref, mag
}

// TestMatMulKPairs holds the pair product, on the pool and serially, to
// the float64 product of the rounded operands (an error of at most 1e-6
// of the terms' magnitudes, a float32 chain's k·2^-24 with margin) on
// shapes with partial panels, k past the k block, and every tile.
func TestMatMulKPairs(t *testing.T) {
	kpairTwins(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(33, 34))
		pool := NewPool(2)
		defer pool.Close()
		for _, sh := range [][3]int{{1, 48, 2}, {3, 50, 64}, {8, 96, 30}, {13, 431, 72}, {14, 97, 66}, {23, 48, 40}, {70, 100, 2*kmajKC + 6}, {5, 385, 2*kmajKC + 2}} {
			m, n, k := sh[0], sh[1], sh[2]
			w := kmajWeights(r, n*k)
			wp := make([]uint16, KPairLen(n, k))
			PackKPairs(wp, w, n, k)
			x := randSlice(r, m*k)
			ref, mag := kpairRef(x, w, m, n, k)
			got, ser := make([]float32, m*n), make([]float32, m*n)
			pool.MatMulKPairs(got, x, wp, m, n, k)
			MatMulKPairsSerial(ser, x, wp, make([]uint16, m*k), m, n, k)
			require.Equal(t, got, ser, "%dx%dx%d: serial and pool", m, n, k)
			for i := range got {
				require.InDelta(t, ref[i], float64(got[i]), 1e-6*mag[i]+1e-30, "%dx%dx%d: output %d", m, n, k, i)
			}
		}
	})
}

// TestKPairRowsAlone: a row's results are the same bits whatever the
// other rows of the product (every tile shape meets each row).
func TestKPairRowsAlone(t *testing.T) {
	kpairTwins(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(35, 36))
		pool := NewPool(2)
		defer pool.Close()
		n, k := 48*5+7, 2*kmajKC+10
		w := kmajWeights(r, n*k)
		wp := make([]uint16, KPairLen(n, k))
		PackKPairs(wp, w, n, k)
		const m = 23
		x := randSlice(r, m*k)
		alone := make([]float32, m*n)
		for i := range m {
			pool.MatMulKPairs(alone[i*n:(i+1)*n], x[i*k:(i+1)*k], wp, 1, n, k)
		}
		for _, rows := range []int{2, 3, 5, 7, 8, 9, 12, 16, 23} {
			got := make([]float32, rows*n)
			pool.MatMulKPairs(got, x[:rows*k], wp, rows, n, k)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(alone[i]) {
					t.Fatalf("%d rows: output %d is %v, alone %v", rows, i, got[i], alone[i])
				}
			}
		}
	})
}

func TestKPairAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	r := rand.New(rand.NewPCG(37, 38))
	pool := NewPool(2)
	defer pool.Close()
	n, k := 48*9+5, 64
	wp := make([]uint16, KPairLen(n, k))
	PackKPairs(wp, kmajWeights(r, n*k), n, k)
	xb := make([]uint16, 70*k)
	pool.MatMulKPairs(make([]float32, 70*n), randSlice(r, 70*k), wp, 70, n, k) // the pool's x buffer, once
	for _, m := range []int{1, 3, 8, 70} {
		x, y := randSlice(r, m*k), make([]float32, m*n)
		require.Zero(t, testing.AllocsPerRun(20, func() { pool.MatMulKPairs(y, x, wp, m, n, k) }), "%d rows on the pool", m)
		require.Zero(t, testing.AllocsPerRun(20, func() { MatMulKPairsSerial(y, x, wp, xb, m, n, k) }), "%d rows serially", m)
	}
}

// TestMatMulPanels: a k-major or pair-interleaved product computed a
// range of panels at a time (MatMulKMajorPanels, MatMulKPairsPanels) has
// the whole product's bits, over few rows (the four-stream tiles) and
// many, a narrower last panel and k past one k block.
func TestMatMulPanels(t *testing.T) {
	for _, pairs := range []bool{false, true} {
		twins, name := kmajTwins, "kmajor"
		if pairs {
			twins, name = kpairTwins, "kpairs"
		}
		t.Run(name, func(t *testing.T) {
			twins(t, func(t *testing.T) {
				r := rand.New(rand.NewPCG(37, 38))
				for _, sh := range [][3]int{{1, 48, 2}, {3, 400, 64}, {7, 431, 130}, {8, 97, 66}, {13, 1000, kmajKC + 40}, {70, 200, 34}} {
					m, n, k := sh[0], sh[1], sh[2]
					w := kmajWeights(r, n*k)
					x := randSlice(r, m*k)
					xb := make([]uint16, m*k)
					ToBF16(xb, x)
					var wp []uint16
					whole := make([]float32, m*n)
					if pairs {
						wp = make([]uint16, KPairLen(n, k))
						PackKPairs(wp, w, n, k)
						MatMulKPairsSerial(whole, x, wp, make([]uint16, m*k), m, n, k)
					} else {
						wp = make([]uint16, KMajorLen(n, k))
						PackKMajor(wp, w, n, k)
						MatMulKMajorSerial(whole, x, wp, m, n, k)
					}
					panels := (n + KMajorPanel - 1) / KMajorPanel
					for _, step := range []int{1, 3, 4, panels} {
						got := make([]float32, m*n)
						for p := 0; p < panels; p += step {
							if pairs {
								MatMulKPairsPanels(got, xb, wp, m, n, k, p, min(panels, p+step))
							} else {
								MatMulKMajorPanels(got, x, wp, m, n, k, p, min(panels, p+step))
							}
						}
						for i := range got {
							if math.Float32bits(got[i]) != math.Float32bits(whole[i]) {
								t.Fatalf("%dx%dx%d in ranges of %d panels: output %d is %v, the whole product's %v", m, n, k, step, i, got[i], whole[i])
							}
						}
					}
				}
				require.Panics(t, func() {
					MatMulKMajorPanels(make([]float32, 48), make([]float32, 2), make([]uint16, KMajorLen(48, 2)), 1, 48, 2, 0, 2)
				})
			})
		})
	}
}
