package k3_test

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/ascend"
	"k3/internal/tiny"
	"k3/k3"
)

// With FusedAttention the host driver's aclnnLightningIndexer and
// aclnnSparseFlashAttention serve the DSA layers of a model whose indexer
// has the operator's head size (128), in the eager passes over the page
// slabs and in captured decode steps, through a truncation; the logits
// stay near the float32 compositions' (bf16 caches move them by parts in
// a thousand of their scale; a wrong operator moves them by the scale).
// That a replayed fused step is the eager one bitwise is
// ascend.TestFusedAttention's.
func TestAscendFusedAttention(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, tiny.Write(dir, "k31pro", tiny.Options{Seed: 21, BF16: true, Edit: func(text map[string]any) {
		text["index_head_dim"] = 128
	}}))
	ctx := context.Background()
	toks := []int32{9, 7, 11, 6, 13, 8, 10, 12, 5}
	run := func(fused bool) ([][]float32, [3]int64, k3.GraphStats) {
		b, err := ascend.OpenHost(ascend.Options{ArenaBytes: 256 << 20, FusedAttention: fused})
		require.NoError(t, err)
		defer b.Close()
		m, err := k3.Load(ctx, dir, k3.WithComputeBackend(b), k3.WithRollback(8))
		require.NoError(t, err)
		defer m.Close()
		out := decodeTruncated(t, m, toks, 4)
		ix, at, mirrors := b.FusedCalls()
		return out, [3]int64{ix, at, mirrors}, m.GraphStats()
	}
	plain, calls, _ := run(false)
	require.Zero(t, calls)
	fused, calls, gs := run(true)
	t.Logf("fused calls (indexer, attention, mirrors): %v; %+v", calls, gs)
	require.Positive(t, calls[0])
	require.Positive(t, calls[1])
	require.Positive(t, gs.StepsReplayed)
	require.Len(t, fused, len(plain))
	var worst float64
	for i := range plain {
		var scale, diff float64
		for j, v := range plain[i] {
			scale = max(scale, math.Abs(float64(v)))
			diff = max(diff, math.Abs(float64(fused[i][j]-v)))
		}
		worst = max(worst, diff/scale)
	}
	t.Logf("largest logit difference from float32: %.2g of the logit scale", worst)
	require.Less(t, worst, 0.02)
}
