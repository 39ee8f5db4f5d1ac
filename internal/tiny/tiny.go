// Package tiny writes deterministic random-weight checkpoints in the real
// Kimi layouts (config.json, safetensors with Hugging Face tensor names, a
// byte-level tokenizer), so that tests, benchmarks and the examples run
// with no downloads. The weights are random: the text they produce is not
// language.
package tiny

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"

	"k3/config"
	"k3/internal/floatx"
	"k3/internal/safetensors"
	"k3/internal/tokenizer"
)

// Presets names the layouts New knows.
var Presets = []string{"k31pro", "k3", "kimi_linear", "k31pro-100m", "k31pro-1b"}

// Config returns the config.json object of a preset.
func Config(preset string) (map[string]any, error) {
	text := map[string]any{
		"model_type": "kimi_linear", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
		"num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 4,
		"hidden_act": "situ", "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
		"rms_norm_eps": 1e-5, "tie_word_embeddings": false, "max_position_embeddings": 4096,
		"q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
		"mla_use_nope": true, "mla_use_output_gate": true, "rope_theta": 10000.0,
		"num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 1, "moe_intermediate_size": 32,
		"routed_expert_hidden_size": 32, "latent_moe_use_norm": true, "moe_renormalize": true,
		"moe_router_activation_func": "sigmoid", "topk_method": "noaux_tc", "num_expert_group": 1, "topk_group": 1,
		"routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "moe_layer_freq": 1, "attn_res_block_size": 2,
		"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
		"index_n_heads": 4, "index_head_dim": 16, "index_topk": 8,
		"linear_attn_config": map[string]any{"kda_layers": []int{1, 2, 4, 5}, "full_attn_layers": []int{3, 6},
			"num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4, "use_full_rank_gate": true, "gate_lower_bound": -5.0},
	}
	outer := map[string]any{"architectures": []string{"KimiK3ForConditionalGeneration"}, "model_type": "kimi_k3", "text_config": text}
	switch preset {
	case "k31pro":
	case "k3":
		for _, k := range []string{"index_n_heads", "index_head_dim", "index_topk"} {
			delete(text, k)
		}
		text["num_hidden_layers"] = 5
		text["linear_attn_config"].(map[string]any)["kda_layers"] = []int{1, 2, 3}
		text["linear_attn_config"].(map[string]any)["full_attn_layers"] = []int{4, 5}
		text["attn_res_block_size"] = 3
	case "kimi_linear":
		text["hidden_act"] = "silu"
		for _, k := range []string{"index_n_heads", "index_head_dim", "index_topk", "activation_situ_beta", "activation_situ_linear_beta",
			"routed_expert_hidden_size", "latent_moe_use_norm", "attn_res_block_size"} {
			delete(text, k)
		}
		text["q_lora_rank"] = nil
		text["mla_use_output_gate"] = false
		text["tie_word_embeddings"] = true
		text["routed_scaling_factor"] = 2.446
		lin := text["linear_attn_config"].(map[string]any)
		lin["kda_layers"], lin["full_attn_layers"] = []int{1, 2, 3, 5}, []int{4, 6}
		delete(lin, "use_full_rank_gate")
		delete(lin, "gate_lower_bound")
		text["architectures"] = []string{"KimiLinearForCausalLM"}
		return text, nil
	case "k31pro-100m":
		// About 100M parameters: hidden 768, 12 layers (KDA, KDA, KDA, DSA)
		// × 3, 64 experts top-4: the shape `k3 bench model` measures.
		text["hidden_size"], text["intermediate_size"], text["num_hidden_layers"] = 768, 2048, 12
		text["num_attention_heads"], text["num_key_value_heads"] = 6, 6
		text["q_lora_rank"], text["kv_lora_rank"], text["qk_nope_head_dim"], text["qk_rope_head_dim"], text["v_head_dim"] = 384, 256, 64, 32, 64
		text["num_experts"], text["num_experts_per_token"], text["moe_intermediate_size"] = 64, 4, 64
		text["routed_expert_hidden_size"] = 384
		text["index_n_heads"], text["index_head_dim"], text["index_topk"] = 8, 64, 256
		text["attn_res_block_size"] = 4
		text["max_position_embeddings"] = 8192
		lin := text["linear_attn_config"].(map[string]any)
		lin["kda_layers"], lin["full_attn_layers"] = []int{1, 2, 3, 5, 6, 7, 9, 10, 11}, []int{4, 8, 12}
		lin["num_heads"], lin["head_dim"] = 6, 128
	case "k31pro-1b":
		// About 0.98B parameters, 0.63B of them read by a decode step (about
		// 1.3 GB in bf16, several times any CPU's last-level cache): hidden
		// 2048, 12 layers (KDA, KDA, KDA, DSA) × 3, 16 experts top-6 of
		// width 512, a dense first layer of 8192. `k3 bench model` measures
		// its decode beside the 100M preset's, whose step a large L3
		// partly serves.
		text["hidden_size"], text["intermediate_size"], text["num_hidden_layers"] = 2048, 8192, 12
		text["num_attention_heads"], text["num_key_value_heads"] = 16, 16
		text["q_lora_rank"], text["kv_lora_rank"], text["qk_nope_head_dim"], text["qk_rope_head_dim"], text["v_head_dim"] = 768, 512, 128, 64, 128
		text["num_experts"], text["num_experts_per_token"], text["moe_intermediate_size"] = 16, 6, 512
		text["routed_expert_hidden_size"] = 2048
		text["index_n_heads"], text["index_head_dim"], text["index_topk"] = 16, 128, 512
		text["attn_res_block_size"] = 4
		text["max_position_embeddings"] = 8192
		lin := text["linear_attn_config"].(map[string]any)
		lin["kda_layers"], lin["full_attn_layers"] = []int{1, 2, 3, 5, 6, 7, 9, 10, 11}, []int{4, 8, 12}
		lin["num_heads"], lin["head_dim"] = 16, 128
	default:
		return nil, fmt.Errorf("tiny: unknown preset %q (have %v)", preset, Presets)
	}
	return outer, nil
}

// Options for Write.
type Options struct {
	Seed  uint64
	BF16  bool // store matrices as bf16 (norms, biases and gates stay f32)
	Scale float64
	// Edit, when set, changes the preset's text config (the fields of
	// config.json's text_config, or of the whole file for Kimi Linear)
	// before it is written: tests use it for shapes no preset has.
	Edit func(text map[string]any)
}

// Write creates dir with a checkpoint of the preset.
func Write(dir, preset string, o Options) error {
	cfgJSON, err := Config(preset)
	if err != nil {
		return err
	}
	if o.Edit != nil {
		text := cfgJSON
		if tc, ok := cfgJSON["text_config"].(map[string]any); ok {
			text = tc
		}
		o.Edit(text)
	}
	raw, err := json.MarshalIndent(cfgJSON, "", "  ")
	if err != nil {
		return err
	}
	cfg, err := config.Parse(raw)
	if err != nil {
		return fmt.Errorf("tiny: preset %s: %w", preset, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), append(raw, '\n'), 0o644); err != nil {
		return err
	}
	prefix := ""
	if cfgJSON["text_config"] != nil {
		prefix = "language_model."
	}
	tensors := Tensors(cfg)
	r := rand.New(rand.NewPCG(o.Seed, 0x746e79))
	scale := o.Scale
	if scale == 0 {
		scale = 0.06
	}
	var out []safetensors.Tensor
	for _, t := range tensors {
		n := 1
		for _, d := range t.Shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			switch t.Init {
			case initOne:
				v[i] = 1 + float32(r.NormFloat64()*0.05)
			case initZero:
			case initALog:
				v[i] = float32(math.Log(1 + 15*r.Float64()))
			case initSmall:
				v[i] = float32(r.NormFloat64() * 0.01)
			default:
				v[i] = float32(r.NormFloat64() * scale)
			}
		}
		name := prefix + t.Name
		if o.BF16 && t.Init == initNormal && len(t.Shape) == 2 {
			h := make([]uint16, n)
			for i, x := range v {
				h[i] = floatx.BF16(x)
			}
			out = append(out, safetensors.U16Tensor(name, safetensors.BF16, t.Shape, h))
		} else {
			out = append(out, safetensors.F32Tensor(name, t.Shape, v))
		}
	}
	meta := map[string]string{"format": "pt", "generator": "k3 new-tiny", "preset": preset, "seed": fmt.Sprint(o.Seed),
		"note": "random weights: output is not language"}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), out, meta); err != nil {
		return err
	}
	return writeTokenizer(dir, cfg.VocabSize)
}

