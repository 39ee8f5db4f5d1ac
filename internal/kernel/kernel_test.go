package kernel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

func TestMatMulShapes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	p := NewPool(0)
	defer p.Close()
	for _, m := range []int{1, 2, 3, 8, 12, 16, 24, 41, 70} {
		for _, n := range []int{1, 3, 4, 5, 17, 64} {
			for _, k := range []int{1, 15, 16, 17, 31, 63, 64, 65, 130, 136} {
				x, w := randSlice(r, m*k), randSlice(r, n*k)
				wb := make([]uint16, len(w))
				for i, v := range w {
					wb[i] = uint16(math.Float32bits(v) >> 16) // truncation: exact in both paths
					w[i] = math.Float32frombits(uint32(wb[i]) << 16)
				}
				got, gotB := make([]float32, m*n), make([]float32, m*n)
				p.MatMul(got, x, w, m, n, k)
				p.MatMulBF16(gotB, x, wb, m, n, k)
				for i := 0; i < m; i++ {
					for j := 0; j < n; j++ {
						var want, mag float64
						for q := 0; q < k; q++ {
							want += float64(x[i*k+q]) * float64(w[j*k+q])
							mag += math.Abs(float64(x[i*k+q]) * float64(w[j*k+q]))
						}
						tol := 1e-6*mag + 1e-7
						if d := math.Abs(float64(got[i*n+j]) - want); !(d <= tol) {
							t.Fatalf("f32 m=%d n=%d k=%d (%d,%d): %g want %g", m, n, k, i, j, got[i*n+j], want)
						}
						if d := math.Abs(float64(gotB[i*n+j]) - want); !(d <= tol) {
							t.Fatalf("bf16 m=%d n=%d k=%d (%d,%d): %g want %g", m, n, k, i, j, gotB[i*n+j], want)
						}
					}
				}
			}
		}
	}
}

// TestMatMulSwapBits: MatMulSerial with float32 weights gives each output
// the same bits whichever operand is x: y = a·bᵀ and z = b·aᵀ have
// y[i][j] == z[j][i], whatever tiles the two shapes take (grouped
// attention scores few heads as the keys' product with the queries,
// cpu's groupBlock).
func TestMatMulSwapBits(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, m := range []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 24, 63} {
		for _, n := range []int{1, 2, 3, 5, 6, 7, 8, 12, 33, 64} {
			for _, k := range []int{1, 7, 8, 16, 32, 33, 96, 256, 288} {
				a, b := randSlice(r, m*k), randSlice(r, n*k)
				y, z := make([]float32, m*n), make([]float32, n*m)
				MatMulSerial(y, a, b, m, n, k)
				MatMulSerial(z, b, a, n, m, k)
				for i := range m {
					for j := range n {
						if math.Float32bits(y[i*n+j]) != math.Float32bits(z[j*m+i]) {
							t.Fatalf("m=%d n=%d k=%d (%d,%d): %g against %g swapped", m, n, k, i, j, y[i*n+j], z[j*m+i])
						}
					}
				}
			}
		}
	}
}

func TestMatMulUnalignedStart(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	p := NewPool(2)
	defer p.Close()
	k, n := 37, 9
	buf := randSlice(r, n*k+1)
	w := buf[1:] // start one float past the allocation's alignment
	x := randSlice(r, k)
	got := make([]float32, n)
	p.MatMul(got, x, w, 1, n, k)
	for j := 0; j < n; j++ {
		var want float64
		for q := 0; q < k; q++ {
			want += float64(x[q]) * float64(w[j*k+q])
		}
		if !(math.Abs(float64(got[j])-want) <= 1e-4) {
			t.Fatalf("row %d: %g want %g", j, got[j], want)
		}
	}
}

func TestMatMulNoAlloc(t *testing.T) {
	p := NewPool(0)
	defer p.Close()
	x, w, y := make([]float32, 256), make([]float32, 256*512), make([]float32, 512)
	wb := make([]uint16, len(w))
	xs, ys := make([]float32, 128*256), make([]float32, 128*6)
	if n := testing.AllocsPerRun(20, func() {
		p.MatMul(y, x, w, 1, 512, 256)
		p.MatMulBF16(y, x, wb, 1, 512, 256)
		p.MatMul(ys, xs, w, 128, 6, 256) // split by x rows (byRows)
		p.MatMulBF16(ys, xs, wb, 128, 6, 256)
	}); n != 0 && !raceEnabled {
		t.Errorf("MatMul allocates %v times per call", n)
	}
}

func TestNorms(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	d := 24
	x, w, b := randSlice(r, 3*d), randSlice(r, d), randSlice(r, d)
	rms, ln := make([]float32, len(x)), make([]float32, len(x))
	RMSNorm(rms, x, w, d, 1e-5)
	LayerNorm(ln, x, w, b, d, 1e-6)
	for row := 0; row < 3; row++ {
		v := x[row*d : (row+1)*d]
		var ss, mean, vr float64
		for _, e := range v {
			ss += float64(e) * float64(e)
			mean += float64(e)
		}
		mean /= float64(d)
		for _, e := range v {
			vr += (float64(e) - mean) * (float64(e) - mean)
		}
		vr /= float64(d)
		for i := range v {
			want := float64(v[i]) / math.Sqrt(ss/float64(d)+1e-5) * float64(w[i])
			if !(math.Abs(float64(rms[row*d+i])-want) <= 1e-5) {
				t.Fatalf("rmsnorm %d,%d: %g want %g", row, i, rms[row*d+i], want)
			}
			want = (float64(v[i])-mean)/math.Sqrt(vr+1e-6)*float64(w[i]) + float64(b[i])
			if !(math.Abs(float64(ln[row*d+i])-want) <= 1e-5) {
				t.Fatalf("layernorm %d,%d: %g want %g", row, i, ln[row*d+i], want)
			}
		}
	}
}

