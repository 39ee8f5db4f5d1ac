package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/k3"
)

// heldout is testdata/trained/heldout.json: held-out files as the training
// framework (tools/train, PyTorch) tokenized and scored them.
type heldout struct {
	Window int `json:"window"`
	Files  []struct {
		Name   string  `json:"name"`
		IDs    []int32 `json:"ids"`
		Bits   float64 `json:"bits"`
		Tokens int     `json:"tokens"`
		Bytes  int     `json:"bytes"`
	} `json:"files"`
	Total struct {
		BitsPerByte float64 `json:"bits_per_byte"`
	} `json:"total"`
}

func readHeldout(t *testing.T) (heldout, string) {
	dir := filepath.Join("..", "..", "testdata", "trained")
	b, err := os.ReadFile(filepath.Join(dir, "heldout.json"))
	require.NoError(t, err)
	var h heldout
	require.NoError(t, json.Unmarshal(b, &h))
	require.NotEmpty(t, h.Files)
	return h, dir
}

// The embedded model's tokenizer splits held-out text exactly as the
// training framework's did, and k3 scores the slice within 1% of the
// bits/byte the training framework recorded.
func TestEmbeddedModelScoresHeldoutSlice(t *testing.T) {
	h, dir := readHeldout(t)
	ctx := context.Background()
	m, err := k3.LoadTiny(ctx)
	require.NoError(t, err)
	defer m.Close()
	var total score
	for _, f := range h.Files {
		text, err := os.ReadFile(filepath.Join(dir, "heldout", f.Name))
		require.NoError(t, err)
		require.Equal(t, f.Bytes, len(text), f.Name)
		require.Equal(t, f.IDs, m.Tokenizer().Encode(string(text), false), "%s: token ids differ from the training tokenizer's", f.Name)
		assert.Equal(t, text, []byte(m.Decode(f.IDs)), "%s: decoding does not give back the file", f.Name)
		s, err := scoreText(ctx, m, string(text), h.Window)
		require.NoError(t, err)
		assert.InDelta(t, f.Bits, s.Bits, 0.01*f.Bits, f.Name)
		total.add(s)
	}
	got := total.Bits / float64(total.Bytes)
	t.Logf("k3: %s; training framework: %.4f bits/byte", total, h.Total.BitsPerByte)
	assert.InDelta(t, h.Total.BitsPerByte, got, 0.01*h.Total.BitsPerByte)
}

func TestEvalCommand(t *testing.T) {
	h, dir := readHeldout(t)
	var out, errb bytes.Buffer
	args := []string{"eval", "-v"}
	for _, f := range h.Files[:2] {
		args = append(args, filepath.Join(dir, "heldout", f.Name))
	}
	require.Equal(t, 0, run(context.Background(), args, &out, &errb), errb.String())
	lines := bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n"))
	require.Len(t, lines, 3)
	assert.Regexp(t, `^\d+ tokens, \d+\.\d{4} bits/token, \d+\.\d{4} bits/byte$`, string(lines[2]))

	empty := filepath.Join(t.TempDir(), "empty.go")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	out.Reset()
	require.Equal(t, 0, run(context.Background(), []string{"eval", "-v", empty, args[2]}, &out, &errb), errb.String())
	assert.Contains(t, out.String(), empty+": empty: nothing to score\n", "an empty file among others")
	errb.Reset()
	require.NotEqual(t, 0, run(context.Background(), []string{"eval", empty}, &out, &errb))
	assert.Contains(t, errb.String(), "nothing to score", "only empty files: no figure (0 bits/token would read as a perfect score)")

	for _, bad := range [][]string{{"eval"}, {"eval", "-window", "0", args[2]}, {"eval", "/nonexistent/file.go"}} {
		errb.Reset()
		assert.NotEqual(t, 0, run(context.Background(), bad, &out, &errb), "%v", bad)
		assert.NotEmpty(t, errb.String(), "%v", bad)
	}
}
