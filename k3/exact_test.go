package k3

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
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

// TestRaggedBatchEqualsAlone: a Batch.Forward over sessions with 1 to
// ExactTokens new tokens each (more rows in all than one invariant group)
// gives every session the logits and states it gets alone, bitwise, on
// every testdata model; the replay logs it fills roll back exactly.
func TestRaggedBatchEqualsAlone(t *testing.T) {
	dirs, err := filepath.Glob("../testdata/model/*/config.json")
	require.NoError(t, err)
	ctx := context.Background()
	counts := []int{1, 3, ExactTokens, 8, 2, 5, 1, 7}
	for _, cfgPath := range dirs {
		dir := filepath.Dir(cfgPath)
		m, err := Load(ctx, dir, WithRollback(ExactTokens))
		require.NoError(t, err)
		r := rand.New(rand.NewPCG(17, uint64(len(dir))))
		v := int32(m.VocabSize())
		var batched, alone []*Session
		var lists [][]int32
		var want []float32
		for i, c := range counts {
			prompt := make([]int32, 12+i)
			for j := range prompt {
				prompt[j] = r.Int32N(v)
			}
			a, err := m.NewSession()
			require.NoError(t, err)
			_, err = a.Forward(ctx, prompt)
			require.NoError(t, err)
			b, err := a.Clone()
			require.NoError(t, err)
			toks := make([]int32, c)
			for j := range toks {
				toks[j] = r.Int32N(v)
			}
			l, err := a.Forward(ctx, toks)
			require.NoError(t, err)
			want = append(want, l...)
			alone, batched, lists = append(alone, a), append(batched, b), append(lists, toks)
		}
		bt, err := m.NewBatch(64)
		require.NoError(t, err)
		got, err := bt.Forward(ctx, batched, lists)
		require.NoError(t, err)
		require.Equal(t, want, got, "%s: ragged batch against each session alone", filepath.Base(dir))
		for i := range batched {
			require.Equal(t, alone[i].Logits(), batched[i].Logits())
			require.Equal(t, kdaStates(t, alone[i]), kdaStates(t, batched[i]), "session %d states", i)
			// Roll the batched session back two tokens and feed one again:
			// the same as the session alone doing it.
			if counts[i] >= 2 {
				for _, s := range []*Session{alone[i], batched[i]} {
					require.NoError(t, s.Truncate(ctx, s.Len()-2))
				}
				require.Equal(t, alone[i].Logits(), batched[i].Logits(), "session %d after a rollback", i)
			}
		}
		_, err = bt.Forward(ctx, batched[:1], [][]int32{make([]int32, ExactTokens+1)})
		assert.Error(t, err)
		_, err = bt.Forward(ctx, batched[:1], [][]int32{nil})
		assert.Error(t, err)
		m.Close()
	}
}