func TestActivations(t *testing.T) {
	for _, x := range []float64{-100, -20, -1, -1e-3, 0, 0.5, 3, 25, 100} {
		sig := 1 / (1 + math.Exp(-x))
		if math.Abs(float64(Sigmoid(float32(x)))-sig) > 1e-7 {
			t.Errorf("sigmoid(%g) = %g", x, Sigmoid(float32(x)))
		}
		if math.Abs(float64(SiLU(float32(x)))-x*sig) > 1e-5*math.Max(1, math.Abs(x)) {
			t.Errorf("silu(%g) = %g", x, SiLU(float32(x)))
		}
		sp := math.Log1p(math.Exp(x))
		if x > 20 {
			sp = x
		}
		if math.Abs(float64(Softplus(float32(x)))-sp) > 1e-5*math.Max(1, sp) {
			t.Errorf("softplus(%g) = %g", x, Softplus(float32(x)))
		}
	}
	g, u := []float32{-3, 0.5, 40}, []float32{2, -30, 100}
	dst := make([]float32, 3)
	SiTU(dst, g, u, 4, 25)
	for i := range g {
		gg, uu := float64(g[i]), float64(u[i])
		want := 4 * math.Tanh(gg/4) / (1 + math.Exp(-gg)) * 25 * math.Tanh(uu/25)
		if !(math.Abs(float64(dst[i])-want) <= 1e-4*math.Max(1, math.Abs(want))) {
			t.Errorf("situ(%g,%g) = %g want %g", g[i], u[i], dst[i], want)
		}
	}
	s := []float32{1000, 999, float32(math.Inf(-1))}
	Softmax(s)
	if math.Abs(float64(s[0])-1/(1+math.Exp(-1))) > 1e-6 || s[2] != 0 {
		t.Errorf("softmax %v", s)
	}
	allInf := []float32{float32(math.Inf(-1)), float32(math.Inf(-1))}
	Softmax(allInf)
	if allInf[0] != 0 || allInf[1] != 0 {
		t.Errorf("softmax of -Inf row %v", allInf)
	}
}

func TestTopK(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	nan := float32(math.NaN())
	negZero := float32(math.Copysign(0, -1))
	for trial := 0; trial < 300; trial++ {
		n := r.IntN(70)
		x := make([]float32, n)
		for i := range x {
			switch r.IntN(6) {
			case 0:
				x[i] = 0
			case 1:
				x[i] = negZero
			case 2:
				x[i] = float32(r.IntN(3))
			case 3:
				if trial%5 == 0 {
					x[i] = nan
				} else {
					x[i] = float32(math.Inf(-1))
				}
			default:
				x[i] = float32(r.NormFloat64())
			}
		}
		k := r.IntN(20)
		order := make([]int32, n)
		for i := range order {
			order[i] = int32(i)
		}
		sort.SliceStable(order, func(a, b int) bool {
			va, vb := x[order[a]], x[order[b]]
			if va != va || vb != vb {
				return vb != vb && va == va
			}
			return va > vb
		})
		idx := make([]int32, k)
		vals := make([]float32, k)
		got := TopK(idx, vals, x, k)
		if got != min(k, n) {
			t.Fatalf("count %d want %d", got, min(k, n))
		}
		for i := 0; i < got; i++ {
			if idx[i] != order[i] {
				t.Fatalf("trial %d: x=%v k=%d got %v want %v", trial, x, k, idx[:got], order[:got])
			}
			if vals[i] != x[idx[i]] && vals[i] == vals[i] {
				t.Fatalf("vals mismatch")
			}
		}
	}
	idx := make([]int32, 4)
	if n := testing.AllocsPerRun(10, func() { TopK(idx, nil, make([]float32, 0), 4) }); n != 0 && !raceEnabled {
		t.Errorf("TopK allocates")
	}
}

func TestPoolCoversRange(t *testing.T) {
	p := NewPool(3)
	defer p.Close()
	for _, n := range []int{0, 1, 5, 16, 17, 100, 1000} {
		for _, grain := range []int{1, 4, 16} {
			hits := make([]float32, n)
			p.Run(func(a *Args, lo, hi int) {
				for i := lo; i < hi; i++ {
					a.Dst[i]++
				}
			}, Args{Dst: hits}, n, grain)
			for i, h := range hits {
				if h != 1 {
					t.Fatalf("n=%d grain=%d: element %d visited %v times", n, grain, i, h)
				}
			}
		}
	}
}

// TestPoolRangesFixed: the ranges Run hands out depend on n, grain and
// the pool's size only, never on which goroutine came first, and each is a
// multiple of grain except the last.
func TestPoolRangesFixed(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	for _, n := range []int{2, 7, 48, 1000} {
		for _, grain := range []int{1, 4, 64} {
			var first []int
			for run := range 50 {
				var mu sync.Mutex
				var got []int
				p.Run(func(a *Args, lo, hi int) {
					mu.Lock()
					got = append(got, lo, hi)
					mu.Unlock()
				}, Args{}, n, grain)
				pairs := make([][2]int, 0, len(got)/2)
				for i := 0; i < len(got); i += 2 {
					pairs = append(pairs, [2]int{got[i], got[i+1]})
				}
				slices.SortFunc(pairs, func(a, b [2]int) int { return a[0] - b[0] })
				flat := make([]int, 0, len(got))
				for i, r := range pairs {
					require.True(t, r[0]%grain == 0 && (r[1]%grain == 0 || r[1] == n), "n=%d grain=%d: range %v", n, grain, r)
					require.True(t, i == 0 && r[0] == 0 || i > 0 && r[0] == pairs[i-1][1], "n=%d grain=%d: ranges %v leave a gap", n, grain, pairs)
					flat = append(flat, r[0], r[1])
				}
				require.Equal(t, n, pairs[len(pairs)-1][1])
				if chunks := (n + grain - 1) / grain; chunks >= p.Pieces() {
					require.Greater(t, len(pairs), p.Size(), "n=%d grain=%d: a goroutine's share is one range", n, grain)
				}
				if run == 0 {
					first = flat
					continue
				}
				require.Equal(t, first, flat, "n=%d grain=%d: run %d", n, grain, run)
			}
		}
	}
}

// coveredOnce runs a kernel over n items through run, requires that it
// visited every item once and returns the ranges it was called with.
func coveredOnce(t *testing.T, run func(func(a *Args, lo, hi int), Args, int, int), n, grain int) [][2]int {
	t.Helper()
	var mu sync.Mutex
	var got [][2]int
	hits := make([]float32, n)
	run(func(a *Args, lo, hi int) {
		for i := lo; i < hi; i++ {
			a.Dst[i]++
		}
		mu.Lock()
		got = append(got, [2]int{lo, hi})
		mu.Unlock()
	}, Args{Dst: hits}, n, grain)
	for i, h := range hits {
		require.Equal(t, float32(1), h, "n=%d grain=%d: element %d", n, grain, i)
	}
	return got
}

