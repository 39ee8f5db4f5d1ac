package modelbench

import (
	"context"
	"testing"
)

// BenchmarkModel runs the whole-model measurement once and reports its
// figures (the same as `k3 bench model`).
func BenchmarkModel(b *testing.B) {
	for i := 0; i < b.N; i++ {
		r, err := Run(context.Background(), func(string) {})
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
