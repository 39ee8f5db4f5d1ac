package kernel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestIndexerBlock checks the indexer's score tile and its Go twin against
// a float64 reference, and that a key's score depends only on the key:
// the same key in every slot of the block gives bitwise the same score.
func TestIndexerBlock(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, hi := range []int{1, 3, 5, 6, 7, 8, 64} {
		for _, di := range []int{1, 7, 64, 128} {
			q, w := randSlice(r, hi*di), randSlice(r, hi)
			keys := randSlice(r, IndexerKeys*di) // [s][d]
			kt := make([]float32, di*IndexerKeys)
			for s := range IndexerKeys {
				for d := range di {
					kt[d*IndexerKeys+s] = keys[s*di+d]
				}
			}
			got, twin := make([]float32, IndexerKeys), make([]float32, IndexerKeys)
			for i := range got {
				got[i], twin[i] = float32(i), -1 // overwritten, not added to
			}
			IndexerBlock(got, kt, q, w, hi, di)
			indexerBlockGo(twin, kt, q, w, hi, di)
			if useAVX2 { // the 256-bit and 512-bit tiles give the same bits
				for _, bits := range []int{256, 512} {
					if bits == 512 && !hasZMM {
						continue
					}
					indexerTileBits = bits
					other := make([]float32, IndexerKeys)
					IndexerBlock(other, kt, q, w, hi, di)
					indexerTileBits = 0
					for s := range IndexerKeys {
						require.Equal(t, math.Float32bits(got[s]), math.Float32bits(other[s]), "%d bits: hi %d di %d key %d", bits, hi, di, s)
					}
				}
			}
			for s := range IndexerKeys {
				want, tol := indexerRef(q, keys[s*di:], w, hi, di)
				require.InDelta(t, want, float64(got[s]), tol, "hi %d di %d key %d", hi, di, s)
				require.InDelta(t, want, float64(twin[s]), tol, "twin: hi %d di %d key %d", hi, di, s)
			}
			// One key in every slot: every slot scores it the same.
			for s := range IndexerKeys {
				for d := range di {
					kt[d*IndexerKeys+s] = keys[5%IndexerKeys*di+d]
				}
			}
			IndexerBlock(got, kt, q, w, hi, di)
			for s := range IndexerKeys {
				require.Equal(t, math.Float32bits(got[0]), math.Float32bits(got[s]), "hi %d di %d slot %d", hi, di, s)
			}
		}
	}
}

// TestIndexerRows checks the row-at-a-time tile, which reads the keys in
// their stored layout, against IndexerBlock over the same keys transposed:
// bit for bit where the tile runs in assembly (on either width of the
// block tile, and heads 32 at a time against 16), within the reference's
// tolerance in Go; and both against a float64 reference. Some keys and
// heads score zero or below, so that the ReLU and negative head weights
// take part, and a NaN in a key reaches its score in assembly (the Go
// twins skip it, as their ReLU does).
func TestIndexerRows(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, hi := range []int{8, 16, 32, 48, 64, 96} {
		for _, di := range []int{1, 7, 64, 128} {
			stride := di + 5
			q, w := randSlice(r, hi*di), randSlice(r, hi)
			keys := randSlice(r, (IndexerRowKeys-1)*stride+di)
			for d := range di {
				keys[3*stride+d] = 0 // a key that scores zero for every head
			}
			q[0] = float32(math.Copysign(0, -1))
			keys[5*stride] = float32(math.NaN()) // propagates as the block tile's ReLU lets it
			qt := make([]float32, hi*di)
			TransposeQuery(qt, q, hi, di)
			kt := make([]float32, di*IndexerKeys)
			for s := range IndexerRowKeys {
				for d := range di {
					kt[d*IndexerKeys+s] = keys[s*stride+d]
				}
			}
			got := make([]float32, IndexerRowKeys)
			for i := range got {
				got[i] = float32(i) // overwritten, not added to
			}
			IndexerRows(got, keys, stride, qt, w, hi, di, nil)
			if IndexerRowsFast(hi) && hi%32 == 0 {
				// Heads 32 at a time against 16 at a time: the same bits.
				indexerPairs = false
				sixteens := make([]float32, IndexerRowKeys)
				IndexerRows(sixteens, keys, stride, qt, w, hi, di, nil)
				indexerPairs = true
				for s := range IndexerRowKeys {
					require.Equal(t, math.Float32bits(sixteens[s]), math.Float32bits(got[s]), "heads by 16 and by 32: hi %d di %d key %d", hi, di, s)
				}
			}
			for _, bits := range []int{256, 512} {
				if !IndexerRowsFast(hi) || bits == 512 && !hasZMM || bits == 256 && !useAVX2 {
					continue
				}
				indexerTileBits = bits
				block := make([]float32, IndexerKeys)
				IndexerBlock(block, kt, q, w, hi, di)
				indexerTileBits = 0
				for s := range IndexerRowKeys {
					require.Equal(t, math.Float32bits(block[s]), math.Float32bits(got[s]), "%d-bit block: hi %d di %d key %d", bits, hi, di, s)
				}
			}
			twin := make([]float32, IndexerRowKeys)
			indexerRowsGo(twin, keys, stride, qt, w, hi, di)
			if IndexerRowsFast(hi) {
				require.True(t, math.IsNaN(float64(got[5])), "hi %d di %d: the NaN key scores %v", hi, di, got[5])
			}
			for s := range IndexerRowKeys {
				if s == 5 {
					continue
				}
				want, tol := indexerRef(q, keys[s*stride:], w, hi, di)
				require.InDelta(t, want, float64(got[s]), tol, "hi %d di %d key %d", hi, di, s)
				require.InDelta(t, want, float64(twin[s]), tol, "twin: hi %d di %d key %d", hi, di, s)
			}
			require.Zero(t, got[3], "hi %d di %d: the zero key", hi, di)
		}
	}
}

