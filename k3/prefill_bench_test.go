package k3

import (
	"context"
	"testing"

	"k3/internal/tiny"
)

// BenchmarkPrefillLong prefills 4096 tokens through a two-layer K3.1
// Pro-shaped checkpoint with wide attention (32 heads, nope/rope/value dims
// 128/64/128, latent 512, indexer 16×64 keeping the top 512), in chunks of
// 512: sparse (from the second chunk on every row attends to its top 512)
// and dense (WithDenseAttention: every row attends to every earlier
// position, in MHA form).
func BenchmarkPrefillLong(b *testing.B) {
	dir := b.TempDir()
	edit := func(text map[string]any) {
		text["hidden_size"], text["intermediate_size"], text["num_hidden_layers"] = 1024, 256, 2
		text["num_attention_heads"], text["num_key_value_heads"] = 32, 32
		text["qk_nope_head_dim"], text["qk_rope_head_dim"], text["v_head_dim"] = 128, 64, 128
		text["kv_lora_rank"], text["q_lora_rank"] = 512, 384
		text["index_n_heads"], text["index_head_dim"], text["index_topk"] = 16, 64, 512
		text["num_experts"], text["num_experts_per_token"], text["moe_intermediate_size"] = 8, 2, 64
		text["routed_expert_hidden_size"] = 256
		text["attn_res_block_size"] = 1
		text["max_position_embeddings"] = 8192
		lin := text["linear_attn_config"].(map[string]any)
		lin["kda_layers"], lin["full_attn_layers"] = []int{1}, []int{2}
		lin["num_heads"], lin["head_dim"] = 8, 128
	}
	if err := tiny.Write(dir, "k31pro", tiny.Options{Seed: 3, BF16: true, Edit: edit}); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	prompt := make([]int32, 4096)
	for i := range prompt {
		prompt[i] = int32(3 + (i*37)%400)
	}
	for _, c := range []struct {
		name string
		opts []Option
	}{{"sparse", nil}, {"dense", []Option{WithDenseAttention()}}} {
		b.Run(c.name, func(b *testing.B) {
			m, err := Load(ctx, dir, append(c.opts, WithPrefillChunk(512))...)
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			b.ResetTimer()
			for range b.N {
				s, err := m.NewSession()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := s.Forward(ctx, prompt); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(prompt)*b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
