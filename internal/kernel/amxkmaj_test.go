package kernel

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// kmajAMXShapes: n not a multiple of 16, 32, 48 or 96 and k odd or short
// of a k-block, beside the model's.
var kmajAMXShapes = [][3]int{
	{64, 96, 64}, {70, 100, 40}, {65, 48, 33}, {64, 400, 200}, {130, 97, 129},
	{64, 768, 768}, {3, 200, 96}, {12, 150, 31}, {66, 1000, 64}, {64, 1700, 40}, // two and three slabs
	{16, 512, 384}, // an expert's few rows
}

// TestRepackKMajorAMX: a k-major panel pair repacked (by the vector kernel
// where it runs, and by the plain-Go loop) is PackAMX's form of the same
// columns, zero past n and k.
func TestRepackKMajorAMX(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, sh := range kmajAMXShapes {
		n, k := sh[1], sh[2]
		t.Run(fmt.Sprintf("%dx%d", n, k), func(t *testing.T) {
			w, _ := randBF16(r, n*k)
			wk := make([]uint16, KMajorLen(n, k))
			PackKMajor(wk, w, n, k)
			want := make([]uint16, AMXLen(n, k))
			PackAMX(want, w, n, k)
			kp := amxKPad(k)
			buf := make([]uint16, amxRepackCols*kp)
			for _, vec := range []bool{true, false} {
				saved := hasAVX512BW
				hasAVX512BW = vec && saved
				for c0 := 0; c0 < n; c0 += amxRepackCols {
					for i := range buf {
						buf[i] = 0xdead
					}
					panels := min(amxRepackCols, amxCols(n)-c0) / AMXPanel
					repackKMajorAMX(buf, wk, n, k, c0/KMajorPanel, panels)
					got := buf[:panels*AMXPanel*kp]
					require.Equal(t, want[c0*kp:c0*kp+len(got)], got, "columns %d on, vector kernel %v", c0, vec && saved)
				}
				hasAVX512BW = saved
			}
		})
	}
}

// TestMatMulKMajorAMX: the product over k-major weights gives MatMulAMX's
// bits over the AMX form of the same weights, tiles and plain-Go twin
// alike, without writing past dst; with x rounded to bf16, MatMulAMXFast's.
func TestMatMulKMajorAMX(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	p := NewPool(2)
	defer p.Close()
	for _, sh := range kmajAMXShapes {
		m, n, k := sh[0], sh[1], sh[2]
		t.Run(fmt.Sprintf("%dx%dx%d", m, n, k), func(t *testing.T) {
			if raceEnabled && m*n*k > 5_000_000 {
				// The slab shapes split the pool's work as the large ones
				// do; on a CPU without AMX these run the plain-Go tiles,
				// 44 s under the race detector with them.
				t.Skip("large product under the race detector")
			}
			x, w := amxOperands(r, m, n, k, 1)
			wp := make([]uint16, AMXLen(n, k))
			PackAMX(wp, w, n, k)
			want := make([]float32, m*n)
			p.MatMulAMX(want, x, wp, m, n, k)
			wk := make([]uint16, KMajorLen(n, k))
			PackKMajor(wk, w, n, k)
			got := make([]float32, m*n+2)
			got[m*n], got[m*n+1] = 7, 7
			p.MatMulKMajorAMX(got[:m*n], x, wk, m, n, k)
			require.Equal(t, want, got[:m*n])
			require.Equal(t, []float32{7, 7}, got[m*n:], "wrote past dst")
			amxGo = true
			twin := make([]float32, m*n)
			p.MatMulKMajorAMX(twin, x, wk, m, n, k)
			amxGo = false
			require.Equal(t, want, twin, "plain-Go twin")

			clear(got[:m*n])
			MatMulKMajorAMXSerial(got[:m*n], x, wk, m, n, k)
			require.Equal(t, want, got[:m*n], "serial")
			require.Equal(t, []float32{7, 7}, got[m*n:], "serial wrote past dst")
			amxGo = true
			clear(twin)
			MatMulKMajorAMXSerial(twin, x, wk, m, n, k)
			amxGo = false
			require.Equal(t, want, twin, "serial plain-Go twin")

			p.MatMulAMXFast(want, x, wp, m, n, k)
			p.MatMulKMajorAMXFast(got[:m*n], x, wk, m, n, k)
			require.Equal(t, want, got[:m*n], "x rounded to bf16")
		})
	}
}

// BenchmarkKMajorAMX times the 100M preset's prefill shapes, warm, with the
// weights k-major (MatMulKMajor), in the tiles' layout (MatMulAMX) and
// k-major on the tiles (MatMulKMajorAMX, the default prefill product where
// the tiles run).
func BenchmarkKMajorAMX(b *testing.B) {
	if !hasAMX || amxEmulated {
		b.Skip("the AMX tiles do not run here")
	}
	for _, sh := range [][3]int{{256, 2304, 768}, {256, 768, 768}, {256, 384, 768}, {256, 768, 384}, {128, 768, 768}, {64, 768, 768}, {40, 768, 768}} {
		m, n, k := sh[0], sh[1], sh[2]
		r := rand.New(rand.NewPCG(25, 26))
		x, w := amxOperands(r, m, n, k, 1)
		wk := make([]uint16, KMajorLen(n, k))
		PackKMajor(wk, w, n, k)
		wa := make([]uint16, AMXLen(n, k))
		PackAMX(wa, w, n, k)
		y := make([]float32, m*n)
		for _, layout := range []string{"kmajor", "amx", "kmajor-on-amx"} {
			b.Run(fmt.Sprintf("%s/%dx%dx%d", layout, m, n, k), func(b *testing.B) {
				p := NewPool(0)
				defer p.Close()
				b.ResetTimer()
				for range b.N {
					switch layout {
					case "kmajor":
						p.MatMulKMajor(y, x, wk, m, n, k)
					case "amx":
						p.MatMulAMX(y, x, wa, m, n, k)
					default:
						p.MatMulKMajorAMX(y, x, wk, m, n, k)
					}
				}
				b.ReportMetric(2*float64(m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