// TestPoolRunEach: RunEach covers [0, n) once in ranges of exactly grain
// items (the last one shorter), whatever their number, on a pool of one
// goroutine too. (TestPoolTakesStalledShare stalls a range of it.)
func TestPoolRunEach(t *testing.T) {
	for _, size := range []int{1, 2, 3} {
		p := NewPool(size)
		for _, n := range []int{0, 1, 5, 17, 64, 1000} {
			for _, grain := range []int{1, 3, 16} {
				got := coveredOnce(t, p.RunEach, n, grain)
				if size == 1 || n <= grain {
					continue // one call for the whole range
				}
				slices.SortFunc(got, func(a, b [2]int) int { return a[0] - b[0] })
				require.Len(t, got, (n+grain-1)/grain, "size=%d n=%d grain=%d: ranges %v", size, n, grain, got)
				for _, r := range got {
					require.True(t, r[1]-r[0] == grain || r[1] == n && r[1]-r[0] < grain, "size=%d n=%d grain=%d: range %v", size, n, grain, r)
				}
			}
		}
		p.Close()
	}
}

// TestPoolRunShares: RunShares covers [0, n) once in at most one range a
// goroutine, each a multiple of grain but the last, as even as grain
// allows: the ranges are ceil(ceil(n/size)/grain)·grain long.
func TestPoolRunShares(t *testing.T) {
	for _, size := range []int{1, 2, 3, 5} {
		p := NewPool(size)
		for _, n := range []int{0, 1, 5, 17, 64, 100, 1000} {
			for _, grain := range []int{0, 1, 4, 16} {
				got := coveredOnce(t, p.RunShares, n, grain)
				g := max(grain, 1)
				share := ((n+size-1)/size + g - 1) / g * g
				if size == 1 || n <= share {
					continue // one call for the whole range
				}
				slices.SortFunc(got, func(a, b [2]int) int { return a[0] - b[0] })
				require.Len(t, got, (n+share-1)/share, "size=%d n=%d grain=%d: ranges %v", size, n, grain, got)
				require.LessOrEqual(t, len(got), size, "size=%d n=%d grain=%d: ranges %v", size, n, grain, got)
				for _, r := range got {
					require.True(t, r[1]-r[0] == share || r[1] == n && r[1]-r[0] <= share, "size=%d n=%d grain=%d: range %v", size, n, grain, r)
				}
			}
		}
		p.Close()
	}
}

// TestPoolTakesStalledShare: a goroutine stalled inside a range does not
// hold up the rest of its share, under Run and RunEach. The range holding
// the middle item (in the second goroutine's share of three, a share of
// several ranges) waits until every item outside it is done, which
// happens only if the other goroutines take up that share's remaining
// ranges.
func TestPoolTakesStalledShare(t *testing.T) {
	p := NewPool(3)
	defer p.Close()
	const n = 48
	for _, run := range []func(func(a *Args, lo, hi int), Args, int, int){p.Run, p.RunEach} {
		for range 20 {
			var done atomic.Int64
			stalled := false
			run(func(a *Args, lo, hi int) {
				for i := lo; i < hi; i++ {
					if i == n/2 {
						deadline := time.Now().Add(10 * time.Second)
						for done.Load() < int64(n-(hi-lo)) && time.Now().Before(deadline) {
							runtime.Gosched()
						}
						stalled = done.Load() < int64(n-(hi-lo))
					}
				}
				done.Add(int64(hi - lo))
			}, Args{}, n, 1)
			require.False(t, stalled, "the stalled range's share was not taken up")
			require.Equal(t, int64(n), done.Load())
		}
	}
}

func TestSum(t *testing.T) {
	for _, n := range []int{0, 1, 31, 32, 33, 1000} {
		x := make([]float32, n)
		var want float32
		for i := range x {
			x[i] = float32(i % 7)
			want += x[i]
		}
		if got := Sum(x); got != want {
			t.Errorf("Sum n=%d: %g want %g", n, got, want)
		}
	}
}

// TestReadProbe checks that the read probe's four streams cover every
// element once (small integers: the sum is exact in any order).
func TestReadProbe(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	for _, n := range []int{1, 127, 128, 129, 1000, 4096 + 8} {
		x := make([]float32, n)
		var want float32
		for i := range x {
			x[i] = float32(i % 7)
			want += x[i]
		}
		parts := make([]float32, 2)
		sumRange(&Args{Dst: parts, X: x, K: n}, 0, n)
		if parts[0] != want {
			t.Errorf("n=%d: probe sum %g, want %g", n, parts[0], want)
		}
		if bw := p.ReadBandwidth(x, 1); !(bw > 0) {
			t.Errorf("n=%d: bandwidth %v", n, bw)
		}
	}
}

func TestExp(t *testing.T) {
	worst := 0.0
	for x := float32(-87); x <= 88.5; x += 0.000731 {
		want := math.Exp(float64(x))
		got := float64(Exp(x))
		if rel := math.Abs(got-want) / want; rel > worst {
			worst = rel
		}
	}
	if worst > 3e-7 {
		t.Errorf("Exp relative error %g", worst)
	}
	if Exp(-100) != 0 || !math.IsInf(float64(Exp(100)), 1) || Exp(0) != 1 {
		t.Errorf("Exp edge values %g %g %g", Exp(-100), Exp(100), Exp(0))
	}
	if v := Exp(float32(math.NaN())); v == v {
		t.Error("Exp(NaN) is not NaN")
	}
}

func TestDotAxpy(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for _, n := range []int{0, 1, 7, 8, 9, 31, 32, 33, 100, 257} {
		for off := 0; off < 2; off++ {
			x, y := randSlice(r, n+off)[off:], randSlice(r, n+off)[off:]
			var want, mag float64
			for i := range x {
				want += float64(x[i]) * float64(y[i])
				mag += math.Abs(float64(x[i]) * float64(y[i]))
			}
			if got := Dot(x, y); !(math.Abs(float64(got)-want) <= 1e-6*mag+1e-7) {
				t.Errorf("Dot n=%d: %g want %g", n, got, want)
			}
			y2 := append([]float32(nil), y...)
			Axpy(y2, 0.5, x)
			for i := range y2 {
				if w := y[i] + 0.5*x[i]; !(math.Abs(float64(y2[i]-w)) <= 1e-6*math.Abs(float64(w))+1e-7) {
					t.Fatalf("Axpy n=%d [%d]: %g want %g", n, i, y2[i], w)
				}
			}
		}
	}
}

// TestMatMulPositionIndependent checks that equal weight rows give
// bit-equal outputs wherever they sit (tile slot or leftover row).
func TestMatMulPositionIndependent(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	p := NewPool(2)
	defer p.Close()
	for _, k := range []int{5, 16, 32, 37, 128} {
		n := 23
		row := randSlice(r, k)
		w := randSlice(r, n*k)
		for _, j := range []int{0, 5, 10, 19, 21, 22} {
			copy(w[j*k:], row)
		}
		x := randSlice(r, 3*k)
		y := make([]float32, 3*n)
		p.MatMul(y, x, w, 3, n, k)
		for m := 0; m < 3; m++ {
			for _, j := range []int{5, 10, 19, 21, 22} {
				if y[m*n+j] != y[m*n] {
					t.Fatalf("k=%d row %d: %v != %v", k, j, y[m*n+j], y[m*n])
				}
			}
		}
	}
}

