package modelbench

import (
	"context"
	"testing"
	"time"

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
