package k3

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestExactAlongTime: T new tokens in one Forward give logits bitwise equal
// to T single-token Forwards, for T up to ExactTokens, on every testdata
// model, with prompts long enough that DSA layers select (top-K below the
// context) and with repeated tokens, whose equal index keys in NoPE models
// leave the selection to the tie rule. The next step after either path is
// the same too, so the states agree.
func TestExactAlongTime(t *testing.T) {
	dirs, err := filepath.Glob("../testdata/model/*/config.json")
	require.NoError(t, err)
	require.NotEmpty(t, dirs)
	ctx := context.Background()
	for _, dir := range dirs {
		dir = filepath.Dir(dir)
		m, err := Load(ctx, dir, WithPrefillChunk(64))
		require.NoError(t, err, dir)
		r := rand.New(rand.NewPCG(11, uint64(len(dir))))
		v := int32(m.VocabSize())
		prompt := make([]int32, 40)
		for i := range prompt {
			prompt[i] = r.Int32N(v)
		}
		copy(prompt[20:], prompt[:10]) // repeats: ties for NoPE indexers
		base, err := m.NewSession()
		require.NoError(t, err)
		_, err = base.Forward(ctx, prompt)
		require.NoError(t, err)
		for _, T := range []int{2, 3, 8, ExactTokens} {
			toks := make([]int32, T)
			for i := range toks {
				toks[i] = prompt[r.IntN(len(prompt))]
			}
			one, err := base.Clone()
			require.NoError(t, err)
			many, err := base.Clone()
			require.NoError(t, err)
			var want []float32
			for _, tok := range toks {
				l, err := one.Forward(ctx, []int32{tok})
				require.NoError(t, err)
				want = append(want, l...)
			}
			got, err := many.Forward(ctx, toks)
			require.NoError(t, err)
			require.Equal(t, want, got, "%s: %d tokens in one pass against %d steps", filepath.Base(dir), T, T)
			next := []int32{prompt[3]}
			a, err := one.Forward(ctx, next)
			require.NoError(t, err)
			b, err := many.Forward(ctx, next)
			require.NoError(t, err)
			require.Equal(t, a, b, "%s: the step after %d tokens", filepath.Base(dir), T)
		}
		m.Close()
	}
}