func TestRowUpdate(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, n := range []int{1, 7, 8, 9, 128, 131} {
		row, u, o := randSlice(r, n), randSlice(r, n), randSlice(r, n)
		wantRow, wantO := make([]float32, n), make([]float32, n)
		for i := range row {
			wantRow[i] = 0.9*row[i] + 0.3*u[i]
			wantO[i] = o[i] + 0.7*wantRow[i]
		}
		RowUpdate(row, u, o, 0.9, 0.3, 0.7)
		for i := range row {
			if !(math.Abs(float64(row[i]-wantRow[i])) <= 1e-6) || !(math.Abs(float64(o[i]-wantO[i])) <= 1e-6) {
				t.Fatalf("n=%d [%d]: row %g want %g, o %g want %g", n, i, row[i], wantRow[i], o[i], wantO[i])
			}
		}
	}
}

// TestVectorExpMatchesScalar checks that the assembly exponential and
// sigmoid agree bit for bit with the Go functions, specials included.
func TestVectorExpMatchesScalar(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	xs := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 88.5, 88.7, 88.72, 88.73, 89, 200, -87.2, -87.3, -87.31, -100,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 0.5, -0.5, 1e-8, 20, -20}
	for i := 0; i < 5000; i++ {
		xs = append(xs, float32(r.NormFloat64()*30))
	}
	// Every float32 at both ends of the range: the flush to 0 below
	// -87.3, and the powers 2^127 and 2^128 above 87.68.
	for _, span := range [][2]float32{{-87.35, -86.5}, {87.9, 88.75}} {
		for x := span[0]; x <= span[1]; x = math.Nextafter32(x, 100) {
			xs = append(xs, x)
		}
	}
	for len(xs)%16 != 8 { // sixteen-lane blocks, then eight lanes, then a tail
		xs = append(xs, 3)
	}
	xs = append(xs, 1.5, -2.5, 7)
	defer func(v int) { expTileBits = v }(expTileBits)
	for _, bits := range []int{0, 256, 512} {
		if bits == 512 && !hasZMM {
			continue
		}
		expTileBits = bits
		e := append([]float32(nil), xs...)
		ExpSlice(e)
		s := append([]float32(nil), xs...)
		SigmoidSlice(s)
		for i, x := range xs {
			if a, b := e[i], Exp(x); math.Float32bits(a) != math.Float32bits(b) && !(a != a && b != b) {
				t.Fatalf("%d bits: exp(%g): vector %g, scalar %g", bits, x, a, b)
			}
			if a, b := s[i], Sigmoid(x); math.Float32bits(a) != math.Float32bits(b) && !(a != a && b != b) {
				t.Fatalf("%d bits: sigmoid(%g): vector %g, scalar %g", bits, x, a, b)
			}
		}
		// ExpSliceFlush: Exp at and above low, 0 below it (and below
		// Exp's own flush where low is lower still).
		for _, low := range []float32{-40, -20.5, 0, -87.3, -100} {
			f := append([]float32(nil), xs...)
			ExpSliceFlush(f, low)
			for i, x := range xs {
				want := Exp(x)
				if x < low {
					want = 0
				}
				if a := f[i]; math.Float32bits(a) != math.Float32bits(want) && !(a != a && want != want) {
					t.Fatalf("%d bits: ExpSliceFlush(%g) of %g: %g, want %g", bits, low, x, a, want)
				}
			}
		}
	}
}

func TestTriadValues(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	n := 1000
	a, b, c := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range b {
		b[i], c[i] = float32(i), float32(2*i)
	}
	for _, triad := range []func(a, b, c []float32, reps int) float64{p.Triad, p.TriadNT} {
		clear(a)
		if bw := triad(a, b, c, 1); !(bw > 0) {
			t.Errorf("bandwidth %v", bw)
		}
		for i := range a {
			if a[i] != b[i]+3*c[i] {
				t.Fatalf("a[%d] = %v, want %v", i, a[i], b[i]+3*c[i])
			}
		}
	}
}

func TestRowUpdateDot(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for _, n := range []int{1, 8, 9, 16, 24, 128, 131} {
		row, e, k, q := randSlice(r, n), randSlice(r, n), randSlice(r, n), randSlice(r, n)
		want := make([]float32, n)
		var dot float64
		for i := range row {
			want[i] = row[i]*e[i] + 0.3*k[i]
			dot += float64(want[i]) * float64(q[i])
		}
		got := RowUpdateDot(row, e, k, q, 0.3)
		for i := range row {
			if !(math.Abs(float64(row[i]-want[i])) <= 1e-6) {
				t.Fatalf("n=%d row[%d] = %g want %g", n, i, row[i], want[i])
			}
		}
		if !(math.Abs(float64(got)-dot) <= 1e-5*float64(n)) {
			t.Fatalf("n=%d dot %g want %g", n, got, dot)
		}
	}
}

func TestReLUAxpy(t *testing.T) {
	// Lanes must round exactly like the scalar loop (no FMA): the indexer
	// relies on equal keys giving bit-identical scores for its tie rule.
	r := rand.New(rand.NewPCG(41, 42))
	for _, a := range []float32{0.7, -1.3} {
		for _, n := range []int{0, 3, 8, 17, 64, 100} {
			x, y := randSlice(r, n), randSlice(r, n)
			want := append([]float32(nil), y...)
			for i := range want {
				if x[i] > 0 {
					want[i] += float32(a * x[i])
				}
			}
			ReLUAxpy(y, a, x)
			for i := range y {
				if y[i] != want[i] {
					t.Fatalf("a=%g n=%d [%d]: %g want %g (bitwise)", a, n, i, y[i], want[i])
				}
			}
		}
	}
}

// TestMatMulBF16BatchInvariant checks that each output row of a product is
// bit-identical whatever the batch it is computed in: batched decoding
// promises each session the logits it would get alone, and the row-group
// kernels (2x4, 2x8, 4x2, 4x1 tiles, f32 and bf16) must agree to the bit.
func TestMatMulBF16BatchInvariant(t *testing.T) {
	for _, off := range []bool{false, true} {
		tiles43Off = off
		testMatMulBF16BatchInvariant(t)
	}
	tiles43Off = false
}