// indexerRef is one key's score in float64 (q [hi][di], the key's di
// values first in key) and the float32 tiles' tolerance for it.
func indexerRef(q, key, w []float32, hi, di int) (want, tol float64) {
	var scale float64
	for h := range hi {
		var dot float64
		for d := range di {
			dot += float64(q[h*di+d]) * float64(key[d])
		}
		want += float64(w[h]) * math.Max(dot, 0)
		scale += math.Abs(float64(w[h])) * math.Sqrt(float64(di))
	}
	return want, 1e-5 * scale
}

// TestTransposeKeys8 checks the transposition into an indexer block on
// every width, with a row stride past the width.
func TestTransposeKeys8(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, di := range []int{1, 7, 8, 64, 128} {
		stride := di + 3
		src := randSlice(r, 7*stride+di)
		kt := randSlice(r, di*IndexerKeys)
		before := append([]float32(nil), kt...)
		TransposeKeys8(kt[16:], src, stride, di) // keys 16..23 of the block
		for d := range di {
			for s := range IndexerKeys {
				want := before[d*IndexerKeys+s]
				if s >= 16 && s < 24 {
					want = src[(s-16)*stride+d]
				}
				require.Equal(t, want, kt[d*IndexerKeys+s], "di %d dim %d key %d", di, d, s)
			}
		}
	}
}

// TestTopKRadix checks the radix selection against the heap on inputs
// with ties, signed zeros, infinities and NaNs, and that it allocates
// nothing.
func TestTopKRadix(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	nan := float32(math.NaN())
	for trial := range 200 {
		n := 1 + r.IntN(6000)
		x := make([]float32, n)
		for i := range x {
			switch r.IntN(8) {
			case 0:
				x[i] = float32(math.Copysign(0, -1))
			case 1:
				x[i] = float32(r.IntN(4)) // many exact ties
			case 2:
				if trial%3 == 0 {
					x[i] = nan
				} else {
					x[i] = float32(math.Inf(2*r.IntN(2) - 1))
				}
			case 3:
				x[i] = float32(r.NormFloat64()) * 1e-30
			default:
				x[i] = float32(r.NormFloat64())
			}
		}
		k := topKHeapMax + 1 + r.IntN(5000)
		got, want := make([]int32, k), make([]int32, k)
		m := TopK(got, nil, x, k)
		topKHeap(want[:m], x)
		require.Equal(t, min(k, n), m)
		require.Equal(t, want[:m], got[:m], "trial %d: n %d k %d", trial, n, k)
	}
	// Scores in narrow ranges, whose keys share their high bits (radix
	// passes with one bin, the k-th key inside a run of bins) or sit in
	// few bins, some negative, with ties.
	for trial := range 300 {
		n := topKHeapMax + 1 + r.IntN(3000)
		center := float32(r.NormFloat64() * 10)
		width := float32(math.Pow(10, -1-4*r.Float64()))
		x := make([]float32, n)
		for i := range x {
			x[i] = center + width*float32(r.NormFloat64())
			if r.IntN(10) == 0 {
				x[i] = center
			}
		}
		k := topKHeapMax + 1 + r.IntN(n-topKHeapMax)
		got, want := make([]int32, k), make([]int32, k)
		m := TopK(got, nil, x, k)
		topKHeap(want[:m], x)
		require.Equal(t, want[:m], got[:m], "narrow trial %d: n %d k %d center %v width %v", trial, n, k, center, width)
	}
	x := make([]float32, 2048)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	idx := make([]int32, 256)
	if a := testing.AllocsPerRun(10, func() { TopK(idx, nil, x, 256) }); a != 0 && !raceEnabled {
		t.Fatalf("TopK allocates %v times", a)
	}
	// A decode's scores grow by one a step: its scratch grows with room.
	// (Longer than any row before, whose scratch the pool keeps;
	// AllocsPerRun's first call warms up and the measured one goes on.)
	long := make([]float32, 8192)
	for i := range long {
		long[i] = float32(r.NormFloat64())
	}
	from := 7001
	grow := func() {
		for n := from; n < from+200; n++ {
			TopK(idx, nil, long[:n], 256)
		}
		from += 200
	}
	if a := testing.AllocsPerRun(1, grow); a > 4 && !raceEnabled {
		t.Fatalf("TopK over 200 growing rows allocates %v times", a)
	}
}

// BenchmarkTopK times the Lightning Indexer's selection: the k best of n
// scores, ranked, at a prefill chunk's context lengths and a long
// decode's. Each call takes the next of 64 rows of scores (about 4 MB
// at most): repeating one row lets the branch predictor learn its
// comparisons, which a model's rows never allow (a comparison sort of
// 256 keys ran three times as fast so).
func BenchmarkTopK(b *testing.B) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, n := range []int{300, 512, 2048, 8192, 32768} {
		for _, k := range []int{256, 2048} {
			if k >= n {
				continue
			}
			b.Run(fmt.Sprintf("n%d/k%d", n, k), func(b *testing.B) {
				// Scores as the indexer's: weighted sums of ReLUs, so
				// mostly positive with many near zero.
				const rows = 64
				x := make([]float32, rows*n)
				for i := range x {
					x[i] = float32(math.Max(r.NormFloat64(), 0)*2 + r.NormFloat64()*0.1)
				}
				idx := make([]int32, k)
				b.ResetTimer()
				for i := range b.N {
					TopK(idx, nil, x[i%rows*n:(i%rows+1)*n], k)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/score")
			})
		}
	}
}
