package k3

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/internal/tiny"
)

// TestRandomConfigs loads checkpoints of random shapes and layer patterns
// (several fields changed at once, where TestConfigVariants changes one)
// with random prefill chunks, rollback depths and prefix caches, and
// checks every promise the SDK makes about them: a chunked prefill within
// the tolerance of token-by-token feeding; bitwise, a batch step against
// each session alone, Save/LoadSession and Fork against the session they
// copy, a prefix-cache hit against the cold run, the Batcher against
// Session.GenerateTokens, and greedy speculation against plain decoding;
// and a truncation within the tolerance of a fresh prefill. K3_CONFIGS=N
// runs N configurations instead of the default 24 (K3_CONFIGS_SEED the
// first seed).
func TestRandomConfigs(t *testing.T) { runSeeds(t, "K3_CONFIGS", 24, checkRandomConfig) }

// randomPrompt returns n random token ids from 3 to 252 (past the ids the
// presets give their special tokens, within the smallest vocabulary).
func randomPrompt(r *rand.Rand, m *Model, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(3 + r.IntN(min(m.VocabSize()-3, 250)))
	}
	return p
}

// runSeeds runs check as subtests named by their seeds: n of them from
// seed 1, or as many as the environment variable env says, from the seed
// env_SEED says.
func runSeeds(t *testing.T, env string, n int, check func(t *testing.T, seed uint64)) {
	first := 1
	if v, err := strconv.Atoi(os.Getenv(env)); err == nil && v > 0 {
		n = v
	}
	if v, err := strconv.Atoi(os.Getenv(env + "_SEED")); err == nil {
		first = v
	}
	for seed := uint64(first); seed < uint64(first+n); seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { check(t, seed) })
	}
}

// randomConfig changes a preset's text config at random: layer count and
// pattern, attention and KDA heads, widths, experts and their groups, the
// indexer, the conv width, AttnRes blocks, tied embeddings, shared
// experts and MoE placement.
func randomConfig(r *rand.Rand, m map[string]any) {
	pick := func(xs ...int) int { return xs[r.IntN(len(xs))] }
	lin := m["linear_attn_config"].(map[string]any)
	if r.IntN(2) == 0 {
		layers := pick(1, 2, 3, 5)
		kda, full := []int{}, []int{}
		for i := 1; i <= layers; i++ {
			if r.IntN(3) == 0 {
				full = append(full, i)
			} else {
				kda = append(kda, i)
			}
		}
		m["num_hidden_layers"], lin["kda_layers"], lin["full_attn_layers"] = layers, kda, full
		if v, ok := m["first_k_dense_replace"].(int); ok && v > layers {
			m["first_k_dense_replace"] = layers
		}
	}
	if r.IntN(2) == 0 {
		heads := pick(1, 2, 3, 4)
		m["num_attention_heads"], m["num_key_value_heads"] = heads, heads
		m["qk_nope_head_dim"], m["qk_rope_head_dim"], m["v_head_dim"] = pick(4, 8, 12), pick(2, 4, 6), pick(4, 10, 16)
		m["kv_lora_rank"] = pick(8, 20, 32)
		if m["q_lora_rank"] != nil {
			m["q_lora_rank"] = pick(12, 36)
		}
	}
	if r.IntN(2) == 0 {
		m["hidden_size"], m["intermediate_size"] = pick(24, 60, 64, 100), pick(40, 100)
	}
	if r.IntN(2) == 0 {
		experts := pick(4, 6, 8, 16)
		m["num_experts"], m["num_experts_per_token"], m["moe_intermediate_size"] = experts, 1+r.IntN(4), pick(8, 24)
		if _, ok := m["routed_expert_hidden_size"]; ok {
			m["routed_expert_hidden_size"] = pick(16, 28)
		}
		m["num_expert_group"], m["topk_group"] = 1, 1
		if experts >= 8 && r.IntN(2) == 0 {
			m["num_expert_group"], m["topk_group"] = 4, 2 // two groups of at least two experts
		}
	}
	if _, ok := m["index_topk"]; ok && r.IntN(2) == 0 {
		m["index_n_heads"], m["index_head_dim"], m["index_topk"] = pick(1, 3, 4), pick(8, 12, 16), pick(1, 3, 5, 17)
	}
	if r.IntN(2) == 0 {
		lin["num_heads"], lin["head_dim"] = pick(1, 2, 3), pick(5, 8, 12, 16)
	}
	if r.IntN(3) == 0 {
		lin["short_conv_kernel_size"] = pick(1, 2, 3, 4)
	}
	if r.IntN(3) == 0 {
		m["attn_res_block_size"] = pick(1, 2, 9)
	}
	if r.IntN(4) == 0 {
		m["tie_word_embeddings"] = true
	}
	if r.IntN(4) == 0 {
		m["num_shared_experts"] = 0
	}
	if r.IntN(4) == 0 {
		m["moe_layer_freq"] = 2
	}
}

