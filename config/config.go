// Package config parses and validates Hugging Face config.json files of the
// model families k3 runs: Kimi Linear (model_type kimi_linear), Kimi K3 and
// K3.1 Pro (model_type kimi_k3, fields nested under text_config; K3.1 Pro
// adds DeepSeek-V3.2-style indexer fields), and DeepSeek-V3.2
// (model_type deepseek_v32). Unknown fields are ignored; every validation
// error names the field and the value and wraps ErrInvalid.
//
// Applications meet its Config as k3.Config (Model.Config, k3.LoadConfig);
// the package is public so that the fields are documented and a config can
// be checked without loading weights.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrInvalid is wrapped by every validation error.
var ErrInvalid = errors.New("invalid config")

// LayerKind is the token mixer of a decoder layer.
type LayerKind uint8

const (
	KDA LayerKind = iota // Kimi Delta Attention (linear attention)
	MLA                  // dense multi-head latent attention
	DSA                  // MLA restricted to the Lightning Indexer's top-K positions
)

func (k LayerKind) String() string {
	switch k {
	case KDA:
		return "kda"
	case MLA:
		return "mla"
	case DSA:
		return "dsa"
	}
	return fmt.Sprintf("LayerKind(%d)", k)
}

// Config is a validated model configuration.
type Config struct {
	ModelType    string // the outer model_type
	Architecture string // architectures[0], if given
	// Vision is whether config.json describes a vision encoder
	// (vision_config, beside text_config in Kimi K3's multimodal
	// checkpoints). k3 runs the text model; the encoder's and projector's
	// tensors are left unread.
	Vision bool

	VocabSize             int
	HiddenSize            int
	NumLayers             int
	IntermediateSize      int // dense MLP width
	RMSNormEps            float64
	HiddenAct             string  // "silu" or "situ"
	SiTUBeta              float64 // activation_situ_beta
	SiTULinearBeta        float64 // activation_situ_linear_beta; 0 means no clipping of the up branch
	TieWordEmbeddings     bool
	BOSTokenID            int
	EOSTokenIDs           []int
	MaxPositionEmbeddings int

	// Layers[l] is the kind of layer l (0-based).
	Layers []LayerKind

	KDA     KDAConfig
	MLA     MLAConfig
	Indexer *IndexerConfig // nil: full-attention layers are dense MLA
	MoE     *MoEConfig     // nil: every layer has a dense MLP

	// AttnResBlockSize is attn_res_block_size in decoder layers; 0 means a
	// plain residual stream.
	AttnResBlockSize int

	// Draft is the checkpoint's DSpark draft module (dspark_config), nil
	// when it has none.
	Draft *DraftConfig
}

// DraftConfig holds dspark_config: a draft module that reads the target's
// hidden states at TargetLayers (0-based; the input of each layer's MLP
// sublayer) and proposes BlockSize tokens in one pass. Its tensors are
// named TensorPrefix + the module's own names (docs/ARCHITECTURE.md lists
// them).
type DraftConfig struct {
	TargetLayers     []int
	BlockSize        int
	MarkovRank       int
	NumLayers        int
	IntermediateSize int
	TensorPrefix     string
}

// KDAConfig holds linear_attn_config.
type KDAConfig struct {
	NumHeads     int
	HeadDim      int // key and value head size
	ConvKernel   int // short_conv_kernel_size
	FullRankGate bool
	// GateLowerBound is Kimi K3's lower bound of the decay gate (in [-5, 0));
	// nil selects Kimi Linear's softplus gate.
	GateLowerBound *float64
}

// MLAConfig holds the multi-head latent attention fields.
type MLAConfig struct {
	NumHeads      int
	QLoRARank     int // 0: no query LoRA (q_proj)
	KVLoRARank    int
	QKNopeHeadDim int
	QKRopeHeadDim int
	VHeadDim      int
	UseNoPE       bool // mla_use_nope: no rotary embedding anywhere
	OutputGate    bool // mla_use_output_gate
	RopeTheta     float64
	RopeScaling   *RopeScaling
}

// RopeScaling is a YaRN rope_scaling block (DeepSeek-style configs).
type RopeScaling struct {
	Type                          string
	Factor                        float64
	OriginalMaxPositionEmbeddings int
	BetaFast, BetaSlow            float64
	MScale, MScaleAllDim          float64
}

