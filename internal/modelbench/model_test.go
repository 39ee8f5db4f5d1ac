package modelbench

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k3/config"
	"k3/internal/tiny"

	"github.com/stretchr/testify/require"
)

// BenchmarkModel runs the whole-model measurement once and reports its
// figures (the same as `k3 bench model`).
func BenchmarkModel(b *testing.B) {
	for i := 0; i < b.N; i++ {
		r, err := Run(context.Background(), "go", func(string) {})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(r.PrefillTokPerSec, "prefill_tok/s")
		b.ReportMetric(r.Decode1TokPerSec, "decode1_tok/s")
		b.ReportMetric(r.Decode8TokPerSec, "decode8_tok/s")
		b.ReportMetric(r.RooflineShare, "decode1_roofline_share")
		b.ReportMetric(r.Batch8Gain, "batch8_gain")
	}
}

// TestScheduleWindow checks Window's arithmetic on figures worked by hand:
// p' = (29.4 - 11) / 20 = 0.92 ms against p = 3.11296 s / 4096 = 0.76 ms,
// spread 36.75 / 29.4 = 1.25, fit = (2·0.76/0.92 - 1)(3/1.25 - 1) = 0.9130.
func TestScheduleWindow(t *testing.T) {
	r := &ScheduleResult{Streams: 8, PromptTokens: 4096, Chunk: 20,
		BaseP50: 11 * time.Millisecond, P50: 29400 * time.Microsecond, P99: 36750 * time.Microsecond,
		Alone: 3112960 * time.Microsecond}
	pTok, aloneTok, spread, fit := r.Window()
	require.Equal(t, 920*time.Microsecond, pTok)
	require.Equal(t, 760*time.Microsecond, aloneTok)
	require.InDelta(t, 1.25, spread, 1e-9)
	require.InDelta(t, 0.91304, fit, 1e-4)
	require.Contains(t, r.Line(), "here 0.91")
}

// presetConfig parses a tiny preset's config.json.
func presetConfig(t *testing.T, preset string) *config.Config {
	t.Helper()
	text, err := tiny.Config(preset)
	require.NoError(t, err)
	js, err := json.Marshal(text)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), js, 0o644))
	cfg, err := config.Load(dir)
	require.NoError(t, err)
	return cfg
}

// TestStepParts: the 100M preset's decode step by kind, against its
// shape (12 layers, the first a dense MLP, 11 of 64 experts 384 wide
// and 64 inner, top-4, a 32,000-token embedding table not read whole),
// and the parts bound's two limits.
func TestStepParts(t *testing.T) {
	cfg := presetConfig(t, "k31pro-100m")
	const weights, state = 200_000_000, 3_000_000
	const expert = 3 * 384 * 64 * 2 // bytes of one expert's three bf16 matrices
	p1, p8 := stepParts(cfg, weights, state, 1), stepParts(cfg, weights, state, 8)
	require.InDelta(t, 11*4*expert, p1.experts, 1e-6)
	require.InDelta(t, 11*4*8*expert, p8.expertFLOPs, 1e-6, "2 FLOPs a weight and routed token")
	// Eight tokens of top-4 over 64 experts, each pick uniform: every
	// expert missed by all 32 picks with probability (60/64)^8.
	require.InDelta(t, 11*64*(1-math.Pow(60.0/64, 8))*expert, p8.experts, 1)
	require.Equal(t, p1.dense, p8.dense)
	require.InDelta(t, float64(weights-11*64*expert-cfg.VocabSize*cfg.HiddenSize*2), p1.dense, 1e-6)
	require.InDelta(t, 2*8*state, p8.state, 1e-6)
	require.InDelta(t, stepBytes(cfg, weights, state, 8), p8.dense+p8.experts+p8.state, 1e-6)
	// Unlimited arithmetic: bytes over the bandwidth; unlimited bandwidth:
	// arithmetic over the peak.
	const bw, peak = 30e9, 200e9
	require.InDelta(t, (p8.dense+p8.experts+p8.state)/bw, p8.bound(8, bw, math.Inf(1)), 1e-12)
	require.InDelta(t, (8*p8.dense+p8.expertFLOPs)/peak, p8.bound(8, math.Inf(1), peak), 1e-12)
	// At 8 rows the weights every token reads are compute-bound here
	// (8 FLOPs a byte against 200/30), the rest memory-bound: the parts
	// one after another take longer than the larger of the two totals.
	require.Greater(t, p8.bound(8, bw, peak), max((p8.dense+p8.experts+p8.state)/bw, (8*p8.dense+p8.expertFLOPs)/peak))
}
