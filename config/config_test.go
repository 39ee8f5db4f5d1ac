package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k3/internal/safetensors"
)

func TestGoldenConfigs(t *testing.T) {
	cases := []struct {
		dir    string
		layers string
		check  func(*Config) bool
	}{
		{"tiny_k31pro", "kda kda dsa kda kda dsa", func(c *Config) bool {
			return c.Indexer != nil && c.Indexer.TopK == 8 && c.MoE.LatentSize == 32 && c.AttnResBlockSize == 2 &&
				*c.KDA.GateLowerBound == -5 && c.KDA.FullRankGate && c.HiddenAct == "situ" && c.SiTULinearBeta == 25 &&
				c.MLA.QLoRARank == 48 && c.MLA.OutputGate && c.MLA.UseNoPE && !c.IsMoELayer(0) && c.IsMoELayer(1)
		}},
		{"tiny_k3", "kda kda kda mla mla", func(c *Config) bool {
			return c.Indexer == nil && c.MoE.NumShared == 2 && c.AttnResBlockSize == 3
		}},
		{"tiny_kimi_linear", "kda kda kda mla kda mla", func(c *Config) bool {
			return c.KDA.GateLowerBound == nil && !c.KDA.FullRankGate && c.MLA.QLoRARank == 0 && c.TieWordEmbeddings &&
				c.AttnResBlockSize == 0 && c.MoE.LatentSize == 0 && c.MoE.ScalingFactor == 2.446
		}},
		{"tiny_rope_dsa", "kda dsa kda dsa", func(c *Config) bool {
			return !c.MLA.UseNoPE && c.MoE.NumGroups == 2 && c.MoE.TopKGroup == 1 && c.Indexer.TopK == 6 && c.AttnResBlockSize == 1
		}},
	}
	for _, tc := range cases {
		dir := filepath.Join("../testdata/model", tc.dir)
		c, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, k := range c.Layers {
			kinds = append(kinds, k.String())
		}
		if got := strings.Join(kinds, " "); got != tc.layers {
			t.Errorf("%s: layers %q want %q", tc.dir, got, tc.layers)
		}
		if !tc.check(c) {
			t.Errorf("%s: fields %+v", tc.dir, c)
		}
		// The parameter count must equal the checkpoint's element count,
		// less the padding some files keep in A_log.
		ck, err := safetensors.OpenCheckpoint(dir)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, name := range ck.Names() {
			ti, _, _ := ck.Tensor(name)
			if strings.HasSuffix(name, "A_log") {
				n += int64(c.KDA.NumHeads)
				continue
			}
			n += ti.NumElements()
		}
		ck.Close()
		if got := c.NumParams(); got != n {
			t.Errorf("%s: NumParams %d, checkpoint has %d", tc.dir, got, n)
		}
	}
}

