package k3

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/internal/safetensors"
)

const tinyDir = "../testdata/model/tiny_k31pro"

func goldenIDs(t *testing.T) (prompt, gen []int32) {
	f, err := safetensors.Open(filepath.Join(tinyDir, "expected.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	prompt, _, _ = f.Int32s("input_ids")
	gen, _, _ = f.Int32s("generated_ids")
	return prompt, gen
}

func load(t *testing.T, opts ...Option) *Model {
	t.Helper()
	m, err := Load(context.Background(), tinyDir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func collect(t *testing.T, seq func(func(Token, error) bool)) []int32 {
	t.Helper()
	var ids []int32
	for tok, err := range seq {
		if err != nil {
			t.Fatal(err)
		}
		if tok.ID >= 0 {
			ids = append(ids, tok.ID)
		}
	}
	return ids
}

func TestGreedyMatchesGolden(t *testing.T) {
	prompt, gen := goldenIDs(t)
	for _, chunk := range []int{256, 7} { // one prefill pass, and many chunks
		m := load(t, WithPrefillChunk(chunk))
		s, err := m.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		got := collect(t, s.GenerateTokens(context.Background(), prompt, WithMaxTokens(len(gen)), WithoutDefaultStops()))
		if !slices.Equal(got, gen) {
			t.Errorf("chunk %d: generated %v, golden %v", chunk, got, gen)
		}
		if s.Len() != len(prompt)+len(gen) {
			t.Errorf("session holds %d tokens, want %d", s.Len(), len(prompt)+len(gen))
		}
	}
}

func TestCloneAndTruncate(t *testing.T) {
	prompt, gen := goldenIDs(t)
	m := load(t)
	ctx := context.Background()
	a, _ := m.NewSession()
	if _, err := a.Forward(ctx, prompt[:20]); err != nil {
		t.Fatal(err)
	}
	b, err := a.Clone()
	if err != nil {
		t.Fatal(err)
	}
	// Both continue identically and independently.
	ra := collect(t, a.GenerateTokens(ctx, prompt[20:], WithMaxTokens(4), WithoutDefaultStops()))
	rb := collect(t, b.GenerateTokens(ctx, prompt[20:], WithMaxTokens(4), WithoutDefaultStops()))
	if !slices.Equal(ra, rb) || !slices.Equal(ra, gen[:4]) {
		t.Errorf("clone diverged: %v vs %v (golden %v)", ra, rb, gen[:4])
	}
	// Truncate back to the prompt and regenerate the same continuation.
	if err := a.Truncate(ctx, len(prompt)); err != nil {
		t.Fatal(err)
	}
	again := collect(t, a.GenerateTokens(ctx, nil, WithMaxTokens(8), WithoutDefaultStops()))
	if !slices.Equal(again, gen) {
		t.Errorf("after truncate: %v, golden %v", again, gen)
	}
}

func TestSamplingReproducible(t *testing.T) {
	m := load(t)
	run := func() []int32 {
		return collect(t, m.Generate(context.Background(), "Hello", WithTemperature(0.9), WithTopP(0.9), WithTopK(50),
			WithSeed(7), WithMaxTokens(12), WithRepetitionPenalty(1.1), WithoutDefaultStops()))
	}
	a, b := run(), run()
	if !slices.Equal(a, b) || len(a) != 12 {
		t.Errorf("same seed gave %v and %v", a, b)
	}
}

func TestStopStrings(t *testing.T) {
	m := load(t)
	var full strings.Builder
	for tok, err := range m.Generate(context.Background(), "abc", WithMaxTokens(30), WithoutDefaultStops()) {
		if err != nil {
			t.Fatal(err)
		}
		full.WriteString(tok.Text)
	}
	text := full.String()
	if len(text) < 4 {
		t.Skipf("generated text %q too short to cut", text)
	}
	stop := text[2:4]
	var cut strings.Builder
	for tok, err := range m.Generate(context.Background(), "abc", WithMaxTokens(30), WithoutDefaultStops(), WithStopStrings(stop)) {
		if err != nil {
			t.Fatal(err)
		}
		cut.WriteString(tok.Text)
	}
	want := text[:strings.Index(text, stop)]
	if cut.String() != want {
		t.Errorf("with stop %q: %q, want %q", stop, cut.String(), want)
	}
}

func TestBadInput(t *testing.T) {
	m := load(t)
	ctx := context.Background()
	s, _ := m.NewSession()
	if _, err := s.Forward(ctx, []int32{1, 99999}); !errors.Is(err, ErrBadToken) {
		t.Errorf("token outside the vocabulary: %v", err)
	}
	if _, err := s.Forward(ctx, nil); !errors.Is(err, ErrEmptyPrompt) {
		t.Errorf("empty prompt: %v", err)
	}
	for _, opt := range []GenerateOption{WithTemperature(-1), WithTopP(0), WithTopP(1.5), WithMaxTokens(0), WithStopStrings("")} {
		for _, err := range s.Generate(ctx, "x", opt) {
			if !errors.Is(err, ErrInvalidOption) {
				t.Errorf("invalid option accepted: %v", err)
			}
			break
		}
	}
	long := make([]int32, m.Config.MaxPositionEmbeddings+1)
	if _, err := s.Forward(ctx, long); !errors.Is(err, ErrContextFull) {
		t.Errorf("prompt beyond the context: %v", err)
	}
	// The session is still usable after rejected input.
	if _, err := s.Forward(ctx, []int32{1, 5, 6}); err != nil {
		t.Errorf("session unusable after bad input: %v", err)
	}
	// A cancelled context stops generation with its error.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n := 0
	for _, err := range s.Generate(cctx, "hello", WithMaxTokens(50), WithoutDefaultStops()) {
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				t.Errorf("cancel: %v", err)
			}
			break
		}
		n++
		if n == 3 {
			cancel()
		}
	}
	if n != 3 {
		t.Errorf("generation went on for %d tokens after cancel at 3", n)
	}
}

func TestCorruptCheckpoint(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"config.json", "model.safetensors"} {
		b, err := os.ReadFile(filepath.Join(tinyDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "model.safetensors" {
			b = b[:len(b)/2]
		}
		os.WriteFile(filepath.Join(dir, name), b, 0o644)
	}
	if _, err := Load(context.Background(), dir); err == nil || !strings.Contains(err.Error(), "model.safetensors") {
		t.Errorf("truncated checkpoint: %v", err)
	}
	// An extra tensor is reported by name.
	src, _ := safetensors.Open(filepath.Join(tinyDir, "model.safetensors"))
	var ts []safetensors.Tensor
	for _, ti := range src.Tensors() {
		b, _, _ := src.Bytes(ti.Name)
		ts = append(ts, safetensors.Tensor{Name: ti.Name, DType: ti.DType, Shape: ti.Shape, Data: append([]byte(nil), b...)})
	}
	src.Close()
	extra := append(ts, safetensors.F32Tensor("language_model.model.layers.0.bogus.weight", []int{1}, []float32{1}))
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), extra, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(context.Background(), dir); !errors.Is(err, ErrCheckpoint) || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("unexpected tensor: %v", err)
	}
	// A missing one too.
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts[1:], nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(context.Background(), dir); !errors.Is(err, ErrCheckpoint) || !strings.Contains(err.Error(), ts[0].Name) {
		t.Errorf("missing tensor: %v", err)
	}
}

// TestConcurrentSessions runs several sessions on one model at once.
func TestConcurrentSessions(t *testing.T) {
	prompt, gen := goldenIDs(t)
	m := load(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := m.NewSession()
			if err != nil {
				errs <- err
				return
			}
			var got []int32
			for tok, err := range s.GenerateTokens(context.Background(), prompt, WithMaxTokens(len(gen)), WithoutDefaultStops()) {
				if err != nil {
					errs <- err
					return
				}
				got = append(got, tok.ID)
			}
			if !slices.Equal(got, gen) {
				errs <- errors.New("concurrent session diverged")
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// golden is the tiny_k31pro golden's expected file and its MoE picks and
// DSA lists, flat, with their layer counts.
type golden struct {
	f                    *safetensors.File
	moe, dsa             []int32
	moeLayers, dsaLayers int
}

func goldenTrace(t *testing.T) golden {
	t.Helper()
	f, err := safetensors.Open(filepath.Join(tinyDir, "expected.safetensors"))
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	g := golden{f: f}
	var moe, dsa safetensors.TensorInfo
	g.moe, moe, err = f.Int32s("moe_topk_idx")
	require.NoError(t, err)
	g.dsa, dsa, err = f.Int32s("dsa_topk_indices")
	require.NoError(t, err)
	g.moeLayers, g.dsaLayers = moe.Shape[0], dsa.Shape[0]
	return g
}

// TestTraceAcrossChunks: a Forward cut into prefill chunks records one
// Trace entry a layer holding every token's rows, as one pass does, so
// the goldens' per-layer tensors compare whatever the chunk (the
// conformance runner's long prompts); a second Forward into the same
// Trace appends entries of its own.
func TestTraceAcrossChunks(t *testing.T) {
	prompt, _ := goldenIDs(t)
	g := goldenTrace(t)
	wantHidden, hiddenInfo, err := g.f.Float32s("hidden_after_layer")
	require.NoError(t, err)
	wantMoE, wantDSA, moeLayers, dsaLayers := g.moe, g.dsa, g.moeLayers, g.dsaLayers
	layers, T, d := hiddenInfo.Shape[0], len(prompt), hiddenInfo.Shape[2]
	flat := func(e [][]int32) []int32 { return slices.Concat(e...) }
	for _, chunk := range []int{256, 17, 7} {
		m := load(t, WithPrefillChunk(chunk))
		s, err := m.NewSession()
		require.NoError(t, err)
		var tr Trace
		_, err = s.Forward(WithTrace(context.Background(), &tr), prompt)
		require.NoError(t, err)
		require.Len(t, tr.MoEIndices, moeLayers, "chunk %d", chunk)
		require.Len(t, tr.DSAIndices, dsaLayers, "chunk %d", chunk)
		require.Len(t, tr.HiddenAfterLayer, layers, "chunk %d", chunk)
		assert.Equal(t, wantMoE, flat(tr.MoEIndices), "chunk %d: MoE picks", chunk)
		assert.Equal(t, wantDSA, flat(tr.DSAIndices), "chunk %d: DSA lists", chunk)
		require.Len(t, tr.FinalHidden, T*d, "chunk %d", chunk)
		for l, h := range tr.HiddenAfterLayer {
			require.Len(t, h, T*d, "chunk %d layer %d", chunk, l)
			want := wantHidden[l*T*d : (l+1)*T*d]
			scale := float32(0)
			for _, w := range want {
				scale = max(scale, w, -w)
			}
			for i := range h {
				require.InDelta(t, want[i], h[i], float64(1e-4*scale), "chunk %d layer %d value %d", chunk, l, i)
			}
		}
		// A second call appends its own entries.
		_, err = s.Forward(WithTrace(context.Background(), &tr), prompt[:3])
		require.NoError(t, err)
		require.Len(t, tr.MoEIndices, 2*moeLayers, "chunk %d", chunk)
		require.Len(t, tr.HiddenAfterLayer, 2*layers, "chunk %d", chunk)
		assert.Len(t, tr.HiddenAfterLayer[layers], 3*d, "chunk %d", chunk)
		assert.Len(t, tr.HiddenAfterLayer[0], T*d, "chunk %d: the first call's entry", chunk)
		s.Close()
	}
}

// TestTraceAcrossChunksCP: the same under context parallelism, whose
// passes each merge the ranks' rows by position.
func TestTraceAcrossChunksCP(t *testing.T) {
	prompt, _ := goldenIDs(t)
	gt := goldenTrace(t)
	wantMoE, wantDSA := gt.moe, gt.dsa
	for _, chunk := range []int{256, 7} {
		g, err := LoadGroup(context.Background(), tinyDir, Layout{CP: 2}, WithPrefillChunk(chunk))
		require.NoError(t, err)
		s, err := g.NewSession()
		require.NoError(t, err)
		var tr Trace
		_, err = s.Forward(WithTrace(context.Background(), &tr), prompt)
		require.NoError(t, err)
		require.Len(t, tr.MoEIndices, gt.moeLayers, "chunk %d", chunk)
		assert.Equal(t, wantMoE, slices.Concat(tr.MoEIndices...), "chunk %d: MoE picks", chunk)
		assert.Equal(t, wantDSA, slices.Concat(tr.DSAIndices...), "chunk %d: DSA lists", chunk)
		require.Len(t, tr.FinalHidden, len(prompt)*g.Ranks()[0].Config.HiddenSize, "chunk %d", chunk)
		s.Close()
		g.Close()
	}
}