func writeTokenizer(dir string, vocab int) error {
	added := map[string]any{}
	ids := map[string]int32{"[PAD]": 0, "[BOS]": 1, "[EOS]": 2}
	next := int32(3 + 256)
	for _, s := range tokenizer.ChatSpecials {
		ids[s] = next
		next++
	}
	names := make([]string, 0, len(ids))
	for n := range ids {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		added[fmt.Sprint(ids[n])] = map[string]any{"content": n, "special": true}
	}
	if int(next) > vocab {
		return fmt.Errorf("tiny: vocabulary %d too small for the byte tokenizer", vocab)
	}
	cfg := map[string]any{"tokenizer_class": tokenizer.ByteLevelClass, "byte_offset": 3, "added_tokens_decoder": added,
		"bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]"}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), append(b, '\n'), 0o644)
}

type initKind uint8

const (
	initNormal initKind = iota
	initOne
	initZero
	initALog
	initSmall
)

// Tensor is one expected checkpoint tensor.
type Tensor struct {
	Name  string
	Shape []int
	Init  initKind
}

// Tensors lists every tensor a checkpoint of cfg holds, by its Hugging Face
// name (without the language_model. prefix).
func Tensors(cfg *config.Config) []Tensor {
	d := cfg.HiddenSize
	var ts []Tensor
	add := func(name string, init initKind, shape ...int) { ts = append(ts, Tensor{name, shape, init}) }
	add("model.embed_tokens.weight", initNormal, cfg.VocabSize, d)
	add("model.norm.weight", initOne, d)
	if !cfg.TieWordEmbeddings {
		add("lm_head.weight", initNormal, cfg.VocabSize, d)
	}
	if cfg.AttnResBlockSize > 0 {
		add("model.output_attn_res_proj.weight", initSmall, 1, d)
		add("model.output_attn_res_norm.weight", initOne, d)
	}
	for l, kind := range cfg.Layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		add(p+"input_layernorm.weight", initOne, d)
		add(p+"post_attention_layernorm.weight", initOne, d)
		if cfg.AttnResBlockSize > 0 {
			for _, side := range []string{"self_attention_res", "mlp_res"} {
				add(p+side+"_proj.weight", initSmall, 1, d)
				add(p+side+"_norm.weight", initOne, d)
			}
		}
		a := p + "self_attn."
		if kind == config.KDA {
			k := cfg.KDA
			hd := k.NumHeads * k.HeadDim
			for _, x := range []string{"q", "k", "v"} {
				add(a+x+"_proj.weight", initNormal, hd, d)
				add(a+x+"_conv1d.weight", initSmall, hd, 1, k.ConvKernel)
			}
			add(a+"f_a_proj.weight", initNormal, k.HeadDim, d)
			add(a+"f_b_proj.weight", initNormal, hd, k.HeadDim)
			add(a+"b_proj.weight", initNormal, k.NumHeads, d)
			if k.FullRankGate {
				add(a+"g_proj.weight", initNormal, hd, d)
			} else {
				add(a+"g_a_proj.weight", initNormal, k.HeadDim, d)
				add(a+"g_b_proj.weight", initNormal, hd, k.HeadDim)
			}
			add(a+"o_norm.weight", initOne, k.HeadDim)
			add(a+"o_proj.weight", initNormal, d, hd)
			add(a+"A_log", initALog, k.NumHeads)
			add(a+"dt_bias", initSmall, hd)
		} else {
			m := cfg.MLA
			qk := m.QKNopeHeadDim + m.QKRopeHeadDim
			qin := d
			if m.QLoRARank > 0 {
				qin = m.QLoRARank
				add(a+"q_a_proj.weight", initNormal, m.QLoRARank, d)
				add(a+"q_a_layernorm.weight", initOne, m.QLoRARank)
				add(a+"q_b_proj.weight", initNormal, m.NumHeads*qk, m.QLoRARank)
			} else {
				add(a+"q_proj.weight", initNormal, m.NumHeads*qk, d)
			}
			add(a+"kv_a_proj_with_mqa.weight", initNormal, m.KVLoRARank+m.QKRopeHeadDim, d)
			add(a+"kv_a_layernorm.weight", initOne, m.KVLoRARank)
			add(a+"kv_b_proj.weight", initNormal, m.NumHeads*(m.QKNopeHeadDim+m.VHeadDim), m.KVLoRARank)
			if m.OutputGate {
				add(a+"g_proj.weight", initNormal, m.NumHeads*m.VHeadDim, d)
			}
			add(a+"o_proj.weight", initNormal, d, m.NumHeads*m.VHeadDim)
			if kind == config.DSA {
				ix := cfg.Indexer
				add(a+"indexer.wq_b.weight", initNormal, ix.NumHeads*ix.HeadDim, qin)
				add(a+"indexer.wk.weight", initNormal, ix.HeadDim, d)
				add(a+"indexer.k_norm.weight", initOne, ix.HeadDim)
				add(a+"indexer.k_norm.bias", initZero, ix.HeadDim)
				add(a+"indexer.weights_proj.weight", initNormal, ix.NumHeads, d)
			}
		}
		if cfg.IsMoELayer(l) {
			e := cfg.MoE
			mp := p + "block_sparse_moe."
			add(mp+"gate.weight", initNormal, e.NumExperts, d)
			add(mp+"gate.e_score_correction_bias", initZero, e.NumExperts)
			din := d
			if e.LatentSize > 0 {
				din = e.LatentSize
				add(mp+"routed_expert_down_proj.weight", initNormal, din, d)
				if e.LatentNorm {
					add(mp+"routed_expert_norm.weight", initOne, din)
				}
				add(mp+"routed_expert_up_proj.weight", initNormal, d, din)
			}
			for x := 0; x < e.NumExperts; x++ {
				ep := fmt.Sprintf("%sexperts.%d.", mp, x)
				add(ep+"w1.weight", initNormal, e.IntermediateSize, din)
				add(ep+"w3.weight", initNormal, e.IntermediateSize, din)
				add(ep+"w2.weight", initNormal, din, e.IntermediateSize)
			}
			if e.NumShared > 0 {
				is := e.IntermediateSize * e.NumShared
				add(mp+"shared_experts.gate_proj.weight", initNormal, is, d)
				add(mp+"shared_experts.up_proj.weight", initNormal, is, d)
				add(mp+"shared_experts.down_proj.weight", initNormal, d, is)
			}
		} else {
			add(p+"mlp.gate_proj.weight", initNormal, cfg.IntermediateSize, d)
			add(p+"mlp.up_proj.weight", initNormal, cfg.IntermediateSize, d)
			add(p+"mlp.down_proj.weight", initNormal, d, cfg.IntermediateSize)
		}
	}
	return ts
}