func testMatMulBF16BatchInvariant(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	p := NewPool(2)
	defer p.Close()
	for _, m := range []int{2, 4, 5, 6, 7, 8, 9, 10, 12, 13, 15, 16, 19, 20, 28, 30, 33, 63} {
		for _, n := range []int{1, 3, 17, 64} {
			for _, k := range []int{8, 24, 136, 1024, 2056} {
				x := randSlice(r, m*k)
				wb := make([]uint16, n*k)
				for i := range wb {
					wb[i] = uint16(math.Float32bits(float32(r.NormFloat64())) >> 16)
				}
				w := make([]float32, n*k)
				WidenBF16(w, wb)
				got, gotF := make([]float32, m*n), make([]float32, m*n)
				p.MatMulBF16(got, x, wb, m, n, k)
				p.MatMul(gotF, x, w, m, n, k)
				one, oneF := make([]float32, n), make([]float32, n)
				for i := 0; i < m; i++ {
					p.MatMulBF16(one, x[i*k:(i+1)*k], wb, 1, n, k)
					p.MatMul(oneF, x[i*k:(i+1)*k], w, 1, n, k)
					for j := range one {
						if got[i*n+j] != one[j] {
							t.Fatalf("bf16 m=%d n=%d k=%d row %d col %d: batched %g, alone %g", m, n, k, i, j, got[i*n+j], one[j])
						}
						if gotF[i*n+j] != oneF[j] {
							t.Fatalf("f32 m=%d n=%d k=%d row %d col %d: batched %g, alone %g", m, n, k, i, j, gotF[i*n+j], oneF[j])
						}
						if one[j] != oneF[j] {
							t.Fatalf("m=%d n=%d k=%d col %d: bf16 weights %g, the same weights widened %g", m, n, k, j, one[j], oneF[j])
						}
					}
				}
			}
		}
	}
}

// requireSameBits requires got to hold want's floats bit for bit.
func requireSameBits(t *testing.T, want, got []float32, msg string, args ...any) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: element %d is %g, want %g", fmt.Sprintf(msg, args...), i, got[i], want[i])
		}
	}
}

// TestMatMulByRows: a product whose weight is too narrow to split over
// the pool by weight rows splits by x rows (byRows), and every output
// keeps the bits of the product on one goroutine, float32 and bf16
// weights (where the packed GEMM does not take the product).
func TestMatMulByRows(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	p := NewPool(2)
	defer p.Close()
	require.True(t, p.byRows(64, 6), "a 64-row product of a 6-row weight splits by x rows")
	require.False(t, p.byRows(63, 6), "fewer x rows than byRowsMin")
	require.False(t, p.byRows(512, 17), "a weight of two ranges of sixteen splits by weight rows")
	for _, m := range []int{64, 71, 130, 512} {
		for _, n := range []int{1, 3, 6, 16} {
			for _, k := range []int{8, 24, 136, 384} {
				if usePacked(m, n, k) {
					continue
				}
				x := randSlice(r, m*k)
				wb, w := randBF16(r, n*k)
				got, want := make([]float32, m*n), make([]float32, m*n)
				p.MatMulBF16(got, x, wb, m, n, k)
				MatMulBF16Serial(want, x, wb, m, n, k)
				requireSameBits(t, want, got, "bf16 m=%d n=%d k=%d", m, n, k)
				p.MatMul(got, x, w, m, n, k)
				MatMulSerial(want, x, w, m, n, k)
				requireSameBits(t, want, got, "f32 m=%d n=%d k=%d", m, n, k)
			}
		}
	}
}

// TestMulScale checks MulScale, Scale and RMSNorm, whose products run
// sixteen lanes at a time where the 512-bit kernels do, against scalar
// loops to the bit at both register widths: lengths across the 32- and
// 16-float rounds and the tails, unaligned starts, a weight or none, in
// place, infinities and signed zeros.
func TestMulScale(t *testing.T) { atTileWidths(t, &expTileBits, testMulScale) }

func testMulScale(t *testing.T) {
	r := rand.New(rand.NewPCG(47, 48))
	same := func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b }
	for _, n := range []int{0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 100, 768} {
		for _, off := range []int{0, 1} {
			x, w := randSlice(r, n+off)[off:], randSlice(r, n+off)[off:]
			if n > 20 {
				x[3], x[4], x[19], w[5] = float32(math.Inf(1)), float32(math.Copysign(0, -1)), float32(math.Inf(-1)), 0
			}
			for _, s := range []float32{0.37, -3, float32(math.Inf(1))} {
				for _, weighted := range []bool{true, false} {
					want := make([]float32, n)
					for i := range want {
						v := x[i]
						if weighted {
							v = float32(x[i] * w[i])
						}
						want[i] = v * s
					}
					var wv []float32
					if weighted {
						wv = w
					}
					got := make([]float32, n)
					MulScale(got, x, wv, s)
					inPlace := slices.Clone(x)
					MulScale(inPlace, inPlace, wv, s)
					for i := range want {
						if !same(got[i], want[i]) || !same(inPlace[i], want[i]) {
							t.Fatalf("%d bits n=%d off=%d s=%g weighted=%v [%d]: %g (in place %g), want %g", expTileBits, n, off, s, weighted, i, got[i], inPlace[i], want[i])
						}
					}
					if !weighted {
						sc := slices.Clone(x)
						Scale(sc, s)
						for i := range want {
							if !same(sc[i], want[i]) {
								t.Fatalf("%d bits n=%d off=%d s=%g: Scale [%d] %g, want %g", expTileBits, n, off, s, i, sc[i], want[i])
							}
						}
					}
				}
			}
		}
	}
	// RMSNorm: rows of 768 and 40, the scale from Dot as RMSNorm takes it.
	for _, d := range []int{768, 40} {
		x, w := randSlice(r, 3*d), randSlice(r, d)
		got := make([]float32, len(x))
		RMSNorm(got, x, w, d, 1e-6)
		for row := range 3 {
			xr := x[row*d : (row+1)*d]
			inv := float32(1 / math.Sqrt(float64(Dot(xr, xr))/float64(d)+float64(float32(1e-6))))
			for i, v := range xr {
				if want := float32(v*w[i]) * inv; !same(got[row*d+i], want) {
					t.Fatalf("%d bits RMSNorm d=%d row %d [%d]: %g, want %g", expTileBits, d, row, i, got[row*d+i], want)
				}
			}
		}
	}
}

