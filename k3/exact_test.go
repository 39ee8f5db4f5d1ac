package k3

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/config"
	"k3/internal/tiny"
)

// TestExactAlongTime: T new tokens in one Forward give logits bitwise equal
// to T single-token Forwards, for T up to ExactTokens, on every testdata
// model (the goldens' and the random layouts'), with prompts long enough
// that DSA layers select (top-K below the context) and with repeated
// tokens, whose equal index keys in NoPE models leave the selection to the
// tie rule, and after a 3-token prompt, where a pass's first rows attend to
// every position and its later ones select.
// The next step after either path is the same too, so the states agree.
func TestExactAlongTime(t *testing.T) {
	dirs := testModels(t)
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
		for _, plen := range []int{len(prompt), 3} {
			base, err := m.NewSession()
			require.NoError(t, err)
			_, err = base.Forward(ctx, prompt[:plen])
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
				require.Equal(t, want, got, "%s: %d tokens in one pass against %d steps after %d", filepath.Base(dir), T, T, plen)
				next := []int32{prompt[3]}
				a, err := one.Forward(ctx, next)
				require.NoError(t, err)
				b, err := many.Forward(ctx, next)
				require.NoError(t, err)
				require.Equal(t, a, b, "%s: the step after %d tokens after %d", filepath.Base(dir), T, plen)
			}
		}
		m.Close()
	}
}

// TestRaggedBatchEqualsAlone: a Batch.Forward over sessions with 1 to
// ExactTokens new tokens each (more rows in all than one invariant group)
// gives every session the logits and states it gets alone, bitwise, on
// every testdata model; the replay logs it fills roll back exactly.
func TestRaggedBatchEqualsAlone(t *testing.T) {
	dirs := testModels(t)
	ctx := context.Background()
	counts := []int{1, 3, ExactTokens, 8, 2, 5, 1, 7}
	for _, cfgPath := range dirs {
		dir := filepath.Dir(cfgPath)
		m, err := Load(ctx, dir, WithRollback(ExactTokens))
		require.NoError(t, err)
		r := rand.New(rand.NewPCG(17, uint64(len(dir))))
		alone, batched, lists, want := pairedSessions(t, m, r, counts, 12)
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
		_, err = bt.Forward(ctx, batched[:1], [][]int32{make([]int32, 65)})
		assert.ErrorContains(t, err, "want 1..64")
		_, err = bt.Forward(ctx, batched[:1], [][]int32{nil})
		assert.Error(t, err)
		m.Close()
	}
}

// TestMixedBatch: prefill chunks and exact runs share Batch.Forward calls;
// the exact sessions stay bitwise what they get alone whatever the chunks
// beside them, and each chunk is within the prefill tolerance of its
// session prefilled alone; the next decode step agrees too.
func TestMixedBatch(t *testing.T) {
	dirs := testModels(t)
	// And a model wide enough (hidden 1032) that a pass of 64 rows or more
	// takes the packed GEMM: without the split between exact and prefill
	// rows, the exact sessions' arithmetic would change.
	wide := t.TempDir()
	require.NoError(t, tiny.Write(wide, "k31pro", tiny.Options{Seed: 7, BF16: true, Edit: func(text map[string]any) {
		text["hidden_size"] = 1032
	}}))
	dirs = append(dirs, filepath.Join(wide, "config.json"))
	ctx := context.Background()
	counts := []int{1, 3, 100, ExactTokens, 40, 17, 2} // the first pass: 22 exact rows and the 100-token chunk
	for _, cfgPath := range dirs {
		dir := filepath.Dir(cfgPath)
		m, err := Load(ctx, dir, WithRollback(4))
		require.NoError(t, err)
		r := rand.New(rand.NewPCG(23, uint64(len(dir))))
		alone, batched, lists, want := pairedSessions(t, m, r, counts, 5)
		bt, err := m.NewBatch(128)
		require.NoError(t, err)
		got, err := bt.Forward(ctx, batched, lists)
		require.NoError(t, err)
		vv, row := m.VocabSize(), 0
		for i, c := range counts {
			w, g := want[row*vv:(row+c)*vv], got[row*vv:(row+c)*vv]
			if c <= ExactTokens {
				require.Equal(t, w, g, "%s: exact session %d beside prefill chunks", filepath.Base(dir), i)
			} else {
				closeLogits(t, "prefill chunk in a batch", w, g)
			}
			row += c
		}
		next := make([]int32, len(counts))
		for i := range next {
			next[i] = r.Int32N(int32(m.VocabSize()))
		}
		require.NoError(t, bt.Step(ctx, batched, next))
		for i, c := range counts {
			_, err := alone[i].Forward(ctx, next[i:i+1])
			require.NoError(t, err)
			if c <= ExactTokens {
				require.Equal(t, alone[i].Logits(), batched[i].Logits(), "session %d, the step after", i)
			} else {
				closeLogits(t, "the step after a batched chunk", alone[i].Logits(), batched[i].Logits())
			}
		}
		m.Close()
	}
}

