package k3

import (
	"context"
	"math"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/internal/kernel"
)

// TestFastBF16Backend: the opt-in fast backend ("go-fastbf16": prefill's
// bf16-weight products with x rounded to bfloat16) gives the trained
// model's logits over a 300-token held-out prefill within 2% of the logit
// scale of the exact backend's, and differs from them where the fast path
// runs (the bf16 dot product pays, or AMX tiles); decode steps, whose
// products have fewer rows, keep x in float32: bitwise the exact backend's
// where both keep the stored weight layout, and within float32 summation
// error of it where the exact backend lays its weights out k-major (a
// different order of the same sums; x rounded to bf16 would be ~100 times
// further off).
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
	run := func(m *Model) []float32 {
		s, err := m.NewSession()
		require.NoError(t, err)
		defer s.Close()
		out, err := s.Forward(ctx, prompt)
		require.NoError(t, err)
		return out
	}
	want, got := run(exact), run(fast)
	require.Len(t, got, len(want))
	var maxd, scale float64
	for i := range want {
		maxd = math.Max(maxd, math.Abs(float64(got[i]-want[i])))
		scale = math.Max(scale, math.Abs(float64(want[i])))
	}
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
	if !kernel.KMajorFast() {
		assert.Equal(t, a.Logits(), b.Logits())
		return
	}
	var dd float64
	for i, v := range a.Logits() {
		dd = math.Max(dd, math.Abs(float64(b.Logits()[i]-v)))
	}
	t.Logf("decode logits: max |fast - exact| %.3g", dd)
	assert.Less(t, dd, 2e-6*scale)
}
