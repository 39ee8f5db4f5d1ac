package k3

import (
	"context"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/internal/safetensors"
)

// The embedded model's logits equal the training framework's (PyTorch,
// float32, the same bf16 weights; testdata/trained/crosscheck.safetensors,
// written by tools/train) within 1e-4 of the logit scale at every
// position: the prefill of a held-out prompt, and greedy decoding one token
// at a time.
func TestEmbeddedModelMatchesTrainingFramework(t *testing.T) {
	f, err := safetensors.Open(filepath.Join("..", "testdata", "trained", "crosscheck.safetensors"))
	require.NoError(t, err)
	defer f.Close()
	ids, _, err := f.Int32s("input_ids")
	require.NoError(t, err)
	want, _, err := f.Float32s("prefill_logits")
	require.NoError(t, err)
	gen, _, err := f.Int32s("generated_ids")
	require.NoError(t, err)
	wantDec, _, err := f.Float32s("decode_logits")
	require.NoError(t, err)

	ctx := context.Background()
	m, err := LoadTiny(ctx)
	require.NoError(t, err)
	defer m.Close()
	v := m.VocabSize()
	require.Len(t, want, len(ids)*v)
	var scale float64
	for _, x := range append(append([]float32(nil), want...), wantDec...) {
		scale = max(scale, math.Abs(float64(x)))
	}
	tol := 1e-4 * scale
	var overall float64
	check := func(what string, row int, got, want []float32) {
		t.Helper()
		var worst float64
		for i := range want {
			worst = max(worst, math.Abs(float64(got[i]-want[i])))
		}
		overall = max(overall, worst)
		require.LessOrEqual(t, worst, tol, "%s position %d: max |k3 - PyTorch| = %.3g, tolerance %.3g (1e-4 of the logit scale %.3g)", what, row, worst, tol, scale)
	}

	s, err := m.NewSession()
	require.NoError(t, err)
	defer s.Close()
	got, err := s.Forward(ctx, ids)
	require.NoError(t, err)
	for i := range ids {
		check("prefill", i, got[i*v:(i+1)*v], want[i*v:(i+1)*v])
	}
	require.Equal(t, gen[0], argmax(got[(len(ids)-1)*v:]))
	for i, id := range gen {
		row, err := s.Forward(ctx, []int32{id})
		require.NoError(t, err)
		check("decode", len(ids)+i, row, wantDec[i*v:(i+1)*v])
		if i+1 < len(gen) {
			require.Equal(t, gen[i+1], argmax(row), "greedy token after decode step %d", i)
		}
	}
	t.Logf("%d prefill and %d decode positions: max |k3 - PyTorch| = %.3g, %.2g of the logit scale %.3g", len(ids), len(gen), overall, overall/scale, scale)
}

func argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

// Encoding then decoding every Go file of the installed toolchain's source
// tree (the corpus the embedded tokenizer was learned on, training and
// held-out files alike) gives back its bytes. CI checks every 8th file
// (every 200th under the race detector); K3_ROUNDTRIP_EVERY=1 checks all.
func TestEmbeddedTokenizerRoundTripsGoSource(t *testing.T) {
	m, err := LoadTiny(context.Background())
	require.NoError(t, err)
	defer m.Close()
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	require.NoError(t, err, "go env GOROOT")
	src := filepath.Join(strings.TrimSpace(string(goroot)), "src")
	every := 8
	if raceEnabled {
		every = 200
	}
	if n, err := strconv.Atoi(os.Getenv("K3_ROUNDTRIP_EVERY")); err == nil && n > 0 {
		every = n
	}
	var files, bytes, tokens int
	err = filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "testdata" {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		files++
		if files%every != 0 {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		ids := m.Tokenizer().Encode(string(b), false)
		if got := m.Decode(ids); got != string(b) {
			t.Errorf("%s: decoding its %d tokens does not give back its %d bytes", path, len(ids), len(b))
		}
		bytes += len(b)
		tokens += len(ids)
		return nil
	})
	require.NoError(t, err)
	require.Positive(t, tokens)
	t.Logf("%d files, %d bytes, %d tokens (%.2f bytes/token)", files/every, bytes, tokens, float64(bytes)/float64(tokens))
}
