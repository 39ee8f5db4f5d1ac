package kernel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRoundBF16DAZ holds the conversion (VCVTNEPS2BF16 where the CPU has
// it) to roundBF16DAZ's rules bit for bit: ties to even, values below the
// normal range to a zero of their sign, NaN quieted, infinities kept.
func TestRoundBF16DAZ(t *testing.T) {
	special := []uint32{
		0, 0x80000000, 1, 0x80000001, 0x007fffff, 0x807fffff, 0x00800000, // zeros, denormals, the least normal
		0x3f808000, 0x3f818000, 0x3f808001, 0x3f80ffff, 0x3f817fff, // ties to even both ways, just past
		0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000, // the largest, rounding to infinity; infinities
		0x7fc00000, 0x7f800001, 0xffa00000, 0x7fbfffff, // NaNs, signalling ones quieted
	}
	r := rand.New(rand.NewPCG(7, 8))
	src := make([]float32, 0, 16*9+5)
	for len(src) < cap(src) {
		if i := len(src); i < len(special) {
			src = append(src, math.Float32frombits(special[i]))
			continue
		}
		src = append(src, math.Float32frombits(r.Uint32()))
	}
	got := make([]uint16, len(src))
	RoundBF16DAZ(got, src)
	for i, v := range src {
		want := roundBF16DAZ(v)
		require.Equal(t, want, got[i], "element %d (%#08x)", i, math.Float32bits(v))
	}
	require.Equal(t, uint16(0x3f80), roundBF16DAZ(math.Float32frombits(0x3f808000)), "a tie to the even below")
	require.Equal(t, uint16(0x3f82), roundBF16DAZ(math.Float32frombits(0x3f818000)), "a tie to the even above")
	require.Equal(t, uint16(0x8000), roundBF16DAZ(math.Float32frombits(0x807fffff)), "a denormal to a signed zero")
	require.Equal(t, uint16(0x7f80), roundBF16DAZ(math.Float32frombits(0x7f7fffff)), "the largest to infinity")
	require.Equal(t, uint16(0x7fc0), roundBF16DAZ(math.Float32frombits(0x7f800001)), "a signalling NaN quieted")
}

// indexerRefBF16 is a key's score over the rounded operands in float64,
// and a tolerance for float32 accumulation: 1e-6 of the terms' magnitude.
func indexerRefBF16(q, key, w []float32, hi, di int) (want, tol float64) {
	rb := func(v float32) float64 { return float64(bf16(roundBF16DAZ(v))) }
	var scale float64
	for h := range hi {
		var dot, mag float64
		for d := range di {
			dot += rb(q[h*di+d]) * rb(key[d])
			mag += math.Abs(rb(q[h*di+d]) * rb(key[d]))
		}
		want += float64(w[h]) * math.Max(dot, 0)
		scale += math.Abs(float64(w[h])) * mag
	}
	return want, 1e-6*scale + 1e-30
}

// TestIndexerBF16 checks the bf16 tiles: each against its Go twin bit for
// bit, the rows tile against the block tile bit for bit (a row may be
// scored either way) and with heads 32 at a time against 16, both against
// the float64 scores of the rounded operands, a key's score independent of
// its slot, and both within bf16's rounding of the exact scores.
func TestIndexerBF16(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, hi := range []int{1, 3, 5, 16, 32, 64, 96} {
		for _, di := range []int{2, 6, 16, 64, 128} {
			stride := di + 3
			q, w := randSlice(r, hi*di), randSlice(r, hi)
			keys := randSlice(r, IndexerKeys*stride)
			ahead := randSlice(r, IndexerRowKeys*stride)
			qp, qb := make([]uint32, hi*di/2), make([]uint16, hi*di)
			TransposeQueryBF16(qp, q, hi, di)
			RoundBF16DAZ(qb, q)
			kt, kb := make([]uint32, di/2*IndexerKeys), make([]uint16, IndexerRowKeys*di)
			for s := range IndexerKeys {
				KeyPairsBF16(kt, s, keys[s*stride:s*stride+di], kb)
			}
			block, blockTwin := make([]float32, IndexerKeys), make([]float32, IndexerKeys)
			for i := range block {
				block[i] = float32(i) // overwritten, not added to
			}
			IndexerBlockBF16(block, kt, qb, w, hi, di)
			indexerBlockBF16Go(blockTwin, kt, qb, w, hi, di)
			rows, rowsTwin := make([]float32, IndexerKeys), make([]float32, IndexerKeys)
			sixteens := make([]float32, IndexerKeys)
			for s := 0; s < IndexerKeys; s += IndexerRowKeys {
				IndexerRowsBF16(rows[s:], keys[s*stride:], stride, qp, w, hi, di, ahead, kb)
				indexerRowsBF16Go(rowsTwin[s:], keys[s*stride:], stride, qp, w, hi, di, kb)
				indexerPairs = false // heads 16 at a time where they are a multiple of 32
				IndexerRowsBF16(sixteens[s:], keys[s*stride:], stride, qp, w, hi, di, ahead, kb)
				indexerPairs = true
			}
			for s := range IndexerKeys {
				key := keys[s*stride : s*stride+di]
				at := func(what string) string { return fmt.Sprintf("%s: hi %d di %d key %d", what, hi, di, s) }
				require.Equal(t, math.Float32bits(blockTwin[s]), math.Float32bits(block[s]), at("block tile against its twin"))
				require.Equal(t, math.Float32bits(rowsTwin[s]), math.Float32bits(rows[s]), at("rows tile against its twin"))
				require.Equal(t, math.Float32bits(block[s]), math.Float32bits(rows[s]), at("rows against block"))
				require.Equal(t, math.Float32bits(sixteens[s]), math.Float32bits(rows[s]), at("rows by 32 heads against by 16"))
				want, tol := indexerRefBF16(q, key, w, hi, di)
				require.InDelta(t, want, float64(block[s]), tol, at("against the rounded operands"))
				exact, _ := indexerRef(q, key, w, hi, di)
				var scale float64
				for h := range hi {
					scale += math.Abs(float64(w[h])) * math.Sqrt(float64(di))
				}
				require.InDelta(t, exact, float64(block[s]), 0.02*scale, at("against the exact scores"))
			}
			// One key in every slot of the block: every slot scores it the same.
			for s := range IndexerKeys {
				KeyPairsBF16(kt, s, keys[5*stride:5*stride+di], kb)
			}
			IndexerBlockBF16(block, kt, qb, w, hi, di)
			for s := range IndexerKeys {
				require.Equal(t, math.Float32bits(block[0]), math.Float32bits(block[s]), "hi %d di %d slot %d", hi, di, s)
			}
			// Zero columns (a block's padding) score zero.
			clear(kt)
			IndexerBlockBF16(block, kt, qb, w, hi, di)
			require.Equal(t, make([]float32, IndexerKeys), block, "hi %d di %d: zero keys", hi, di)
		}
	}
}

// BenchmarkIndexerBF16 scores a decode row's keys as stored on one core,
// the exact tile (IndexerRows) and the bf16 one (IndexerRowsBF16, keys
// rounded as scored) alternating, at K3.1 Pro's indexer shape (64 heads
// of 128) over 65,536 keys (32 MB, past the L2; both read the same float32
// keys) and over 2,048 (cached). GFLOP/s counts the head products.
func BenchmarkIndexerBF16(b *testing.B) {
	const hi, di = 64, 128
	for _, keys := range []int{2048, 65536} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			k, q, w := randSlice(r, keys*di), randSlice(r, hi*di), randSlice(r, hi)
			qt, qp := make([]float32, hi*di), make([]uint32, hi*di/2)
			TransposeQuery(qt, q, hi, di)
			TransposeQueryBF16(qp, q, hi, di)
			kb, t := make([]uint16, IndexerRowKeys*di), make([]float32, keys)
			med := alternateMedians(b, 2, func(mode int) {
				for s := 0; s < keys; s += IndexerRowKeys {
					ahead := k[min(s+IndexerRowKeys, keys-IndexerRowKeys)*di:]
					if mode == 0 {
						IndexerRows(t[s:], k[s*di:], di, qt, w, hi, di, ahead)
					} else {
						IndexerRowsBF16(t[s:], k[s*di:], di, qp, w, hi, di, ahead, kb)
					}
				}
			})
			flop := 2 * float64(keys*hi*di)
			b.ReportMetric(flop/med[0], "exact_GFLOP/s")
			b.ReportMetric(flop/med[1], "bf16_GFLOP/s")
			b.ReportMetric(med[0]/med[1], "speedup")
		})
	}
}