// testModels returns the config.json paths of the tiny whole models of
// testdata: the four goldens' and the random layouts of testdata/configs.
// Under the race detector the goldens alone: the layouts added about a
// minute to that run, and the plain and purego runs cover them.
func testModels(t *testing.T) []string {
	t.Helper()
	patterns := []string{"../testdata/model/*/config.json", "../testdata/configs/*/config.json"}
	if raceEnabled {
		patterns = patterns[:1]
	}
	var dirs []string
	for _, pattern := range patterns {
		found, err := filepath.Glob(pattern)
		require.NoError(t, err)
		require.NotEmpty(t, found, pattern)
		dirs = append(dirs, found...)
	}
	return dirs
}

// kinds reports which layer kinds a model has: KDA layers, attention
// layers (MLA or DSA), MoE layers. A test whose checks need one of them
// (states or keys that travel, experts to split) asks first: the random
// layouts of testdata/configs lack each of them somewhere.
func kinds(c *Config) (kda, attn, moe bool) {
	for l, k := range c.Layers {
		kda = kda || k == config.KDA
		attn = attn || k != config.KDA
		moe = moe || c.IsMoELayer(l)
	}
	return kda, attn, moe
}

// pairedSessions makes, for each count c, a session with a random prompt
// (base+i tokens) fed c more random tokens alone, and a clone taken before
// those tokens; it returns both, the tokens, and the lone sessions' logits
// for them, session after session.
func pairedSessions(t *testing.T, m *Model, r *rand.Rand, counts []int, base int) (alone, batched []*Session, lists [][]int32, want []float32) {
	t.Helper()
	ctx := context.Background()
	v := int32(m.VocabSize())
	for i, c := range counts {
		prompt := make([]int32, base+i)
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
	return alone, batched, lists, want
}

// TestOneChunkBesideExactRows: a pass that holds exact runs and one
// prefill chunk, and wants only each session's next-token logits (as the
// scheduler's passes do), gives every session, the chunk's included, the
// logits and states it gets alone, bitwise: the chunk's products run on
// its rows alone and its last row meets lm_head among at most
// InvariantRows rows. The wide model makes the chunk take the packed GEMM.
func TestOneChunkBesideExactRows(t *testing.T) {
	wide := t.TempDir()
	require.NoError(t, tiny.Write(wide, "k31pro", tiny.Options{Seed: 8, BF16: true, Edit: func(text map[string]any) {
		text["hidden_size"] = 1032
	}}))
	ctx := context.Background()
	for _, dir := range []string{wide, tinyDir, "../testdata/model/tiny_kimi_linear"} {
		m, err := Load(ctx, dir)
		require.NoError(t, err)
		r := rand.New(rand.NewPCG(29, 1))
		v := int32(m.VocabSize())
		counts := []int{1, 3, 100, ExactTokens, 2}
		var alone, batched []*Session
		var lists [][]int32
		for i, c := range counts {
			s, err := m.NewSession()
			require.NoError(t, err)
			prompt := make([]int32, 4+i)
			for j := range prompt {
				prompt[j] = r.Int32N(v)
			}
			_, err = s.Forward(ctx, prompt)
			require.NoError(t, err)
			cl, err := s.Clone()
			require.NoError(t, err)
			toks := make([]int32, c)
			for j := range toks {
				toks[j] = r.Int32N(v)
			}
			_, err = s.run(ctx, toks, false)
			require.NoError(t, err)
			alone, batched, lists = append(alone, s), append(batched, cl), append(lists, toks)
		}
		bt, err := m.NewBatch(128)
		require.NoError(t, err)
		cu := []int32{0}
		var flat []int32
		for _, l := range lists {
			flat = append(flat, l...)
			cu = append(cu, int32(len(flat)))
		}
		require.NoError(t, bt.run(ctx, batched, cu, flat, nil, nil))
		require.Len(t, bt.passes, 1, "one pass")
		for i := range counts {
			require.Equal(t, alone[i].Logits(), batched[i].Logits(), "%s: session %d (%d tokens)", filepath.Base(dir), i, counts[i])
		}
		next := make([]int32, len(counts))
		for i := range next {
			next[i] = r.Int32N(v)
		}
		require.NoError(t, bt.Step(ctx, batched, next))
		for i := range counts {
			_, err := alone[i].run(ctx, next[i:i+1], false)
			require.NoError(t, err)
			require.Equal(t, alone[i].Logits(), batched[i].Logits(), "%s: session %d, the step after", filepath.Base(dir), i)
		}
		m.Close()
	}
}
