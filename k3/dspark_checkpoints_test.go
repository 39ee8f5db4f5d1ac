package k3

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/internal/safetensors"
)

// editConfig reads the config.json of checkpoint dir, lets edit change its
// text config (the whole file where it has no text_config) and writes it
// to out.
func editConfig(t *testing.T, dir, out string, edit func(tc map[string]any)) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, json.Unmarshal(raw, &cfg))
	tc := cfg
	if c, ok := cfg["text_config"].(map[string]any); ok {
		tc = c
	}
	edit(tc)
	raw, err = json.Marshal(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(out, "config.json"), raw, 0o644))
}

// withDraftModule writes into a new directory a copy of checkpoint dir
// (its shards linked, not copied) with a DSpark draft module of block
// size block added: random weights, except a Markov head that favours
// the token after the previous one in text (a bigram table), so drafts
// are kept wherever the model's greedy text follows it.
func withDraftModule(t *testing.T, dir string, block int, text []int32) string {
	t.Helper()
	out := t.TempDir()
	var d, v int
	const inter = 16
	editConfig(t, dir, out, func(tc map[string]any) {
		layers := int(tc["num_hidden_layers"].(float64))
		d, v = int(tc["hidden_size"].(float64)), int(tc["vocab_size"].(float64))
		tc["dspark_config"] = map[string]any{"target_layers": []int{0, layers - 1}, "block_size": block,
			"markov_rank": v, "num_layers": 1, "intermediate_size": inter, "tensor_prefix": "dspark."}
	})

	// The model's tensors, by shard, and their naming prefix.
	weightMap := map[string]string{}
	if idx, err := os.ReadFile(filepath.Join(dir, safetensors.IndexName)); err == nil {
		var ix struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		require.NoError(t, json.Unmarshal(idx, &ix))
		weightMap = ix.WeightMap
	} else {
		f, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
		require.NoError(t, err)
		for _, ti := range f.Tensors() {
			weightMap[ti.Name] = "model.safetensors"
		}
		require.NoError(t, f.Close())
	}
	prefix := ""
	for name := range weightMap {
		if strings.HasPrefix(name, "language_model.") {
			prefix = "language_model."
		}
	}
	for _, shard := range weightMap {
		link := filepath.Join(out, shard)
		if _, err := os.Lstat(link); err != nil {
			abs, err := filepath.Abs(filepath.Join(dir, shard))
			require.NoError(t, err)
			require.NoError(t, os.Symlink(abs, link))
		}
	}

	r := rand.New(rand.NewPCG(uint64(d), uint64(v)))
	rnd := func(n int, scale float32) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64()) * scale
		}
		return x
	}
	ones := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = 1
		}
		return x
	}
	eye := make([]float32, v*v)
	for i := range v {
		eye[i*v+i] = 1
	}
	// markov_out[b]·markov_in[a] = markov_out[b][a]: the logit of b after a.
	bigram := make([]float32, v*v)
	for i := 1; i < len(text); i++ {
		bigram[int(text[i])*v+int(text[i-1])] = 50
	}
	p := prefix + "dspark."
	tensors := []safetensors.Tensor{
		safetensors.F32Tensor(p+"fc.weight", []int{d, 2 * d}, rnd(2*d*d, 0.1)),
		safetensors.F32Tensor(p+"fc_norm.weight", []int{d}, ones(d)),
		safetensors.F32Tensor(p+"norm.weight", []int{d}, ones(d)),
		safetensors.F32Tensor(p+"pos_embed", []int{block, d}, rnd(block*d, 0.1)),
		safetensors.F32Tensor(p+"layers.0.norm.weight", []int{d}, ones(d)),
		safetensors.F32Tensor(p+"layers.0.gate_proj.weight", []int{inter, d}, rnd(inter*d, 0.1)),
		safetensors.F32Tensor(p+"layers.0.up_proj.weight", []int{inter, d}, rnd(inter*d, 0.1)),
		safetensors.F32Tensor(p+"layers.0.down_proj.weight", []int{d, inter}, rnd(d*inter, 0.1)),
		safetensors.F32Tensor(p+"markov_in.weight", []int{v, v}, eye),
		safetensors.F32Tensor(p+"markov_out.weight", []int{v, v}, bigram),
		safetensors.F32Tensor(p+"confidence.weight", []int{1, d + v}, rnd(d+v, 0.1)),
		safetensors.F32Tensor(p+"confidence.bias", []int{1}, []float32{0}),
	}
	require.NoError(t, safetensors.WriteFile(filepath.Join(out, "draft.safetensors"), tensors, nil))
	for _, ts := range tensors {
		weightMap[ts.Name] = "draft.safetensors"
	}
	raw, err := json.Marshal(map[string]any{"metadata": map[string]any{}, "weight_map": weightMap})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(out, safetensors.IndexName), raw, 0o644))
	return out
}