func checkRandomConfig(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x6b33))
	pick := func(xs ...int) int { return xs[r.IntN(len(xs))] }
	preset := []string{"k31pro", "k3", "kimi_linear"}[r.IntN(3)]
	var text string
	dir := t.TempDir()
	bf16 := r.IntN(2) == 0
	edit := func(m map[string]any) {
		randomConfig(r, m)
		text = fmt.Sprint(m)
	}
	require.NoError(t, tiny.Write(dir, preset, tiny.Options{Seed: seed, BF16: bf16, Edit: edit}))
	chunk, rollback := 1+r.IntN(9), pick(0, 0, 4, 9)
	if r.IntN(3) == 0 {
		chunk = 10 + r.IntN(90)
	}
	opts := []Option{WithPrefillChunk(chunk), WithRollback(rollback)}
	cached := r.IntN(2) == 0
	if cached {
		opts = append(opts, WithPrefixCache(64<<20))
	}
	desc := fmt.Sprintf("%s, bf16 %v, prefill chunk %d, rollback %d, prefix cache %v: %s", preset, bf16, chunk, rollback, cached, text)
	ctx := context.Background()
	m, err := Load(ctx, dir, opts...)
	require.NoError(t, err, desc)
	defer m.Close()
	prompt := func(n int) []int32 { return randomPrompt(r, m, n) }
	session := func(p []int32) *Session {
		s, err := m.NewSession()
		require.NoError(t, err, desc)
		if p != nil {
			_, err = s.Forward(ctx, p)
			require.NoError(t, err, desc)
		}
		return s
	}

	p := prompt(1 + r.IntN(40))
	if r.IntN(3) == 0 {
		p = prompt(60 + r.IntN(250)) // past a page and the prefix cache's blocks
	}
	a, stepped := session(p), session(nil)
	for _, tok := range p {
		_, err := stepped.Forward(ctx, []int32{tok})
		require.NoError(t, err, desc)
	}
	closeLogits(t, "chunked prefill against token by token, "+desc, a.Logits(), stepped.Logits())

	b, c := session(prompt(1+r.IntN(20))), session(prompt(1+r.IntN(20)))
	batched := []*Session{a, b, c}
	var alone []*Session
	for _, s := range batched {
		cl, err := s.Clone()
		require.NoError(t, err, desc)
		alone = append(alone, cl)
	}
	bt, err := m.NewBatch(3)
	require.NoError(t, err, desc)
	next := prompt(3)
	require.NoError(t, bt.Step(ctx, batched, next), desc)
	for i, s := range alone {
		_, err := s.Forward(ctx, next[i:i+1])
		require.NoError(t, err, desc)
		require.Equal(t, s.Logits(), batched[i].Logits(), "batch step against sequence %d alone, %s", i, desc)
	}

	collect(t, a.GenerateTokens(ctx, nil, WithMaxTokens(6), WithTemperature(0), WithoutDefaultStops()))
	var saved bytes.Buffer
	require.NoError(t, a.Save(&saved), desc)
	loaded, err := m.LoadSession(&saved)
	require.NoError(t, err, desc)
	fork, err := a.Fork()
	require.NoError(t, err, desc)
	more := prompt(2)
	for _, s := range []*Session{a, loaded, fork} {
		_, err := s.Forward(ctx, more)
		require.NoError(t, err, desc)
	}
	require.Equal(t, a.Logits(), loaded.Logits(), "a saved and loaded session, %s", desc)
	require.Equal(t, a.Logits(), fork.Logits(), "a fork, %s", desc)

	keep := a.Len() - 1 - r.IntN(min(a.Len()-1, 12))
	require.NoError(t, a.Truncate(ctx, keep), desc)
	closeLogits(t, "truncated against a fresh prefill, "+desc, session(a.Tokens()).Logits(), a.Logits())

	type generation struct {
		ids []int32
		lps []float32
	}
	generate := func(seq func(*Session) func(func(Token, error) bool)) generation {
		s := session(nil)
		defer s.Close()
		var g generation
		for tok, err := range seq(s) {
			require.NoError(t, err, desc)
			g.ids, g.lps = append(g.ids, tok.ID), append(g.lps, tok.Logprob)
		}
		return g
	}
	temp := float32(pick(0, 1))
	gen := []GenerateOption{WithMaxTokens(8), WithTemperature(temp), WithSeed(seed), WithoutDefaultStops(), WithLogprobs(0)}
	prompts := [][]int32{prompt(1 + r.IntN(30)), prompt(1 + r.IntN(30)), append(slices.Clone(p), p...)}
	var want []generation
	for _, pr := range prompts {
		want = append(want, generate(func(s *Session) func(func(Token, error) bool) { return s.GenerateTokens(ctx, pr, gen...) }))
	}
	// The doubled prompt again: a prefix-cache hit where the cache is on.
	require.Equal(t, want[2], generate(func(s *Session) func(func(Token, error) bool) { return s.GenerateTokens(ctx, prompts[2], gen...) }),
		"the same prompt twice, %s", desc)

	bc, err := m.NewBatcher(len(prompts))
	require.NoError(t, err, desc)
	bctx, stop := context.WithCancel(ctx)
	require.NoError(t, bc.Start(bctx), desc)
	got := make([]generation, len(prompts))
	done := make(chan struct{})
	for i, pr := range prompts {
		go func() {
			defer func() { done <- struct{}{} }()
			got[i] = generate(func(s *Session) func(func(Token, error) bool) { return bc.GenerateTokens(ctx, s, pr, gen...) })
		}()
	}
	for range prompts {
		<-done
	}
	stop()
	_ = bc.Wait()
	for i := range prompts {
		require.Equal(t, want[i], got[i], "the Batcher against generating alone, prompt %d, %s", i, desc)
	}

	if temp == 0 && rollback > 0 && len(m.layers) > 1 {
		draft, err := m.NewSelfDraft(1)
		require.NoError(t, err, desc)
		depth := 1 + r.IntN(min(rollback, 4))
		spec := generate(func(s *Session) func(func(Token, error) bool) {
			return s.GenerateTokens(ctx, prompts[0], append(gen, WithSpeculation(draft, depth))...)
		})
		require.Equal(t, want[0], spec, "greedy speculation %d deep against plain decoding, %s", depth, desc)
		require.NoError(t, draft.Close())
	}
}
