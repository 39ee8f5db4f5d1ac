package k3

import (
	"context"
	"slices"
	"testing"

	"k3/internal/tiny"
)

// TestConfigVariants loads each preset with one config field changed (the
// layer pattern, MoE placement, AttnRes blocking, gates, activations, a
// DSA top-K beyond the context, ...) and checks that the model works: a
// prompt prefilled in chunks gives the logits of feeding it token by
// token through the decode path, generation runs, and a batch step, a
// clone and a truncation succeed. Each variant is a combination the
// presets and the golden files do not have.
func TestConfigVariants(t *testing.T) {
	lin := func(m map[string]any) map[string]any { return m["linear_attn_config"].(map[string]any) }
	allLayers := func(m map[string]any) []int {
		var l []int
		for i := 1; i <= m["num_hidden_layers"].(int); i++ {
			l = append(l, i)
		}
		return l
	}
	variants := []struct {
		name string
		edit func(map[string]any)
	}{
		{"moe every other layer", func(m map[string]any) { m["moe_layer_freq"] = 2 }},
		{"no dense first layer", func(m map[string]any) { m["first_k_dense_replace"] = 0 }},
		{"three dense layers", func(m map[string]any) { m["first_k_dense_replace"] = 3 }},
		{"no shared experts", func(m map[string]any) { m["num_shared_experts"] = 0 }},
		{"no moe", func(m map[string]any) { m["num_experts"] = nil }},
		{"every expert", func(m map[string]any) { m["num_experts_per_token"] = m["num_experts"] }},
		{"no renormalisation", func(m map[string]any) { m["moe_renormalize"] = false }},
		{"attnres block 1", func(m map[string]any) { m["attn_res_block_size"] = 1 }},
		{"attnres block beyond the depth", func(m map[string]any) { m["attn_res_block_size"] = 9 }},
		{"no attnres", func(m map[string]any) { m["attn_res_block_size"] = nil }},
		{"tied embeddings", func(m map[string]any) { m["tie_word_embeddings"] = true }},
		{"silu", func(m map[string]any) { m["hidden_act"] = "silu" }},
		{"situ unclipped up branch", func(m map[string]any) { m["activation_situ_linear_beta"] = nil }},
		{"only kda", func(m map[string]any) { lin(m)["kda_layers"], lin(m)["full_attn_layers"] = allLayers(m), []int{} }},
		{"no kda", func(m map[string]any) { lin(m)["kda_layers"], lin(m)["full_attn_layers"] = []int{}, allLayers(m) }},
		{"softplus gate", func(m map[string]any) { lin(m)["gate_lower_bound"] = nil }},
		{"low-rank output gate", func(m map[string]any) { lin(m)["use_full_rank_gate"] = false }},
		{"conv width 2", func(m map[string]any) { lin(m)["short_conv_kernel_size"] = 2 }},
		{"conv width 1", func(m map[string]any) { lin(m)["short_conv_kernel_size"] = 1 }},
		{"kda head dim 5", func(m map[string]any) { lin(m)["head_dim"] = 5 }},
		{"one head", func(m map[string]any) { m["num_attention_heads"] = 1; lin(m)["num_heads"] = 1 }},
		{"no query lora", func(m map[string]any) { m["q_lora_rank"] = nil }},
		{"no mla output gate", func(m map[string]any) { m["mla_use_output_gate"] = false }},
		{"rope", func(m map[string]any) { m["mla_use_nope"] = false }},
		{"index top-1", func(m map[string]any) {
			if _, ok := m["index_topk"]; ok {
				m["index_topk"] = 1
			}
		}},
		// More than the context holds: every row keeps all it sees, as
		// dense MLA.
		{"index top-K beyond the context", func(m map[string]any) {
			if _, ok := m["index_topk"]; ok {
				m["index_topk"], m["max_position_embeddings"] = 2048, 64
			}
		}},
	}
	ctx := context.Background()
	prompt := make([]int32, 23)
	for i := range prompt {
		prompt[i] = int32(3 + i*7%250)
	}
	for _, preset := range []string{"k31pro", "k3", "kimi_linear"} {
		for _, v := range variants {
			t.Run(preset+"/"+v.name, func(t *testing.T) {
				dir := t.TempDir()
				if err := tiny.Write(dir, preset, tiny.Options{Seed: 3, Edit: v.edit}); err != nil {
					t.Fatal(err)
				}
				m, err := Load(ctx, dir, WithPrefillChunk(5))
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				chunked, err := m.NewSession()
				if err != nil {
					t.Fatal(err)
				}
				want, err := chunked.Forward(ctx, prompt)
				if err != nil {
					t.Fatal(err)
				}
				stepped, _ := m.NewSession()
				var got []float32
				for _, tok := range prompt {
					if got, err = stepped.Forward(ctx, []int32{tok}); err != nil {
						t.Fatal(err)
					}
				}
				// Forward returns every position's logits; compare the last.
				closeLogits(t, "prefill in chunks of 5 vs token by token", want[len(want)-len(got):], got)

				n := 0
				for tok, err := range chunked.GenerateTokens(ctx, nil, WithMaxTokens(4), WithTemperature(0)) {
					if err != nil {
						t.Fatal(err)
					}
					if tok.ID >= 0 { // not the reason-only item of a generation that drew a stop token first
						n++
					}
				}
				if n != 4 {
					t.Fatalf("generated %d tokens, want 4", n)
				}
				bt, err := m.NewBatch(2)
				if err != nil {
					t.Fatal(err)
				}
				if err := bt.Step(ctx, []*Session{chunked, stepped}, []int32{5, 6}); err != nil {
					t.Fatal(err)
				}
				c, err := stepped.Clone()
				if err != nil {
					t.Fatal(err)
				}
				if err := c.Truncate(ctx, 3); err != nil {
					t.Fatal(err)
				}
				again, _ := m.NewSession()
				if _, err := again.Forward(ctx, prompt[:3]); err != nil {
					t.Fatal(err)
				}
				l1, err := c.Forward(ctx, prompt[3:5])
				if err != nil {
					t.Fatal(err)
				}
				l2, err := again.Forward(ctx, prompt[3:5])
				if err != nil {
					t.Fatal(err)
				}
				if l1, l2 = l1[len(l1)/2:], l2[len(l2)/2:]; !slices.Equal(l1, l2) {
					closeLogits(t, "truncated clone vs a fresh session with the same tokens", l1, l2)
				}
			})
		}
	}
}