func TestMulAdd(t *testing.T) {
	r := rand.New(rand.NewPCG(43, 44))
	for _, n := range []int{0, 1, 7, 8, 15, 16, 17, 63, 65, 100} {
		for _, off := range []int{0, 1} { // unaligned starts too
			a, b, y := randSlice(r, n+off)[off:], randSlice(r, n+off)[off:], randSlice(r, n+off)[off:]
			want := append([]float32(nil), y...)
			for i := range want {
				want[i] += float32(a[i] * b[i])
			}
			MulAdd(y, a, b)
			for i := range y {
				if y[i] != want[i] {
					t.Fatalf("n=%d off=%d [%d]: %g want %g (bitwise)", n, off, i, y[i], want[i])
				}
			}
		}
	}
}

func TestRankUpdate(t *testing.T) {
	r := rand.New(rand.NewPCG(45, 46))
	for _, n := range []int{1, 17, 64, 65, 128, 130} {
		for _, c := range []int{0, 1, 5, 16} {
			ldb := n + 3
			row, e, a, b := randSlice(r, n), randSlice(r, n), randSlice(r, c), randSlice(r, c*ldb)
			want := make([]float64, n)
			for x := range want {
				want[x] = float64(row[x]) * float64(e[x])
				for i := 0; i < c; i++ {
					want[x] += float64(a[i]) * float64(b[i*ldb+x])
				}
			}
			RankUpdate(row, e, a, b, ldb)
			for x := range row {
				if d := math.Abs(float64(row[x]) - want[x]); d > 1e-5*(1+math.Abs(want[x])) {
					t.Fatalf("n=%d c=%d [%d]: %g want %g", n, c, x, row[x], want[x])
				}
			}
		}
	}
}

// TestSiTUAccuracy sweeps SiTU's gate and up inputs (tiny, around the
// series/exponential switch, large, both signs) against float64, with and
// without the up branch's clip, on lengths that leave partial rounds.
func TestSiTUAccuracy(t *testing.T) {
	r := rand.New(rand.NewPCG(47, 48))
	var g, u []float32
	for _, v := range []float32{0, 1e-30, -1e-6, 1e-3, 0.29, 0.3, 0.31, -1.2, 1.19, 1.21, 3, -7, 40, 100, -200, 1e4} {
		for _, w := range []float32{0, -1e-5, 0.5, 7.4, 7.6, -30, 500} {
			g, u = append(g, v), append(u, w)
		}
	}
	for i := 0; i < 1000; i++ {
		g = append(g, float32(r.NormFloat64()*5))
		u = append(u, float32(r.NormFloat64()*30))
	}
	for _, lin := range []float32{25, 0} {
		dst := make([]float32, len(g))
		SiTU(dst, g, u, 4, lin)
		for i := range g {
			gg, uu := float64(g[i]), float64(u[i])
			up := uu
			if lin != 0 {
				up = float64(lin) * math.Tanh(uu/float64(lin))
			}
			want := 4 * math.Tanh(gg/4) / (1 + math.Exp(-gg)) * up
			if d := math.Abs(float64(dst[i]) - want); d > 4e-7*math.Abs(want)+1e-30 {
				t.Fatalf("lin %g: situ(%g, %g) = %g, want %g (rel err %.2g)", lin, g[i], u[i], dst[i], want, d/math.Abs(want))
			}
		}
	}
}

// TestElementwise checks Add, Sub and Mul bitwise against the scalar loops,
// on lengths with partial vectors and with dst aliasing an operand.
func TestElementwise(t *testing.T) {
	r := rand.New(rand.NewPCG(49, 50))
	ops := []struct {
		name string
		f    func(dst, a, b []float32)
		want func(a, b float32) float32
	}{
		{"add", Add, func(a, b float32) float32 { return a + b }},
		{"sub", Sub, func(a, b float32) float32 { return a - b }},
		{"mul", Mul, func(a, b float32) float32 { return a * b }},
	}
	for _, op := range ops {
		for _, n := range []int{0, 1, 7, 8, 31, 32, 33, 100} {
			a, b := randSlice(r, n), randSlice(r, n)
			dst := make([]float32, n)
			op.f(dst, a, b)
			for i := range dst {
				if dst[i] != op.want(a[i], b[i]) {
					t.Fatalf("%s n=%d [%d]: %g", op.name, n, i, dst[i])
				}
			}
			in := append([]float32(nil), a...)
			op.f(in, in, b) // in place
			for i := range in {
				if in[i] != dst[i] {
					t.Fatalf("%s in place n=%d [%d]: %g want %g", op.name, n, i, in[i], dst[i])
				}
			}
		}
	}
}

func TestMix(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	for _, n := range []int{0, 1, 7, 8, 9, 100} {
		x, y := randSlice(r, n), randSlice(r, n)
		out := make([]float32, n)
		a, b, c := float32(0.3), float32(1.7), float32(0.41)
		Mix(out, x, y, a, b, c)
		for i := range out {
			if want := float32(float32(float32(x[i]*a)+float32(y[i]*b)) * c); out[i] != want {
				t.Fatalf("n=%d [%d]: %g want %g (bitwise)", n, i, out[i], want)
			}
		}
	}
}

// TestSoftplusAccuracy sweeps Softplus against float64 and checks that
// SoftplusSlice gives the same bits.
func TestSoftplusAccuracy(t *testing.T) {
	r := rand.New(rand.NewPCG(53, 54))
	xs := []float32{0, 1e-30, -1e-7, 1e-3, -0.5, 0.5, 1, -1, 5, -5, 15, 20, 21, 40, -40, -87, -88, -103, -200, 100, 1e4}
	for i := 0; i < 2000; i++ {
		xs = append(xs, float32(r.NormFloat64()*12))
	}
	got := append([]float32(nil), xs...)
	SoftplusSlice(got)
	for i, x := range xs {
		want := math.Log1p(math.Exp(float64(x)))
		if x > 30 {
			want = float64(x) + math.Exp(-float64(x))
		}
		s := Softplus(x)
		if d := math.Abs(float64(s) - want); d > 3e-7*want+1.2e-38 { // below float32's normal range, exp flushes to 0
			t.Fatalf("softplus(%g) = %g, want %g (rel err %.2g)", x, s, want, d/want)
		}
		if got[i] != s {
			t.Fatalf("SoftplusSlice(%g) = %g, Softplus %g", x, got[i], s)
		}
	}
}

// TestPeakBF16Dot runs the bf16 dot-product probe where the CPU has it.
func TestPeakBF16Dot(t *testing.T) {
	p := NewPool(1)
	defer p.Close()
	f := p.PeakBF16DotFLOPS()
	if hasBF16Dot != (f > 0) {
		t.Fatalf("AVX512_BF16 %v, probe %g FLOP/s", hasBF16Dot, f)
	}
}