func TestDeepSeekV32(t *testing.T) {
	c, err := Parse([]byte(`{"model_type":"deepseek_v32","vocab_size":129280,"hidden_size":7168,"intermediate_size":18432,
	"num_hidden_layers":61,"num_attention_heads":128,"q_lora_rank":1536,"kv_lora_rank":512,"qk_nope_head_dim":128,
	"qk_rope_head_dim":64,"v_head_dim":128,"n_routed_experts":256,"num_experts_per_tok":8,"n_shared_experts":1,
	"moe_intermediate_size":2048,"n_group":8,"topk_group":4,"routed_scaling_factor":2.5,"first_k_dense_replace":3,
	"norm_topk_prob":true,"scoring_func":"sigmoid","topk_method":"noaux_tc","rms_norm_eps":1e-6,"max_position_embeddings":163840,
	"index_n_heads":64,"index_head_dim":128,"index_topk":2048,"rope_theta":10000,
	"rope_scaling":{"type":"yarn","factor":40,"original_max_position_embeddings":4096,"beta_fast":32,"beta_slow":1,"mscale":1.0,"mscale_all_dim":1.0},
	"bos_token_id":0,"eos_token_id":1,"some_future_field":{"x":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Layers[0] != DSA || c.Layers[60] != DSA || c.MoE.NumGroups != 8 || c.MoE.NumExperts != 256 || c.MLA.RopeScaling.Factor != 40 || c.IsMoELayer(2) || !c.IsMoELayer(3) {
		t.Errorf("parsed %+v", c)
	}
}

func TestInvalid(t *testing.T) {
	base := `"vocab_size":100,"hidden_size":16,"intermediate_size":32,"num_hidden_layers":2,"num_attention_heads":2,
	"kv_lora_rank":8,"qk_nope_head_dim":4,"qk_rope_head_dim":4,"v_head_dim":4,"mla_use_nope":true,
	"max_position_embeddings":64`
	kda := `"linear_attn_config":{"kda_layers":[1],"num_heads":2,"head_dim":8,"short_conv_kernel_size":4}`
	moe := `"num_experts":8,"num_experts_per_token":2,"moe_intermediate_size":8`
	draft := `,"dspark_config":{"target_layers":[0,1],"block_size":7,"markov_rank":8,"num_layers":1,"intermediate_size":16}`
	cases := []struct{ json, field string }{
		{`{` + base + `,"linear_attn_config":{"kda_layers":[3],"num_heads":2,"head_dim":8,"short_conv_kernel_size":4}}`, "kda_layers = 3"},
		{`{` + base + `,"linear_attn_config":{"kda_layers":[1,1],"num_heads":2,"head_dim":8,"short_conv_kernel_size":4}}`, "kda_layers = 1"},
		// Three entries for three layers, but layer 3 in neither list.
		{`{` + strings.Replace(base, `"num_hidden_layers":2`, `"num_hidden_layers":3`, 1) + `,"linear_attn_config":{"kda_layers":[1],"full_attn_layers":[2,2],"num_heads":2,"head_dim":8,"short_conv_kernel_size":4}}`, "full_attn_layers = 2: listed twice"},
		{`{` + base + `,"linear_attn_config":{"kda_layers":[1],"num_heads":2,"head_dim":8,"short_conv_kernel_size":0}}`, "short_conv_kernel_size = 0"},
		{`{` + base + `,"linear_attn_config":{"kda_layers":[1],"num_heads":2,"head_dim":8,"short_conv_kernel_size":4,"gate_lower_bound":-7}}`, "gate_lower_bound = -7"},
		{`{` + base + `,` + kda + `,"num_experts":8,"num_experts_per_token":9,"moe_intermediate_size":8}`, "num_experts_per_token = 9"},
		{`{` + base + `,` + moe + `,"num_expert_group":3}`, "num_expert_group = 3"},
		{`{` + base + `,` + moe + `,"num_expert_group":2,"topk_group":3}`, "topk_group = 3"},
		{`{` + base + `,"hidden_act":"gelu"}`, "hidden_act = gelu"},
		{`{` + base + `,"index_topk":8}`, "index_n_heads is required"},
		{`{"vocab_size":100,"hidden_size":0}`, "hidden_size = 0"},
		{`{` + base + `,"eos_token_id":100}`, "eos_token_id = 100"},
		{`{"text_config":{"vocab_size":1,"hidden_size":-4}}`, "hidden_size = -4"},
		{`{` + base + `,"hidden_act":"situ"}`, "activation_situ_beta"},
		{`{"vocab_size":"many"}`, "invalid config"},
		{`{` + strings.Replace(base, `"hidden_size":16`, `"hidden_size":1099511627776`, 1) + `}`, "hidden_size = 1099511627776"},
		{`{` + strings.Replace(base, `"num_hidden_layers":2`, `"num_hidden_layers":1099511627776`, 1) + `}`, "num_hidden_layers = 1099511627776"},
		{`{` + strings.Replace(base, `"max_position_embeddings":64`, `"max_position_embeddings":0`, 1) + `}`, "max_position_embeddings = 0"},
		{`{` + strings.Replace(base, `"max_position_embeddings":64`, `"unused":0`, 1) + `}`, "max_position_embeddings is required"},
		// Each size within bounds, their product beyond: 2^24 experts of 2^24 x 2^24.
		{`{` + base + `,"num_experts":16777216,"num_experts_per_token":2,"moe_intermediate_size":16777216,"routed_expert_hidden_size":16777216}`, "parameters"},
		{`not json`, "invalid config"},
		{`{` + base + strings.Replace(draft, `[0,1]`, `[2]`, 1) + `}`, "dspark_config.target_layers = 2"},
		{`{` + base + strings.Replace(draft, `[0,1]`, `[]`, 1) + `}`, "dspark_config.target_layers is required"},
		{`{` + base + strings.Replace(draft, `"block_size":7`, `"block_size":65`, 1) + `}`, "dspark_config.block_size = 65"},
		{`{` + base + strings.Replace(draft, `"markov_rank":8`, `"markov_rank":0`, 1) + `}`, "dspark_config.markov_rank = 0"},
		{`{` + base + strings.Replace(draft, `}`, `,"tensor_prefix":"draft"}`, 1) + `}`, "dspark_config.tensor_prefix = draft"},
	}
	for _, tc := range cases {
		_, err := Parse([]byte(tc.json))
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("want error naming %q, got %v", tc.field, err)
		}
	}
	if _, err := Parse([]byte(`{` + base + `,` + kda + `,` + moe + `}`)); err != nil {
		t.Errorf("valid base config rejected: %v", err)
	}
	c, err := Parse([]byte(`{` + base + draft + `}`))
	if err != nil || c.Draft == nil || c.Draft.TensorPrefix != "dspark." || c.Draft.BlockSize != 7 || len(c.Draft.TargetLayers) != 2 {
		t.Errorf("dspark_config: got %+v, %v", c.Draft, err)
	}
}

// FuzzParse feeds config.json variants to Parse: it must return a config
// or an error, never panic, and every error must wrap ErrInvalid.
func FuzzParse(f *testing.F) {
	for _, dir := range []string{"tiny_k31pro", "tiny_k3", "tiny_kimi_linear", "tiny_rope_dsa"} {
		data, err := os.ReadFile(filepath.Join("..", "testdata", "model", dir, "config.json"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"text_config": null}`))
	f.Add([]byte(`{"hidden_size": -1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if c == nil {
			t.Fatal("nil config without an error")
		}
		_ = c.NumParams()
	})
}

// TestVision: vision_config beside text_config marks a multimodal
// checkpoint; absent or null it does not.
func TestVision(t *testing.T) {
	b, err := os.ReadFile("../testdata/model/tiny_k31pro/config.json")
	if err != nil {
		t.Fatal(err)
	}
	body := strings.TrimPrefix(strings.TrimSpace(string(b)), "{")
	for _, tc := range []struct {
		prefix string
		want   bool
	}{{"", false}, {`"vision_config": null,`, false}, {`"vision_config": {"model_type": "moonvit"},`, true}} {
		c, err := Parse([]byte("{" + tc.prefix + body))
		if err != nil {
			t.Fatal(err)
		}
		if c.Vision != tc.want {
			t.Errorf("%q: Vision = %v, want %v", tc.prefix, c.Vision, tc.want)
		}
	}
}
