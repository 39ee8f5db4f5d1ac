package k3

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/internal/safetensors"
	"k3/internal/tinymodel"
)

// tinyFS copies the embedded checkpoint into a MapFS that tests mutate.
func tinyFS(t testing.TB) fstest.MapFS {
	t.Helper()
	out := fstest.MapFS{}
	src := tinymodel.Random()
	entries, err := fs.ReadDir(src, ".")
	require.NoError(t, err)
	for _, e := range entries {
		b, err := fs.ReadFile(src, e.Name())
		require.NoError(t, err)
		out[e.Name()] = &fstest.MapFile{Data: b}
	}
	return out
}

// tinyTensors returns the embedded checkpoint's tensors (copies).
func tinyTensors(t testing.TB) []safetensors.Tensor {
	t.Helper()
	b, err := fs.ReadFile(tinymodel.Random(), "model.safetensors")
	require.NoError(t, err)
	f, err := safetensors.FromBytes("tiny", b)
	require.NoError(t, err)
	var ts []safetensors.Tensor
	for _, ti := range f.Tensors() {
		data, _, err := f.Bytes(ti.Name)
		require.NoError(t, err)
		ts = append(ts, safetensors.Tensor{Name: ti.Name, DType: ti.DType, Shape: append([]int(nil), ti.Shape...), Data: append([]byte(nil), data...)})
	}
	return ts
}

func encodeTensors(t testing.TB, ts []safetensors.Tensor) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "w.safetensors")
	require.NoError(t, safetensors.WriteFile(path, ts, nil))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// rawSafetensors builds a file from a header written by hand.
func rawSafetensors(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	return append(append(b, header...), data...)
}

