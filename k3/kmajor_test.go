package k3

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
	"k3/internal/kernel"
	"k3/internal/tiny"
)

// storedLayout hides the CPU backend's PrepareMatMul, so that a model's
// weights keep the checkpoint's layout.
type storedLayout struct{ compute.Backend }

// TestKMajorModel: a model wide enough that its projections are laid out
// k-major (hidden 1032, every preset matrix at least KMajorMinN rows but
// the router's) gives the stored layout's logits within the conformance
// tolerance, for a prefill and for the decode steps after it.
func TestKMajorModel(t *testing.T) {
	if !kernel.KMajorFast() {
		t.Skip("the k-major tiles do not run on this path")
	}
	dir := t.TempDir()
	require.NoError(t, tiny.Write(dir, "k31pro", tiny.Options{Seed: 11, BF16: true, Edit: func(text map[string]any) {
		text["hidden_size"] = 1032
	}}))
	ctx := context.Background()
	km, err := Load(ctx, dir)
	require.NoError(t, err)
	defer km.Close()
	st, err := Load(ctx, dir, WithComputeBackend(storedLayout{cpu.New(0)}))
	require.NoError(t, err)
	defer st.Close()
	a, err := km.NewSession()
	require.NoError(t, err)
	defer a.Close()
	b, err := st.NewSession()
	require.NoError(t, err)
	defer b.Close()
	prompt := make([]int32, 70) // a chunk long enough for the packed GEMM on the stored side
	for i := range prompt {
		prompt[i] = int32((i*7 + 3) % km.VocabSize())
	}
	la, err := a.Forward(ctx, prompt)
	require.NoError(t, err)
	lb, err := b.Forward(ctx, prompt)
	require.NoError(t, err)
	closeLogits(t, "prefill, k-major against stored", lb, la)
	for i := 0; i < 4; i++ {
		tok := []int32{int32(i + 1)}
		la, err = a.Forward(ctx, tok)
		require.NoError(t, err)
		lb, err = b.Forward(ctx, tok)
		require.NoError(t, err)
		closeLogits(t, "decode step, k-major against stored", lb, la)
	}
}
