package k3

import (
	"context"
	"math"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/internal/kernel"
	"k3/internal/tiny"
)

// TestFastBF16Backend: the opt-in fast backend ("go-fastbf16": bf16-weight
// products with x rounded to bfloat16) gives the trained model's logits
// over a 300-token held-out prefill within 2% of the logit scale of the
// exact backend's, and differs from them where the fast path runs (the
// bf16 dot product pays, or AMX tiles). Decode: where the bf16 dot product
// pays on a CPU without AMX the fast backend lays its weights' k pairs
// side by side and its decode products round x as well (within 2% of the
// scale, and a session's logits the same bits decoding in a batch as
// alone); elsewhere decode keeps x in float32: bitwise the exact
// backend's where both keep the stored weight layout, and within float32
// summation error of it where the exact backend lays its weights out
// k-major and the fast one keeps them as stored.
func TestFastBF16Backend(t *testing.T) {
	ctx := context.Background()
	text, err := os.ReadFile("../testdata/trained/heldout/cmd__compile__internal__test__divconst_test.go")
	require.NoError(t, err)
	exact, err := LoadTiny(ctx)
	require.NoError(t, err)
	defer exact.Close()
	fast, err := LoadTiny(ctx, WithBackend("go-fastbf16"))
	require.NoError(t, err)
	defer fast.Close()
	prompt := exact.Encode(string(text))[:300]
	maxd, scale := prefillDiff(t, exact, fast, prompt)
	t.Logf("prefill logits: max |fast - exact| %.3g, %.2g of the logit scale %.3g", maxd, maxd/scale, scale)
	assert.Less(t, maxd, 0.02*scale)
	if kernel.FastBF16Pays() || kernel.AMXAvailable() {
		assert.Positive(t, maxd, "the fast path did not run")
	} else {
		assert.Zero(t, maxd, "where the bf16 dot product does not pay, the fast backend is the exact one")
	}
	// Decode: one row at a time, exact on both.
	a, _ := exact.NewSession()
	defer a.Close()
	b, _ := fast.NewSession()
	defer b.Close()
	for _, id := range prompt[:8] {
		_, err := a.Forward(ctx, []int32{id})
		require.NoError(t, err)
		_, err = b.Forward(ctx, []int32{id})
		require.NoError(t, err)
	}
	var dd float64
	for i, v := range a.Logits() {
		dd = math.Max(dd, math.Abs(float64(b.Logits()[i]-v)))
	}
	t.Logf("decode logits: max |fast - exact| %.3g", dd)
	switch {
	case kernel.FastBF16Pays() && !kernel.AMXAvailable():
		assert.Less(t, dd, 0.02*scale)
		assert.Positive(t, dd, "the fast decode did not run")
		fastBatchEqualsAlone(t, fast, prompt[:40])
	case !kernel.KMajorFast():
		assert.Equal(t, a.Logits(), b.Logits())
	default:
		assert.Less(t, dd, 2e-6*scale)
	}
}

// fastBatchEqualsAlone decodes two sessions of m in a batch and alone and
// requires the same logits, bit for bit.
func fastBatchEqualsAlone(t *testing.T, m *Model, prompt []int32) {
	ctx := context.Background()
	var batched, solo []*Session
	for i, n := range []int{len(prompt), len(prompt) / 2} {
		s, err := m.NewSession()
		require.NoError(t, err)
		defer s.Close()
		_, err = s.Forward(ctx, prompt[:n])
		require.NoError(t, err, "session %d", i)
		c, err := s.Clone()
		require.NoError(t, err)
		defer c.Close()
		batched, solo = append(batched, s), append(solo, c)
	}
	bt, err := m.NewBatch(2)
	require.NoError(t, err)
	for step := range 4 {
		toks := []int32{prompt[step], prompt[step+1]}
		require.NoError(t, bt.Step(ctx, batched, toks))
		for i, s := range solo {
			want, err := s.Forward(ctx, toks[i:i+1])
			require.NoError(t, err)
			require.Equal(t, want, batched[i].Logits(), "step %d session %d: batched and alone", step, i)
		}
	}
}

// TestFastBF16Indexer: with FusedAttention the fast backend scores the
// Lightning Indexer in bf16 where its products take the bf16 dot product
// and the index heads fill the bf16 rows tile. On a K3.1 Pro-shaped
// checkpoint with 16 index heads of 32 keeping 16 keys, a 120-token
// prefill's logits differ from the fast backend's without the option (the
// path ran; how much is not a measure of accuracy: one moved pick moves a
// random model's logits arbitrarily, so TestBF16IndexerAccuracy measures
// it on the indexer goldens), and decoding in a batch still gives a
// session the same bits as alone, past
// the 16 keys where picks depend on the scores. Where the bf16 dot
// product does not pay, the option changes nothing; nor does it on the
// trained model, whose 4 index heads are too few for the rows tile.
func TestFastBF16Indexer(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	edit := func(text map[string]any) {
		text["index_n_heads"], text["index_head_dim"], text["index_topk"] = 16, 32, 16
	}
	require.NoError(t, tiny.Write(dir, "k31pro", tiny.Options{Seed: 5, BF16: true, Edit: edit}))
	fast, err := Load(ctx, dir, WithBackend("go-fastbf16"))
	require.NoError(t, err)
	defer fast.Close()
	fused, err := Load(ctx, dir, WithBackend("go-fastbf16"), WithBackendOptions(BackendOptions{FusedAttention: true}))
	require.NoError(t, err)
	defer fused.Close()
	prompt := make([]int32, 120)
	for i := range prompt {
		prompt[i] = int32(3 + (i*37)%200)
	}
	maxd, scale := prefillDiff(t, fast, fused, prompt)
	t.Logf("prefill logits: max |bf16 indexer - float32 indexer| %.3g, %.2g of the logit scale %.3g", maxd, maxd/scale, scale)
	if !kernel.FastBF16Pays() {
		assert.Zero(t, maxd, "where the bf16 dot product does not pay, the option changes nothing")
		return
	}
	assert.Positive(t, maxd, "the bf16 indexer did not run")
	fastBatchEqualsAlone(t, fused, prompt[:60])
}

// prefillDiff prefills prompt on a and on b and returns the largest
// difference of b's logits from a's and a's largest magnitude.
func prefillDiff(t *testing.T, a, b *Model, prompt []int32) (maxd, scale float64) {
	run := func(m *Model) []float32 {
		s, err := m.NewSession()
		require.NoError(t, err)
		defer s.Close()
		out, err := s.Forward(context.Background(), prompt)
		require.NoError(t, err)
		return out
	}
	want, got := run(a), run(b)
	require.Len(t, got, len(want))
	for i := range want {
		maxd = math.Max(maxd, math.Abs(float64(got[i]-want[i])))
		scale = math.Max(scale, math.Abs(float64(want[i])))
	}
	return maxd, scale
}
