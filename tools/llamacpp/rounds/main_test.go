package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseBest(t *testing.T) {
	out := "CPU: AMD EPYC; llama.cpp via node-llama-cpp, 2 threads\n" +
		"prefill of 512 tokens: 846.9, 960.4 tokens/s\n" +
		"best 960.4 tokens/s, 163.9 GFLOP/s of products (85.3M parameters)\n"
	g, err := parseBest(out)
	require.NoError(t, err)
	assert.Equal(t, 163.9, g)
	for _, bad := range []string{
		"", "prefill of 512 tokens: 846.9 tokens/s\n",
		"best 960.4 tokens/s, 0 GFLOP/s of products (85.3M parameters)\n",
		"best 960.4 tokens/s, 1.2.3 GFLOP/s of products\n",
	} {
		_, err := parseBest(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func FuzzParseBest(f *testing.F) {
	f.Add("best 960.4 tokens/s, 163.9 GFLOP/s of products (85.3M parameters)\n")
	f.Add("best 1 tokens/s, 1e400 GFLOP/s of products")
	f.Fuzz(func(t *testing.T, out string) {
		g, err := parseBest(out)
		if err == nil && !(g > 0) {
			t.Fatalf("%q: GFLOP/s %g without an error", out, g)
		}
	})
}

func TestSpread(t *testing.T) {
	lo, mid, hi := spread([]float64{3, 1, 2})
	assert.Equal(t, [3]float64{1, 2, 3}, [3]float64{lo, mid, hi})
	lo, mid, hi = spread([]float64{4, 1, 3, 2})
	assert.Equal(t, [3]float64{1, 2.5, 4}, [3]float64{lo, mid, hi})
}

// TestFlags: bad flags are refused before anything is written or loaded.
func TestFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "-gguf"},
		{[]string{"-gguf", "x", "-rounds", "0"}, "-rounds 0"},
		{[]string{"-gguf", "/nonexistent/peer.gguf"}, "peer.gguf.json"},
		{[]string{"-nosuchflag"}, "nosuchflag"},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), c.args, &out, &errOut)
		require.Error(t, err, "%v", c.args)
		assert.True(t, strings.Contains(err.Error()+errOut.String(), c.want), "%v: %v %s", c.args, err, errOut.String())
	}
}
