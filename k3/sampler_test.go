package k3

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSamplerWithBatch: a Batch driven by model-level samplers produces
// exactly what Generate produces for each session alone, sampling included.
func TestSamplerWithBatch(t *testing.T) {
	m := load(t)
	ctx := context.Background()
	prompts := []string{"abc", "func main()", "x"}
	opts := func(i int) []GenerateOption {
		return []GenerateOption{WithTemperature(0.9), WithTopK(40), WithSeed(uint64(i + 1)), WithPresencePenalty(0.3),
			WithMaxTokens(12), WithoutDefaultStops()}
	}
	var want [][]int32
	for i, p := range prompts {
		s, err := m.NewSession()
		require.NoError(t, err)
		want = append(want, collect(t, s.Generate(ctx, p, opts(i)...)))
	}
	bt, err := m.NewBatch(len(prompts))
	require.NoError(t, err)
	sessions := make([]*Session, len(prompts))
	samplers := make([]*Sampler, len(prompts))
	got := make([][]int32, len(prompts))
	for i, p := range prompts {
		sessions[i], err = m.NewSession()
		require.NoError(t, err)
		ids := m.Encode(p)
		_, err = sessions[i].Forward(ctx, ids)
		require.NoError(t, err)
		samplers[i], err = m.NewSampler(opts(i)...)
		require.NoError(t, err)
		samplers[i].Observe(ids...)
	}
	tokens := make([]int32, len(prompts))
	for step := 0; step < 12; step++ {
		for i := range sessions {
			tokens[i], err = samplers[i].Next(sessions[i])
			require.NoError(t, err)
			got[i] = append(got[i], tokens[i])
		}
		require.NoError(t, bt.Step(ctx, sessions, tokens))
	}
	assert.Equal(t, want, got)

	fresh, _ := m.NewSession()
	_, err = samplers[0].Next(fresh)
	assert.ErrorIs(t, err, ErrEmptyPrompt)
	_, err = samplers[0].Sample([]float32{1, 2})
	assert.Error(t, err)
	_, err = m.NewSampler(WithTopP(2))
	assert.ErrorIs(t, err, ErrInvalidOption)
}