// TestKDARows checks the one-call state pass against Dot and RowUpdateDot
// row by row, to the bit, at both register widths.
func TestKDARows(t *testing.T) { atTileWidths(t, &stateTileBits, testKDARows) }

// atTileWidths runs test with the register-width knob at 256 bits, then
// at 512 where the CPU has zmm registers, and restores the knob.
func atTileWidths(t *testing.T, knob *int, test func(*testing.T)) {
	defer func(v int) { *knob = v }(*knob)
	for _, bits := range []int{256, 512} {
		if bits == 512 && !hasZMM {
			continue
		}
		*knob = bits
		test(t)
	}
}

// testKDARows checks KDARows against Dot and RowUpdateDot row by row, to
// the bit, at the current register width.
func testKDARows(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, dk := range []int{1, 8, 16, 24, 32, 40, 64, 96, 128, 136, 256} {
		for _, dv := range []int{1, 3, 64} {
			st, ke, e := randSlice(r, dv*dk), randSlice(r, dk), randSlice(r, dk)
			k, q, v := randSlice(r, dk), randSlice(r, dk), randSlice(r, dv)
			want, wantO, wantU := slices.Clone(st), make([]float32, dv), make([]float32, dv)
			for row := range dv {
				rw := want[row*dk : (row+1)*dk]
				wantU[row] = float32(0.7) * (v[row] - Dot(rw, ke))
				wantO[row] = RowUpdateDot(rw, e, k, q, wantU[row])
			}
			o, u := make([]float32, dv), make([]float32, dv)
			KDARows(st, ke, e, k, q, v, o, u, 0.7)
			if !slices.Equal(u, wantU) {
				t.Fatalf("dk=%d dv=%d: u = %v, want %v", dk, dv, u, wantU)
			}
			for i := range st {
				if st[i] != want[i] {
					t.Fatalf("dk=%d dv=%d: state[%d] = %v, want %v", dk, dv, i, st[i], want[i])
				}
			}
			for i := range o {
				if o[i] != wantO[i] {
					t.Fatalf("dk=%d dv=%d: o[%d] = %v, want %v", dk, dv, i, o[i], wantO[i])
				}
			}
		}
	}
}

// TestMax checks Max against a running max at every length through two
// vector widths and a tail, with the maximum at every position.
func TestMax(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	for n := 1; n <= 70; n++ {
		x := randSlice(r, n)
		for i := range x {
			x[i] -= 3 // all negative, so a zero start would be wrong
		}
		for at := 0; at < n; at++ {
			y := slices.Clone(x)
			y[at] = 1 + float32(at)
			want := y[0]
			for _, v := range y {
				if v > want {
					want = v
				}
			}
			if got := Max(y); got != want {
				t.Fatalf("n=%d max at %d: got %g want %g", n, at, got, want)
			}
		}
	}
}

// TestSiTUVectorMatchesScalar checks SiTU, which runs sixteen lanes at a
// time in one pass (situZMM) or its last step eight at a time after the
// vector exponentials (situAVX2), against the scalar loop, to the bit, at
// both register widths: both branches of tanh (the 0.3 boundary on either
// side), signed zeros, infinities, overflowing exponentials, tails of
// every length, both up-branch modes.
func TestSiTUVectorMatchesScalar(t *testing.T) { atTileWidths(t, &expTileBits, testSiTUVector) }

func testSiTUVector(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	var g, u []float32
	inf := float32(math.Inf(1))
	for _, v := range []float32{0, float32(math.Copysign(0, -1)), 1e-30, -1e-6, 0.29, 1.2, 1.2000001, 1.1999999, -1.2, -1.2000001, 3, -7, 40, 100, -200, 1e4, -1e30, inf, -inf} {
		for _, w := range []float32{0, -1e-5, 7.5, 7.4999995, -7.5000005, -30, 500, 1e20, inf, -inf} {
			g, u = append(g, v), append(u, w)
		}
	}
	for i := 0; i < 2000; i++ {
		g = append(g, float32(r.NormFloat64()*5))
		u = append(u, float32(r.NormFloat64()*30))
	}
	scalar := func(dst, gate, up []float32, beta, linBeta float32) {
		sg, eg, eu := slices.Clone(gate), make([]float32, len(gate)), make([]float32, len(gate))
		for i, v := range gate {
			eg[i] = 2 * abs32(v/beta)
			eu[i] = 2 * abs32(up[i]/linBeta)
		}
		SigmoidSlice(sg)
		ExpSlice(eg)
		if linBeta != 0 {
			ExpSlice(eu)
		}
		for i, v := range gate {
			a := beta * tanhExp(v/beta, eg[i]) * sg[i]
			w := up[i]
			if linBeta != 0 {
				w = linBeta * tanhExp(w/linBeta, eu[i])
			}
			dst[i] = a * w
		}
	}
	for _, lin := range []float32{25, 0} {
		for _, n := range []int{len(g), 1, 7, 8, 9, 15, 16, 17, 24, 31, 32, 63, 64, 65, 130} {
			got, want := make([]float32, n), make([]float32, n)
			SiTU(got, g[:n], u[:n], 4, lin)
			scalar(want, g[:n], u[:n], 4, lin)
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%d bits, lin %g n %d: situ(%g, %g) = %g (%#x), scalar %g (%#x)", expTileBits, lin, n, g[i], u[i], got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
				}
			}
		}
	}
}

// TestSwiGLUMatchesScalar checks SwiGLU bit for bit against the scalar
// g·Sigmoid(g)·u (products rounded left to right) at lengths across the
// vector widths and SwiGLU's 256-element rounds, specials included, and
// written over its gate as the experts' activation does.
func TestSwiGLUMatchesScalar(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	g := []float32{0, float32(math.Copysign(0, -1)), 1e-30, -90, 90, 1e30, -1e30, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
	u := []float32{3, -3, 1e30, 2, 0, 1e10, 5, -1, 1, 7}
	for len(g) < 700 {
		g, u = append(g, float32(r.NormFloat64()*4)), append(u, float32(r.NormFloat64()*30))
	}
	same := func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b }
	for _, n := range []int{0, 1, 7, 8, 15, 16, 17, 64, 255, 256, 257, 600, len(g)} {
		got, inPlace := make([]float32, n), slices.Clone(g[:n])
		SwiGLU(got, g[:n], u[:n])
		SwiGLU(inPlace, inPlace, u[:n])
		for i := range n {
			want := g[i] * Sigmoid(g[i]) * u[i]
			require.Truef(t, same(got[i], want), "n %d: swiglu(%g, %g) = %g, scalar %g", n, g[i], u[i], got[i], want)
			require.Truef(t, same(inPlace[i], want), "n %d in place: swiglu(%g, %g) = %g, scalar %g", n, g[i], u[i], inPlace[i], want)
		}
	}
}