// TestCheckpointErrors: every problem with a checkpoint's files wraps
// ErrCheckpoint and names the file and, where there is one, the tensor.
func TestCheckpointErrors(t *testing.T) {
	ts := tinyTensors(t)
	find := func(suffix string) int {
		for i, x := range ts {
			if strings.HasSuffix(x.Name, suffix) {
				return i
			}
		}
		t.Fatalf("no tensor %s", suffix)
		return -1
	}
	embed := find("model.embed_tokens.weight")
	norm := find("model.norm.weight")
	with := func(edit func(ts []safetensors.Tensor) []safetensors.Tensor) []byte {
		c := append([]safetensors.Tensor(nil), ts...)
		return encodeTensors(t, edit(c))
	}
	// 256 single bytes and 300 pairs: 556 ranks for a vocabulary of 512.
	var ranks strings.Builder
	for i := range 256 {
		fmt.Fprintf(&ranks, "%s %d\n", base64.StdEncoding.EncodeToString([]byte{byte(i)}), i)
	}
	for i := range 300 {
		fmt.Fprintf(&ranks, "%s %d\n", base64.StdEncoding.EncodeToString([]byte{'a' + byte(i/26%26), 'a' + byte(i%26), byte(i / 676)}), 256+i)
	}

	cases := []struct {
		name  string
		files map[string][]byte // replaced files; nil data removes a file
		want  []string          // substrings of the message
	}{
		{"mis-shaped tensor", map[string][]byte{"model.safetensors": with(func(c []safetensors.Tensor) []safetensors.Tensor {
			c[embed].Shape = []int{c[embed].Shape[1], c[embed].Shape[0]}
			return c
		})}, []string{ts[embed].Name, "shape", "ck"}},
		{"missing tensor", map[string][]byte{"model.safetensors": with(func(c []safetensors.Tensor) []safetensors.Tensor {
			return append(c[:norm:norm], c[norm+1:]...)
		})}, []string{"missing tensor", ts[norm].Name}},
		{"unexpected tensor", map[string][]byte{"model.safetensors": with(func(c []safetensors.Tensor) []safetensors.Tensor {
			return append(c, safetensors.F32Tensor("language_model.model.layers.0.bogus.weight", []int{1}, []float32{1}))
		})}, []string{"unexpected", "bogus"}},
		{"draft tensors without dspark_config", map[string][]byte{"model.safetensors": with(func(c []safetensors.Tensor) []safetensors.Tensor {
			return append(c, safetensors.F32Tensor("language_model.dspark.fc.weight", []int{1}, []float32{1}))
		})}, []string{"unexpected", "dspark.fc.weight"}},
		{"unusable dtype", map[string][]byte{"model.safetensors": with(func(c []safetensors.Tensor) []safetensors.Tensor {
			c[norm].DType = safetensors.I32
			return c
		})}, []string{ts[norm].Name, "I32"}},
		{"not safetensors", map[string][]byte{"model.safetensors": []byte("this is a text file, not a checkpoint at all\n")}, []string{"ck/model.safetensors", "not a safetensors file"}},
		{"bad header JSON", map[string][]byte{"model.safetensors": rawSafetensors(`{"a": {"dtype": "F32", `, nil)}, []string{"model.safetensors", "unexpected EOF"}},
		{"truncated", map[string][]byte{"model.safetensors": encodeTensors(t, ts)[:400000]}, []string{"model.safetensors", "out of range"}},
		{"overlapping offsets", map[string][]byte{"model.safetensors": rawSafetensors(
			`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, make([]byte, 12))},
			[]string{"model.safetensors", "overlap"}},
		{"reversed offsets", map[string][]byte{"model.safetensors": rawSafetensors(
			`{"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}}`, make([]byte, 12))}, []string{"model.safetensors", `"a"`, "data_offsets"}},
		{"shape overflow", map[string][]byte{"model.safetensors": rawSafetensors(
			`{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}}`, make([]byte, 4))}, []string{"model.safetensors", "overflows"}},
		{"missing shard", map[string][]byte{
			safetensors.IndexName:              []byte(`{"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}}`),
			"model-00001-of-00002.safetensors": encodeTensors(t, ts),
		}, []string{"model-00002-of-00002.safetensors"}},
		{"bad index", map[string][]byte{safetensors.IndexName: []byte(`{"weight_map":`)}, []string{safetensors.IndexName}},
		{"malformed tokenizer_config.json", map[string][]byte{"tokenizer_config.json": []byte(`{"added_tokens_decoder": [`)}, []string{"tokenizer_config.json"}},
		{"malformed tiktoken.model", map[string][]byte{"tiktoken.model": []byte("!!! 0\n")}, []string{"tiktoken.model", "line 1"}},
		{"vocabulary smaller than the tokenizer's", map[string][]byte{"tiktoken.model": []byte(ranks.String()), "tokenizer_config.json": []byte(`{}`)},
			[]string{"config/tokenizer mismatch", "ck/config.json", "vocab_size 512", "ck/tiktoken.model"}},
		{"special token beyond the vocabulary", map[string][]byte{"tokenizer_config.json": []byte(
			`{"tokenizer_class":"K3ByteLevelTokenizer","byte_offset":3,"added_tokens_decoder":{"600":{"content":"<x>","special":true}}}`)},
			[]string{"config/tokenizer mismatch", "ck/config.json", "ck/tokenizer_config.json", "600"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fsys := tinyFS(t)
			for name, data := range tc.files {
				if data == nil {
					delete(fsys, name)
				} else {
					fsys[name] = &fstest.MapFile{Data: data}
				}
			}
			_, err := LoadFS(context.Background(), fsys, "ck")
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrCheckpoint)
			assert.True(t, strings.HasPrefix(err.Error(), "k3: bad checkpoint: "), "message %q", err)
			assert.Equal(t, 1, strings.Count(err.Error(), "bad checkpoint"), "message %q", err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			// Load from a directory says the same.
			dir := t.TempDir()
			for name, f := range fsys {
				require.NoError(t, os.WriteFile(filepath.Join(dir, name), f.Data, 0o644))
			}
			_, err = Load(context.Background(), dir)
			assert.ErrorIs(t, err, ErrCheckpoint, "Load")
		})
	}
	// The untouched files load.
	m, err := LoadFS(context.Background(), tinyFS(t), "ck")
	require.NoError(t, err)
	require.NoError(t, m.Close())
}

// TestProgress: WithProgress counts bytes, rising to the checkpoint's size.
func TestProgress(t *testing.T) {
	var calls [][2]int64
	m, err := LoadFS(context.Background(), tinyFS(t), "ck", WithProgress(func(done, total int64) {
		calls = append(calls, [2]int64{done, total})
	}))
	require.NoError(t, err)
	defer m.Close()
	require.Len(t, calls, m.Config.NumLayers)
	for i, c := range calls {
		assert.Equal(t, m.WeightBytes(), c[1], "total")
		if i > 0 {
			assert.Greater(t, c[0], calls[i-1][0], "call %d", i)
		}
	}
	assert.Equal(t, m.WeightBytes(), calls[len(calls)-1][0], "the last call is complete")
}

// TestVisionTowerLeftUnread: a multimodal checkpoint's vision encoder and
// projector tensors (outside language_model., with vision_config in
// config.json) load as nothing and change nothing; without vision_config
// they are unexpected tensors.
func TestVisionTowerLeftUnread(t *testing.T) {
	ctx := context.Background()
	ts := append(tinyTensors(t),
		safetensors.F32Tensor("vision_tower.encoder.blocks.0.wqkv.weight", []int{6, 2}, make([]float32, 12)),
		safetensors.F32Tensor("mm_projector.proj.0.weight", []int{2, 2}, make([]float32, 4)))
	withVision := tinyFS(t)
	withVision["model.safetensors"] = &fstest.MapFile{Data: encodeTensors(t, ts)}
	cfg := string(withVision["config.json"].Data)
	require.True(t, strings.HasPrefix(cfg, "{"))
	withVision["config.json"] = &fstest.MapFile{Data: []byte(`{"vision_config": {"model_type": "moonvit"},` + cfg[1:])}

	logits := func(fsys fstest.MapFS) []float32 {
		m, err := LoadFS(ctx, fsys, "ck")
		require.NoError(t, err)
		defer m.Close()
		assert.True(t, m.Config.Vision == (fsys["config.json"] != nil && strings.Contains(string(fsys["config.json"].Data), "vision_config")))
		s, err := m.NewSession()
		require.NoError(t, err)
		defer s.Close()
		out, err := s.Forward(ctx, []int32{5, 9, 200, 17})
		require.NoError(t, err)
		return out
	}
	assert.Equal(t, logits(tinyFS(t)), logits(withVision))

	noVision := tinyFS(t)
	noVision["model.safetensors"] = withVision["model.safetensors"]
	_, err := LoadFS(ctx, noVision, "ck")
	require.ErrorIs(t, err, ErrCheckpoint)
	assert.ErrorContains(t, err, "unexpected tensors mm_projector.proj.0.weight, vision_tower.encoder.blocks.0.wqkv.weight")
}

// TestLoadNamesAFile: a checkpoint named by one of its files is an error
// saying so, not a missing config.json under it.
func TestLoadNamesAFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.json")
	require.NoError(t, os.WriteFile(file, []byte("{}"), 0o644))
	_, err := Load(context.Background(), file)
	require.ErrorIs(t, err, ErrCheckpoint)
	assert.ErrorContains(t, err, file+" is a file; want the checkpoint's directory")
}