// IndexerConfig holds the Lightning Indexer fields (K3.1 Pro, DeepSeek-V3.2).
type IndexerConfig struct {
	NumHeads int // index_n_heads
	HeadDim  int // index_head_dim
	TopK     int // index_topk
}

// MoEConfig holds the mixture-of-experts fields.
type MoEConfig struct {
	NumExperts       int
	TopK             int
	NumShared        int
	IntermediateSize int // per expert; shared experts use IntermediateSize*NumShared
	// LatentSize is routed_expert_hidden_size (K3 latent MoE); 0 means the
	// experts work at the hidden width.
	LatentSize    int
	LatentNorm    bool
	Renormalize   bool
	ScalingFactor float64
	NumGroups     int
	TopKGroup     int
	FirstKDense   int
	LayerFreq     int
	ScoringFunc   string
	TopKMethod    string
}

// IsMoELayer reports whether layer l (0-based) has a MoE feed-forward.
func (c *Config) IsMoELayer(l int) bool {
	m := c.MoE
	return m != nil && l >= m.FirstKDense && l%m.LayerFreq == 0
}

// Load reads and validates dir/config.json.
func Load(dir string) (*Config, error) {
	path := filepath.Join(dir, "config.json")
	if st, err := os.Stat(path); err == nil && st.Size() > MaxFileSize {
		return nil, fmt.Errorf("%s: config: %w: %d bytes, more than the %d k3 reads", path, ErrInvalid, st.Size(), MaxFileSize)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

type rawLinear struct {
	KDALayers      []int    `json:"kda_layers"`
	FullAttnLayers []int    `json:"full_attn_layers"`
	NumHeads       *int     `json:"num_heads"`
	HeadDim        *int     `json:"head_dim"`
	ConvKernel     *int     `json:"short_conv_kernel_size"`
	FullRankGate   *bool    `json:"use_full_rank_gate"`
	GateLowerBound *float64 `json:"gate_lower_bound"`
}

type rawText struct {
	ModelType        string          `json:"model_type"`
	VocabSize        *int            `json:"vocab_size"`
	HiddenSize       *int            `json:"hidden_size"`
	IntermediateSize *int            `json:"intermediate_size"`
	NumLayers        *int            `json:"num_hidden_layers"`
	NumHeads         *int            `json:"num_attention_heads"`
	HiddenAct        *string         `json:"hidden_act"`
	SiTUBeta         *float64        `json:"activation_situ_beta"`
	SiTULinearBeta   *float64        `json:"activation_situ_linear_beta"`
	RMSNormEps       *float64        `json:"rms_norm_eps"`
	Tie              *bool           `json:"tie_word_embeddings"`
	MaxPos           *int            `json:"max_position_embeddings"`
	BOS              *int            `json:"bos_token_id"`
	EOS              json.RawMessage `json:"eos_token_id"`
	QLoRA            *int            `json:"q_lora_rank"`
	KVLoRA           *int            `json:"kv_lora_rank"`
	QKNope           *int            `json:"qk_nope_head_dim"`
	QKRope           *int            `json:"qk_rope_head_dim"`
	VHead            *int            `json:"v_head_dim"`
	UseNoPE          *bool           `json:"mla_use_nope"`
	OutputGate       *bool           `json:"mla_use_output_gate"`
	RopeTheta        *float64        `json:"rope_theta"`
	RopeScaling      *rawRopeScaling `json:"rope_scaling"`
	IndexTopK        *int            `json:"index_topk"`
	IndexHeads       *int            `json:"index_n_heads"`
	IndexDim         *int            `json:"index_head_dim"`
	NumExperts       *int            `json:"num_experts"`
	NRoutedExperts   *int            `json:"n_routed_experts"`
	ExpertsPerToken  *int            `json:"num_experts_per_token"`
	ExpertsPerTok    *int            `json:"num_experts_per_tok"`
	NumShared        *int            `json:"num_shared_experts"`
	NShared          *int            `json:"n_shared_experts"`
	MoEInter         *int            `json:"moe_intermediate_size"`
	LatentSize       *int            `json:"routed_expert_hidden_size"`
	LatentNorm       *bool           `json:"latent_moe_use_norm"`
	Renorm           *bool           `json:"moe_renormalize"`
	NormTopKProb     *bool           `json:"norm_topk_prob"`
	ScalingFactor    *float64        `json:"routed_scaling_factor"`
	NumGroups        *int            `json:"num_expert_group"`
	NGroup           *int            `json:"n_group"`
	TopKGroup        *int            `json:"topk_group"`
	FirstKDense      *int            `json:"first_k_dense_replace"`
	LayerFreq        *int            `json:"moe_layer_freq"`
	RouterAct        *string         `json:"moe_router_activation_func"`
	ScoringFunc      *string         `json:"scoring_func"`
	TopKMethod       *string         `json:"topk_method"`
	AttnResBlock     *int            `json:"attn_res_block_size"`
	Linear           *rawLinear      `json:"linear_attn_config"`
	Draft            *rawDraft       `json:"dspark_config"`
}

type rawDraft struct {
	TargetLayers     []int   `json:"target_layers"`
	BlockSize        *int    `json:"block_size"`
	MarkovRank       *int    `json:"markov_rank"`
	NumLayers        *int    `json:"num_layers"`
	IntermediateSize *int    `json:"intermediate_size"`
	TensorPrefix     *string `json:"tensor_prefix"`
}

type rawRopeScaling struct {
	Type         string   `json:"type"`
	RopeType     string   `json:"rope_type"`
	Factor       *float64 `json:"factor"`
	OrigMax      *int     `json:"original_max_position_embeddings"`
	BetaFast     *float64 `json:"beta_fast"`
	BetaSlow     *float64 `json:"beta_slow"`
	MScale       *float64 `json:"mscale"`
	MScaleAllDim *float64 `json:"mscale_all_dim"`
}

// Parse decodes and validates a config.json. Model fields are read from
// text_config when present, else from the top level.
func Parse(data []byte) (*Config, error) {
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("config: %w: %d bytes, more than the %d k3 reads", ErrInvalid, len(data), MaxFileSize)
	}
	var outer struct {
		ModelType     string          `json:"model_type"`
		Architectures []string        `json:"architectures"`
		TextConfig    json.RawMessage `json:"text_config"`
		VisionConfig  json.RawMessage `json:"vision_config"`
	}
	if err := json.Unmarshal(data, &outer); err != nil {
		return nil, fmt.Errorf("config: %w: %v", ErrInvalid, err)
	}
	text := data
	if present(outer.TextConfig) {
		text = outer.TextConfig
	}
	var r rawText
	if err := json.Unmarshal(text, &r); err != nil {
		return nil, fmt.Errorf("config: %w: %v", ErrInvalid, err)
	}
	c := &Config{ModelType: outer.ModelType, Vision: present(outer.VisionConfig)}
	if c.ModelType == "" {
		c.ModelType = r.ModelType
	}
	if len(outer.Architectures) > 0 {
		c.Architecture = outer.Architectures[0]
	}
	if err := c.fill(&r); err != nil {
		return nil, err
	}
	return c, nil
}

// present reports whether a JSON field was given a value other than null.
func present(v json.RawMessage) bool {
	return len(v) > 0 && !bytes.Equal(bytes.TrimSpace(v), []byte("null"))
}

func fieldErr(field string, value any, format string, args ...any) error {
	return fmt.Errorf("config: %w: field %s = %v: %s", ErrInvalid, field, value, fmt.Sprintf(format, args...))
}

func missing(field string) error {
	return fmt.Errorf("config: %w: field %s is required", ErrInvalid, field)
}

// Bounds on sizes, far above any released model, so that a corrupt or
// hostile config is an error before anything sized by it is allocated.
const (
	// MaxDim bounds every width, head count, vocabulary and expert count.
	MaxDim = 1 << 24
	// MaxLayers bounds num_hidden_layers.
	MaxLayers = 1 << 12
	// MaxPositions bounds max_position_embeddings.
	MaxPositions = 1 << 30
	// MaxParams bounds the parameter count the sizes imply together.
	MaxParams = 1 << 43
	// MaxFileSize bounds config.json itself (a real one is a few KB).
	MaxFileSize = 1 << 20
)

func positive(field string, p *int) (int, error) {
	return positiveBelow(field, p, MaxDim)
}

func positiveBelow(field string, p *int, limit int) (int, error) {
	if p == nil {
		return 0, missing(field)
	}
	if *p <= 0 {
		return 0, fieldErr(field, *p, "must be positive")
	}
	if *p > limit {
		return 0, fieldErr(field, *p, "larger than %d, the most k3 accepts", limit)
	}
	return *p, nil
}

func or[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

func firstSet[T any](ps ...*T) *T {
	for _, p := range ps {
		if p != nil {
			return p
		}
	}
	return nil
}

func (c *Config) fill(r *rawText) error {
	var err error
	if c.VocabSize, err = positive("vocab_size", r.VocabSize); err != nil {
		return err
	}
	if c.HiddenSize, err = positive("hidden_size", r.HiddenSize); err != nil {
		return err
	}
	if c.NumLayers, err = positiveBelow("num_hidden_layers", r.NumLayers, MaxLayers); err != nil {
		return err
	}
	if c.IntermediateSize, err = positive("intermediate_size", r.IntermediateSize); err != nil {
		return err
	}
	c.RMSNormEps = or(r.RMSNormEps, 1e-6)
	if !(c.RMSNormEps > 0) {
		return fieldErr("rms_norm_eps", c.RMSNormEps, "must be positive")
	}
	c.HiddenAct = or(r.HiddenAct, "silu")
	switch c.HiddenAct {
	case "silu":
	case "situ":
		c.SiTUBeta = or(r.SiTUBeta, 0)
		if !(c.SiTUBeta > 0) {
			return fieldErr("activation_situ_beta", c.SiTUBeta, "must be positive for hidden_act situ")
		}
		c.SiTULinearBeta = or(r.SiTULinearBeta, 0)
		if c.SiTULinearBeta < 0 {
			return fieldErr("activation_situ_linear_beta", c.SiTULinearBeta, "must be positive or null")
		}
	default:
		return fieldErr("hidden_act", c.HiddenAct, `want "silu" or "situ"`)
	}
	c.TieWordEmbeddings = or(r.Tie, false)
	if c.MaxPositionEmbeddings, err = positiveBelow("max_position_embeddings", r.MaxPos, MaxPositions); err != nil {
		return err
	}
	c.BOSTokenID = or(r.BOS, 0)
	if len(r.EOS) > 0 && string(r.EOS) != "null" {
		var one int
		if json.Unmarshal(r.EOS, &one) == nil {
			c.EOSTokenIDs = []int{one}
		} else if err := json.Unmarshal(r.EOS, &c.EOSTokenIDs); err != nil {
			return fieldErr("eos_token_id", string(r.EOS), "want an integer or a list of integers")
		}
	}
	for _, id := range append([]int{c.BOSTokenID}, c.EOSTokenIDs...) {
		if id < 0 || id >= c.VocabSize {
			return fieldErr("bos_token_id/eos_token_id", id, "outside the vocabulary 0..%d", c.VocabSize-1)
		}
	}
	if err := c.fillLayers(r); err != nil {
		return err
	}
	if err := c.fillMLA(r); err != nil {
		return err
	}
	if err := c.fillMoE(r); err != nil {
		return err
	}
	if r.AttnResBlock != nil {
		if c.AttnResBlockSize, err = positiveBelow("attn_res_block_size", r.AttnResBlock, MaxLayers); err != nil {
			return err
		}
	}
	if r.Draft != nil {
		if c.Draft, err = c.fillDraft(r.Draft); err != nil {
			return err
		}
	}
	if n := c.numParams(); n > MaxParams {
		return fmt.Errorf("config: %w: the sizes imply %.3g parameters, more than the %.3g k3 accepts", ErrInvalid, n, float64(MaxParams))
	}
	return nil
}

// MaxDraftBlock bounds dspark_config.block_size.
const MaxDraftBlock = 64

func (c *Config) fillDraft(r *rawDraft) (*DraftConfig, error) {
	d := &DraftConfig{TensorPrefix: or(r.TensorPrefix, "dspark.")}
	var err error
	if len(r.TargetLayers) == 0 {
		return nil, missing("dspark_config.target_layers")
	}
	for _, l := range r.TargetLayers {
		if l < 0 || l >= c.NumLayers {
			return nil, fieldErr("dspark_config.target_layers", l, "outside 0..%d (the list is 0-based)", c.NumLayers-1)
		}
	}
	d.TargetLayers = append([]int(nil), r.TargetLayers...)
	if d.BlockSize, err = positiveBelow("dspark_config.block_size", r.BlockSize, MaxDraftBlock); err != nil {
		return nil, err
	}
	if d.MarkovRank, err = positive("dspark_config.markov_rank", r.MarkovRank); err != nil {
		return nil, err
	}
	if d.NumLayers, err = positiveBelow("dspark_config.num_layers", r.NumLayers, MaxLayers); err != nil {
		return nil, err
	}
	if d.IntermediateSize, err = positive("dspark_config.intermediate_size", r.IntermediateSize); err != nil {
		return nil, err
	}
	if !strings.HasSuffix(d.TensorPrefix, ".") {
		return nil, fieldErr("dspark_config.tensor_prefix", d.TensorPrefix, `must end in "."`)
	}
	return d, nil
}

func (c *Config) fillLayers(r *rawText) error {
	c.Layers = make([]LayerKind, c.NumLayers)
	full := MLA
	if r.IndexTopK != nil {
		full = DSA
	}
	if r.Linear == nil {
		// DeepSeek-style: every layer is full attention.
		for i := range c.Layers {
			c.Layers[i] = full
		}
		return nil
	}
	lin := r.Linear
	for i := range c.Layers {
		c.Layers[i] = full
	}
	seen := map[int]bool{}
	for _, l := range lin.KDALayers {
		if l < 1 || l > c.NumLayers {
			return fieldErr("linear_attn_config.kda_layers", l, "outside 1..%d (the list is 1-based, num_hidden_layers = %d)", c.NumLayers, c.NumLayers)
		}
		if seen[l] {
			return fieldErr("linear_attn_config.kda_layers", l, "listed twice")
		}
		seen[l] = true
		c.Layers[l-1] = KDA
	}
	if lin.FullAttnLayers != nil {
		full := map[int]bool{}
		for _, l := range lin.FullAttnLayers {
			if l < 1 || l > c.NumLayers {
				return fieldErr("linear_attn_config.full_attn_layers", l, "outside 1..%d", c.NumLayers)
			}
			if seen[l] {
				return fieldErr("linear_attn_config.full_attn_layers", l, "also listed in kda_layers")
			}
			if full[l] {
				return fieldErr("linear_attn_config.full_attn_layers", l, "listed twice")
			}
			full[l] = true
		}
		if len(lin.FullAttnLayers)+len(lin.KDALayers) != c.NumLayers {
			return fieldErr("linear_attn_config.full_attn_layers", lin.FullAttnLayers, "with kda_layers it must cover all %d layers", c.NumLayers)
		}
	}
	if len(lin.KDALayers) == 0 {
		return nil
	}
	var err error
	k := &c.KDA
	if k.NumHeads, err = positive("linear_attn_config.num_heads", lin.NumHeads); err != nil {
		return err
	}
	if k.HeadDim, err = positive("linear_attn_config.head_dim", lin.HeadDim); err != nil {
		return err
	}
	if k.ConvKernel, err = positive("linear_attn_config.short_conv_kernel_size", lin.ConvKernel); err != nil {
		return err
	}
	k.FullRankGate = or(lin.FullRankGate, false)
	if lb := lin.GateLowerBound; lb != nil {
		if !(*lb < 0 && *lb >= -5) {
			return fieldErr("linear_attn_config.gate_lower_bound", *lb, "must be in [-5, 0)")
		}
		v := *lb
		k.GateLowerBound = &v
	}
	return nil
}

func (c *Config) hasFull() bool {
	for _, k := range c.Layers {
		if k != KDA {
			return true
		}
	}
	return false
}

func (c *Config) fillMLA(r *rawText) error {
	if !c.hasFull() {
		return nil
	}
	var err error
	m := &c.MLA
	if m.NumHeads, err = positive("num_attention_heads", r.NumHeads); err != nil {
		return err
	}
	if r.QLoRA != nil {
		if m.QLoRARank, err = positive("q_lora_rank", r.QLoRA); err != nil {
			return err
		}
	}
	if m.KVLoRARank, err = positive("kv_lora_rank", r.KVLoRA); err != nil {
		return err
	}
	if m.QKNopeHeadDim, err = positive("qk_nope_head_dim", r.QKNope); err != nil {
		return err
	}
	if r.QKRope == nil {
		return missing("qk_rope_head_dim")
	}
	if *r.QKRope < 0 || *r.QKRope%2 != 0 {
		return fieldErr("qk_rope_head_dim", *r.QKRope, "must be even and non-negative")
	}
	m.QKRopeHeadDim = *r.QKRope
	if m.VHeadDim, err = positive("v_head_dim", r.VHead); err != nil {
		return err
	}
	m.UseNoPE = or(r.UseNoPE, false)
	m.OutputGate = or(r.OutputGate, false)
	m.RopeTheta = or(r.RopeTheta, 10000)
	if !m.UseNoPE && !(m.RopeTheta > 0) {
		return fieldErr("rope_theta", m.RopeTheta, "must be positive")
	}
	if rs := r.RopeScaling; rs != nil {
		typ := rs.Type
		if typ == "" {
			typ = rs.RopeType
		}
		s := &RopeScaling{Type: typ, Factor: or(rs.Factor, 1), OriginalMaxPositionEmbeddings: or(rs.OrigMax, 0),
			BetaFast: or(rs.BetaFast, 32), BetaSlow: or(rs.BetaSlow, 1), MScale: or(rs.MScale, 1), MScaleAllDim: or(rs.MScaleAllDim, 0)}
		if typ != "yarn" {
			return fieldErr("rope_scaling.type", typ, `only "yarn" is supported`)
		}
		if !(s.Factor >= 1) || s.OriginalMaxPositionEmbeddings <= 0 {
			return fieldErr("rope_scaling", fmt.Sprintf("factor %v, original_max_position_embeddings %d", s.Factor, s.OriginalMaxPositionEmbeddings), "need factor >= 1 and a positive original length")
		}
		m.RopeScaling = s
	}
	if r.IndexTopK != nil {
		ix := &IndexerConfig{}
		if ix.TopK, err = positive("index_topk", r.IndexTopK); err != nil {
			return err
		}
		if ix.NumHeads, err = positive("index_n_heads", r.IndexHeads); err != nil {
			return err
		}
		if ix.HeadDim, err = positive("index_head_dim", r.IndexDim); err != nil {
			return err
		}
		if !m.UseNoPE && ix.HeadDim < m.QKRopeHeadDim {
			return fieldErr("index_head_dim", ix.HeadDim, "smaller than qk_rope_head_dim %d, which the indexer rotates", m.QKRopeHeadDim)
		}
		c.Indexer = ix
	}
	return nil
}

func (c *Config) fillMoE(r *rawText) error {
	ne := firstSet(r.NumExperts, r.NRoutedExperts)
	if ne == nil {
		return nil
	}
	m := &MoEConfig{}
	var err error
	if m.NumExperts, err = positive("num_experts", ne); err != nil {
		return err
	}
	if m.TopK, err = positive("num_experts_per_token", firstSet(r.ExpertsPerToken, r.ExpertsPerTok)); err != nil {
		return err
	}
	m.NumShared = or(firstSet(r.NumShared, r.NShared), 0)
	if m.NumShared < 0 || m.NumShared > MaxDim {
		return fieldErr("num_shared_experts", m.NumShared, "must be in 0..%d", MaxDim)
	}
	if m.IntermediateSize, err = positive("moe_intermediate_size", r.MoEInter); err != nil {
		return err
	}
	if r.LatentSize != nil {
		if m.LatentSize, err = positive("routed_expert_hidden_size", r.LatentSize); err != nil {
			return err
		}
	}
	m.LatentNorm = or(r.LatentNorm, false)
	m.Renormalize = or(firstSet(r.Renorm, r.NormTopKProb), true)
	m.ScalingFactor = or(r.ScalingFactor, 1)
	if !(m.ScalingFactor > 0) {
		return fieldErr("routed_scaling_factor", m.ScalingFactor, "must be positive")
	}
	m.NumGroups = or(firstSet(r.NumGroups, r.NGroup), 1)
	m.TopKGroup = or(r.TopKGroup, m.NumGroups)
	m.FirstKDense = or(r.FirstKDense, 0)
	m.LayerFreq = or(r.LayerFreq, 1)
	m.ScoringFunc = or(firstSet(r.RouterAct, r.ScoringFunc), "sigmoid")
	m.TopKMethod = or(r.TopKMethod, "noaux_tc")
	switch {
	case m.TopK > m.NumExperts:
		return fieldErr("num_experts_per_token", m.TopK, "larger than num_experts %d", m.NumExperts)
	case m.NumGroups <= 0:
		return fieldErr("num_expert_group", m.NumGroups, "must be positive")
	case m.NumExperts%m.NumGroups != 0:
		return fieldErr("num_expert_group", m.NumGroups, "does not divide num_experts %d", m.NumExperts)
	case m.TopKGroup <= 0 || m.TopKGroup > m.NumGroups:
		return fieldErr("topk_group", m.TopKGroup, "must be in 1..num_expert_group (%d)", m.NumGroups)
	case m.TopK > m.TopKGroup*(m.NumExperts/m.NumGroups):
		return fieldErr("num_experts_per_token", m.TopK, "more than the %d experts in topk_group groups", m.TopKGroup*(m.NumExperts/m.NumGroups))
	case m.NumGroups > 1 && m.NumExperts/m.NumGroups < 2:
		return fieldErr("num_expert_group", m.NumGroups, "groups need at least 2 experts (group score = sum of the top 2)")
	case m.FirstKDense < 0:
		return fieldErr("first_k_dense_replace", m.FirstKDense, "must not be negative")
	case m.LayerFreq <= 0:
		return fieldErr("moe_layer_freq", m.LayerFreq, "must be positive")
	case m.ScoringFunc != "sigmoid":
		return fieldErr("moe_router_activation_func", m.ScoringFunc, `only "sigmoid" is supported`)
	case m.TopKMethod != "noaux_tc":
		return fieldErr("topk_method", m.TopKMethod, `only "noaux_tc" is supported`)
	}
	c.MoE = m
	return nil
}

// NumParams counts the parameters the config implies (embedding and lm_head
// included once each; an untied lm_head counts separately).
func (c *Config) NumParams() int64 { return int64(c.numParams()) }

// numParams counts in float64, exact below 2^53, so that validation can
// bound the count of sizes whose integer product would overflow.
func (c *Config) numParams() float64 {
	d := float64(c.HiddenSize)
	n := float64(c.VocabSize) * d
	if !c.TieWordEmbeddings {
		n *= 2
	}
	n += d // final norm
	for l, kind := range c.Layers {
		n += 2 * d // pre-norms
		if c.AttnResBlockSize > 0 {
			n += 4 * d
		}
		switch kind {
		case KDA:
			k := c.KDA
			hd := float64(k.NumHeads * k.HeadDim)
			n += 3*hd*d + 3*hd*float64(k.ConvKernel) + float64(k.HeadDim)*d + hd*float64(k.HeadDim) + hd + float64(k.NumHeads) + float64(k.NumHeads)*d + float64(k.HeadDim) + d*hd
			if k.FullRankGate {
				n += hd * d
			} else {
				n += float64(k.HeadDim)*d + hd*float64(k.HeadDim)
			}
		default:
			m := c.MLA
			h := float64(m.NumHeads)
			qk := float64(m.QKNopeHeadDim + m.QKRopeHeadDim)
			if m.QLoRARank > 0 {
				n += float64(m.QLoRARank)*d + float64(m.QLoRARank) + h*qk*float64(m.QLoRARank)
			} else {
				n += h * qk * d
			}
			n += float64(m.KVLoRARank+m.QKRopeHeadDim)*d + float64(m.KVLoRARank) + h*float64(m.QKNopeHeadDim+m.VHeadDim)*float64(m.KVLoRARank)
			n += d * h * float64(m.VHeadDim)
			if m.OutputGate {
				n += h * float64(m.VHeadDim) * d
			}
			if kind == DSA {
				ix := c.Indexer
				qin := d
				if m.QLoRARank > 0 {
					qin = float64(m.QLoRARank)
				}
				n += float64(ix.NumHeads*ix.HeadDim)*qin + float64(ix.HeadDim)*d + 2*float64(ix.HeadDim) + float64(ix.NumHeads)*d
			}
		}
		if c.IsMoELayer(l) {
			m := c.MoE
			in := d
			if m.LatentSize > 0 {
				in = float64(m.LatentSize)
				n += 2*in*d + in
			}
			n += float64(m.NumExperts)*d + float64(m.NumExperts)
			n += float64(m.NumExperts) * 3 * in * float64(m.IntermediateSize)
			n += 3 * d * float64(m.IntermediateSize*m.NumShared)
		} else {
			n += 3 * d * float64(c.IntermediateSize)
		}
	}
	if c.AttnResBlockSize > 0 {
		n += 2 * d
	}
	return n
}