// TestDSparkOnCheckpoints: greedy speculation with a DSpark drafter (a
// draft module of block 8 added to each testdata checkpoint, its Markov
// head a bigram table of the plain greedy text, so many drafts are kept
// and some are not) gives plain greedy decoding's tokens, and leaves the
// session with its tokens, logits and KDA states, at every depth from 1
// to 8.
func TestDSparkOnCheckpoints(t *testing.T) {
	ctx := context.Background()
	dirs, err := filepath.Glob("../testdata/model/*/config.json")
	require.NoError(t, err)
	require.NotEmpty(t, dirs)
	depths := []int{1, 2, 3, 4, 5, 6, 7, 8}
	if raceEnabled || testing.Short() {
		depths = []int{1, 8}
	}
	for _, c := range dirs {
		t.Run(filepath.Base(filepath.Dir(c)), func(t *testing.T) {
			opts := []GenerateOption{WithMaxTokens(32), WithoutDefaultStops()}
			base, err := Load(ctx, filepath.Dir(c))
			require.NoError(t, err)
			prompt := base.Encode("the cat sat on the mat, the cat sat on")
			bs, _ := base.NewSession()
			text, _ := genIDs(t, bs, prompt, opts...)
			bs.Close()
			base.Close()
			// Half the greedy text: drafts past it go wrong.
			m, err := Load(ctx, withDraftModule(t, filepath.Dir(c), 8, append(prompt[len(prompt)-1:], text[:len(text)/2]...)), WithRollback(8))
			require.NoError(t, err)
			defer m.Close()
			plain, _ := m.NewSession()
			defer plain.Close()
			want, _ := genIDs(t, plain, prompt, opts...)
			require.Equal(t, text, want, "the draft module changed the model")
			drafted, accepted := 0, 0
			for _, depth := range depths {
				ds, err := m.NewDSpark()
				require.NoError(t, err)
				s, _ := m.NewSession()
				got, u := genIDs(t, s, prompt, append(opts, WithSpeculation(ds, depth))...)
				require.Equal(t, want, got, "depth %d", depth)
				require.Equal(t, plain.Tokens(), s.Tokens(), "depth %d: the session's tokens", depth)
				require.Equal(t, plain.Logits(), s.Logits(), "depth %d: the session's logits", depth)
				require.Equal(t, kdaStates(t, plain), kdaStates(t, s), "depth %d: KDA states", depth)
				drafted, accepted = drafted+u.DraftTokens, accepted+u.AcceptedTokens
				s.Close()
				ds.Close()
			}
			t.Logf("%d drafts, %d accepted", drafted, accepted)
			assert.Positive(t, accepted, "no draft was ever accepted: the test did not exercise acceptance")
			assert.Less(t, accepted, drafted, "every draft was accepted: the test did not exercise rejection")
		})
	}
}

// TestDSparkRepeatedTargetLayer: a draft module may list a layer twice
// (the training framework concatenates the listed layers' inputs as
// given); each of its slots then holds that layer's MLP-sublayer input.
func TestDSparkRepeatedTargetLayer(t *testing.T) {
	ctx := context.Background()
	dir := withDraftModule(t, tinyDir, 4, []int32{1, 2, 3})
	m, err := Load(ctx, dir)
	require.NoError(t, err)
	defer m.Close()
	layers := m.Config.NumLayers
	require.Equal(t, []int{0, layers - 1}, m.Config.Draft.TargetLayers)

	// The same module reading layer 0 twice.
	editConfig(t, dir, dir, func(tc map[string]any) {
		tc["dspark_config"].(map[string]any)["target_layers"] = []int{0, 0}
	})
	twice, err := Load(ctx, dir)
	require.NoError(t, err)
	defer twice.Close()
	require.Equal(t, []int{0, 0}, twice.Config.Draft.TargetLayers)

	prompt := []int32{5, 9, 2, 7, 7, 1, 30, 4}
	a, err := m.NewSession()
	require.NoError(t, err)
	defer a.Close()
	b, err := twice.NewSession()
	require.NoError(t, err)
	defer b.Close()
	_, err = a.Forward(ctx, prompt)
	require.NoError(t, err)
	_, err = b.Forward(ctx, prompt)
	require.NoError(t, err)
	require.Equal(t, a.tapsRows, b.tapsRows)
	require.Len(t, b.taps, 2)
	assert.NotEqual(t, make([]float32, len(a.taps[0])), a.taps[0], "layer 0's input is not all zeros")
	assert.Equal(t, a.taps[0], b.taps[0], "slot 0: layer 0's input")
	assert.Equal(t, a.taps[0], b.taps[1], "slot 1: layer 0's input again")
}
