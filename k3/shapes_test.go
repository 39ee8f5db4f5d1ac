package k3

import (
	"context"
	"math"
	"testing"

	"k3/internal/tiny"
)

// TestShapes runs checkpoints of shapes no golden file has (odd widths,
// head and rank sizes that are not multiples of the vector width, grouped
// routing, a top-K smaller than the prompt, a short conv of width 3, YaRN
// rope scaling) through prefill, decode and batching: a prompt prefilled in chunks of 7
// must give the logits of one pass (within float32 rounding; at 70 tokens
// and width 1032 the one pass runs the packed GEMM), and a batch
// must give each session its solo logits to the bit.
func TestShapes(t *testing.T) {
	odd := func(text map[string]any) {
		text["hidden_size"], text["intermediate_size"] = 60, 100
		text["num_attention_heads"], text["num_key_value_heads"] = 3, 3
		text["qk_nope_head_dim"], text["qk_rope_head_dim"], text["v_head_dim"] = 12, 6, 10
		text["kv_lora_rank"] = 20
		if text["q_lora_rank"] != nil {
			text["q_lora_rank"] = 36
		}
		text["num_experts"], text["num_experts_per_token"], text["moe_intermediate_size"] = 6, 3, 24
		if _, ok := text["routed_expert_hidden_size"]; ok {
			text["routed_expert_hidden_size"] = 28
		}
		if _, ok := text["index_topk"]; ok {
			text["index_n_heads"], text["index_head_dim"], text["index_topk"] = 3, 12, 5
		}
		lin := text["linear_attn_config"].(map[string]any)
		lin["num_heads"], lin["head_dim"], lin["short_conv_kernel_size"] = 3, 12, 3
	}
	cases := []struct {
		name, preset string
		edit         func(map[string]any)
	}{
		{"k31pro-odd", "k31pro", odd},
		{"k3-odd", "k3", odd},
		{"kimi_linear-odd", "kimi_linear", odd},
		{"k3-grouped-router", "k3", func(text map[string]any) {
			text["num_experts"], text["num_experts_per_token"] = 8, 2
			text["num_expert_group"], text["topk_group"] = 4, 2
		}},
		{"k31pro-yarn", "k31pro", func(text map[string]any) {
			text["rope_scaling"] = map[string]any{"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512,
				"beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
		}},
		// Wide enough (k >= 1024) that a 70-token pass takes the packed
		// GEMM while chunks of 7 take the dot-form tiles.
		{"k31pro-wide", "k31pro", func(text map[string]any) {
			text["hidden_size"] = 1032
		}},
	}
	ctx := context.Background()
	prompt := make([]int32, 70)
	for i := range prompt {
		prompt[i] = int32(3 + (i*37)%200)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := tiny.Write(dir, c.preset, tiny.Options{Seed: 7, BF16: true, Edit: c.edit}); err != nil {
				t.Fatal(err)
			}
			whole, err := Load(ctx, dir, WithPrefillChunk(64))
			if err != nil {
				t.Fatal(err)
			}
			defer whole.Close()
			chunked, err := Load(ctx, dir, WithPrefillChunk(7))
			if err != nil {
				t.Fatal(err)
			}
			defer chunked.Close()

			a, _ := whole.NewSession()
			b, _ := chunked.NewSession()
			la, err := a.Forward(ctx, prompt)
			if err != nil {
				t.Fatal(err)
			}
			lb, err := b.Forward(ctx, prompt)
			if err != nil {
				t.Fatal(err)
			}
			closeLogits(t, "prefill, one pass vs chunks of 7", la, lb)
			for step := range 3 {
				tok := []int32{int32(11 + 5*step)}
				la, err = a.Forward(ctx, tok)
				if err != nil {
					t.Fatal(err)
				}
				lb, err = b.Forward(ctx, tok)
				if err != nil {
					t.Fatal(err)
				}
				closeLogits(t, "decode after the two prefills", la, lb)
			}

			// Three sessions at different lengths, stepped together and alone.
			var batched, solo []*Session
			for i := range 3 {
				s, _ := whole.NewSession()
				if _, err := s.Forward(ctx, prompt[:10+9*i]); err != nil {
					t.Fatal(err)
				}
				cl, err := s.Clone()
				if err != nil {
					t.Fatal(err)
				}
				batched, solo = append(batched, s), append(solo, cl)
			}
			bt, err := whole.NewBatch(3)
			if err != nil {
				t.Fatal(err)
			}
			for step := range 2 {
				toks := []int32{int32(20 + step), int32(30 + step), int32(40 + step)}
				if err := bt.Step(ctx, batched, toks); err != nil {
					t.Fatal(err)
				}
				for i, s := range solo {
					want, err := s.Forward(ctx, toks[i:i+1])
					if err != nil {
						t.Fatal(err)
					}
					for j, w := range want {
						if batched[i].last[j] != w {
							t.Fatalf("step %d session %d logit %d: %v batched, %v alone", step, i, j, batched[i].last[j], w)
						}
					}
				}
			}
		})
	}
}

// closeLogits compares two logit rows of the same computation taken along
// different float32 paths (chunk boundaries): within 1e-4 of the row's
// largest magnitude.
func closeLogits(t *testing.T, what string, a, b []float32) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d vs %d logits", what, len(a), len(b))
	}
	var scale, worst float64
	for i := range a {
		scale = max(scale, math.Abs(float64(a[i])))
		worst = max(worst, math.Abs(float64(a[i])-float64(b[i])))
	}
	if !(worst <= 1e-4*scale) {
		t.Fatalf("%s: max difference %.3g against a scale of %.3g", what, worst, scale)
	}
}