// TestPoolRunAfterClose: a kernel run on a closed pool runs on the caller
// instead of waiting forever for workers that have stopped.
func TestPoolRunAfterClose(t *testing.T) {
	p := NewPool(3)
	p.Close()
	p.Close()
	var covered [100]int
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Run(func(a *Args, lo, hi int) {
			for i := lo; i < hi; i++ {
				covered[i]++
			}
		}, Args{}, len(covered), 1)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run on a closed pool did not return")
	}
	for i, c := range covered {
		if c != 1 {
			t.Fatalf("element %d covered %d times", i, c)
		}
	}
}

// TestReplayRows checks ReplayRows against one RowUpdateDot per record, to
// the bit, at both register widths and lengths through every block size
// (128, 32, 16 and 8 floats) and a tail.
func TestReplayRows(t *testing.T) {
	defer func(v int) { stateTileBits = v }(stateTileBits)
	for _, bits := range []int{0, 256, 512} {
		if bits == 512 && !hasZMM {
			continue
		}
		stateTileBits = bits
		testReplayRows(t)
	}
}

func testReplayRows(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	for _, dk := range []int{1, 7, 8, 13, 16, 24, 32, 40, 48, 64, 100, 128, 136, 152, 200, 256} {
		for _, n := range []int{0, 1, 3, 17} {
			stride := 3*dk + 5
			recs := randSlice(r, max(n, 1)*stride)
			a, k := recs[:], recs[dk+2:]
			const ustride = 3
			u := randSlice(r, max(n, 1)*ustride)
			row := randSlice(r, dk)
			want := slices.Clone(row)
			q := make([]float32, dk)
			for i := range n {
				RowUpdateDot(want, a[i*stride:i*stride+dk], k[i*stride:i*stride+dk], q, u[i*ustride])
			}
			ReplayRows(row, a, k, stride, u, ustride, n)
			if !slices.Equal(row, want) {
				t.Fatalf("%d bits: dk=%d n=%d: %v, want %v", stateTileBits, dk, n, row, want)
			}
		}
	}
}

// TestExpScale holds ExpScale to Exp of the elementwise difference, the
// flush and the products computed one element at a time, to the bit, at
// both exponential widths: rows sharing a or b (stride 0), b nil, d2 nil,
// widths that are and are not whole vectors, and inputs past the flush,
// past Exp's range and NaN.
func TestExpScale(t *testing.T) { atTileWidths(t, &expTileBits, testExpScale) }

func testExpScale(t *testing.T) {
	r := rand.New(rand.NewPCG(43, 44))
	nan := float32(math.NaN())
	same := func(x, y float32) bool {
		return x == y && math.Signbit(float64(x)) == math.Signbit(float64(y)) || x != x && y != y
	}
	for _, n := range []int{16, 128, 17, 100} {
		for _, rows := range []int{1, 3, 16} {
			for _, shape := range []struct{ as, bs int }{{n, 0}, {n, n}, {0, n}, {n, -1}} {
				for _, low := range []float32{-30, float32(math.Inf(-1))} {
					for _, two := range []bool{false, true} {
						a := randSlice(r, max(1, rows*shape.as/n)*n)
						for i := range a {
							a[i] *= 40
						}
						a[0], a[len(a)-1] = nan, 95
						var b []float32
						bs := shape.bs
						if bs >= 0 {
							b = randSlice(r, max(1, rows*bs/n)*n)
							for i := range b {
								b[i] *= 40
							}
						} else {
							bs = 0
						}
						x1, x2 := randSlice(r, rows*n), randSlice(r, rows*n)
						d1, d2 := make([]float32, rows*n), make([]float32, rows*n)
						if !two {
							d2, x2 = nil, nil
						}
						ExpScale(d1, d2, x1, x2, a, shape.as, b, bs, rows, n, low, make([]float32, rows*n))
						for row := range rows {
							for i := range n {
								d := a[row*shape.as+i]
								if b != nil {
									d -= b[row*bs+i]
								}
								var e float32
								if !(d < max(low, expLow)) {
									e = Exp(d)
								}
								p := row*n + i
								if w := x1[p] * e; !same(d1[p], w) {
									t.Fatalf("%d-bit n=%d rows=%d as=%d bs=%d low=%v: d1[%d] = %v, want %v", expTileBits, n, rows, shape.as, shape.bs, low, p, d1[p], w)
								}
								if two {
									if w := x2[p] * e; !same(d2[p], w) {
										t.Fatalf("%d-bit n=%d rows=%d: d2[%d] = %v, want %v", expTileBits, n, rows, p, d2[p], w)
									}
								}
							}
						}
					}
				}
			}
		}
	}
}

// TestSigmoidMul checks SigmoidMul against the scalar Sigmoid and one
// product per element, to the bit, at both register widths, for tails of
// every length, in place (dst = up) and apart, with infinities, NaN and
// gates whose exponentials overflow or flush.
func TestSigmoidMul(t *testing.T) { atTileWidths(t, &expTileBits, testSigmoidMul) }

func testSigmoidMul(t *testing.T) {
	r := rand.New(rand.NewPCG(71, 72))
	inf := float32(math.Inf(1))
	g := []float32{0, float32(math.Copysign(0, -1)), 1e-30, -3, 3, 40, -40, 88, -88, 100, -100, 1e30, -1e30, inf, -inf, float32(math.NaN())}
	u := []float32{1, -1, 2, 1e-3, -7, 5, 5, 0.5, 0.5, -2, 3, 4, 4, 1, 1, 1}
	for range 3000 {
		g = append(g, float32(r.NormFloat64()*8))
		u = append(u, float32(r.NormFloat64()*3))
	}
	for _, n := range []int{len(g), 0, 1, 15, 16, 17, 31, 32, 33, 255, 256, 257, 300, 1000} {
		want := make([]float32, n)
		for i := range n {
			want[i] = Sigmoid(g[i]) * u[i]
		}
		apart := make([]float32, n)
		SigmoidMul(apart, g[:n], u[:n])
		inPlace := slices.Clone(u[:n])
		SigmoidMul(inPlace, g[:n], inPlace)
		for i := range n {
			for _, got := range []float32{apart[i], inPlace[i]} {
				if math.Float32bits(got) != math.Float32bits(want[i]) && !(got != got && want[i] != want[i]) {
					t.Fatalf("%d bits, n %d: sigmoid(%g)·%g = %g, want %g", expTileBits, n, g[i], u[i], got, want[i])
				}
			}
		}
	}
}
