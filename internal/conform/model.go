package conform

import (
	"context"
	"fmt"
	"path/filepath"

	"k3/compute"
	"k3/k3"
)

func init() { handlers["model.forward"] = runModel }

// forwarder is a sequence on one model or on a Group.
type forwarder interface {
	Forward(ctx context.Context, tokens []int32) ([]float32, error)
}

type layoutKey struct{}

// Tolerances from testdata/model/README.md: logits within 1e-3 absolute,
// hidden states within 1e-4 relative to their largest magnitude; tokens and
// index lists exact.
const logitAtol = 1e-3

func maxAbs(v []float32) float64 {
	m := 0.0
	for _, x := range v {
		m = max(m, float64(x), -float64(x))
	}
	return m
}

func argmax(row []float32) int32 {
	best := 0
	for i, v := range row {
		if v > row[best] {
			best = i
		}
	}
	return int32(best)
}

func runModel(ctx context.Context, b compute.Backend, dir string, chk *checker) error {
	if filepath.Base(dir) == "expected.safetensors" {
		// Named as a file (its directory lacks config.json, or the file
		// was given): the checkpoint is the directory holding it.
		dir = filepath.Dir(dir)
	}
	// The host backends are opened by name, as an application would (a
	// parallel layout opens one per rank); a device backend runs the
	// model on b itself.
	byName := b.Name() == "go" || b.Name() == "go-fastbf16" || b.Name() == "ascend-host"
	l, split := ctx.Value(layoutKey{}).(k3.Layout)
	split = split && l.Ranks() > 1
	if split && !byName {
		return fmt.Errorf("model.forward under a parallel layout opens a backend per rank by name, which %s cannot be: %w", b.Name(), compute.ErrUnsupported)
	}
	backend := k3.WithBackend(b.Name())
	if !byName {
		backend = k3.WithComputeBackend(b)
	}
	f, err := openCase(filepath.Join(dir, "expected.safetensors"))
	if err != nil {
		return err
	}
	defer f.Close()
	var (
		cfg *k3.Config
		s   forwarder
		gm  *k3.Model // the model, when its backend captures graphs
	)
	if split {
		g, err := k3.LoadGroup(ctx, dir, l, backend)
		if err != nil {
			return err
		}
		defer g.Close()
		gs, err := g.NewSession()
		if err != nil {
			return err
		}
		defer gs.Close()
		cfg, s = g.Ranks()[0].Config, gs
	} else {
		m, err := k3.Load(ctx, dir, backend)
		if err != nil {
			return err
		}
		defer m.Close()
		ms, err := m.NewSession()
		if err != nil {
			return err
		}
		defer ms.Close()
		cfg, s = m.Config, ms
		if _, ok := b.(compute.Capturer); ok {
			gm = m
		}
	}
	ids, _, err := f.i32("input_ids", -1)
	if err != nil {
		return err
	}
	t, v, d := len(ids), cfg.VocabSize, cfg.HiddenSize
	var tr k3.Trace
	logits, err := s.Forward(k3.WithTrace(ctx, &tr), ids)
	if err != nil {
		return err
	}
	want, _, err := f.f32("prefill_logits", t, v)
	if err != nil {
		return err
	}
	chk.close("prefill_logits", logits, want, logitAtol, 0)
	hidden := func(name string, got [][]float32) error {
		if !f.has(name) {
			return nil
		}
		want, _, err := f.f32(name, len(got), t, d)
		if err != nil {
			return err
		}
		for l, g := range got {
			w := want[l*t*d : (l+1)*t*d]
			chk.close(fmt.Sprintf("%s[%d]", name, l), g, w, 1e-4*maxAbs(w), 0)
		}
		return nil
	}
	for _, c := range []struct {
		name string
		got  [][]float32
	}{{"hidden_after_layer", tr.HiddenAfterLayer}, {"attn_input", tr.AttnInput}, {"mlp_input", tr.MLPInput},
		{"attn_output", tr.AttnOutput}, {"mlp_output", tr.MLPOutput}} {
		if err := hidden(c.name, c.got); err != nil {
			return err
		}
	}
	if f.has("final_hidden") {
		wantFH, _, err := f.f32("final_hidden", t, d)
		if err != nil {
			return err
		}
		chk.close("final_hidden", tr.FinalHidden, wantFH, 1e-4*maxAbs(wantFH), 0)
	}
	if f.has("dsa_topk_indices") {
		want, _, err := f.i32("dsa_topk_indices", len(tr.DSAIndices), t, -1)
		if err != nil {
			return err
		}
		chk.exact("dsa_topk_indices", concatI(tr.DSAIndices), want)
	}
	if f.has("moe_topk_idx") {
		want, _, err := f.i32("moe_topk_idx", len(tr.MoEIndices), t, -1)
		if err != nil {
			return err
		}
		chk.exact("moe_topk_idx", concatI(tr.MoEIndices), want)
	}
	if f.has("moe_topk_weight") {
		wantW, _, err := f.f32("moe_topk_weight", len(tr.MoEWeights), t, -1)
		if err != nil {
			return err
		}
		chk.close("moe_topk_weight", concatF(tr.MoEWeights), wantW, 1e-4, 1e-4)
	}
	// Greedy continuation with caches, one token per step.
	gen, _, err := f.i32("generated_ids", -1)
	if err != nil {
		return err
	}
	steps := len(gen)
	wantD, _, err := f.f32("decode_logits", steps, v)
	if err != nil {
		return err
	}
	if f.has("decode_positions") {
		// Step i feeds generated_ids[i] at position t+i: the file must say so.
		pos, _, err := f.i32("decode_positions", steps)
		if err != nil {
			return err
		}
		want := make([]int32, steps)
		for i := range want {
			want[i] = int32(t + i)
		}
		chk.exact("decode_positions", pos, want)
	}
	var wantIdx []int32
	var nDSA int
	if f.has("decode_dsa_topk_indices") {
		var ds []int
		if wantIdx, ds, err = f.i32("decode_dsa_topk_indices", steps, -1, -1); err != nil {
			return err
		}
		nDSA = ds[1]
	}
	got := make([]int32, steps)
	got[0] = argmax(logits[(t-1)*v:])
	for i := 0; i < steps; i++ {
		var dtr k3.Trace
		row, err := s.Forward(k3.WithTrace(ctx, &dtr), []int32{gen[i]})
		if err != nil {
			return err
		}
		chk.close(fmt.Sprintf("decode_logits[%d]", i), row, wantD[i*v:(i+1)*v], logitAtol, 0)
		if i+1 < steps {
			got[i+1] = argmax(row)
		}
		if wantIdx != nil {
			k := len(wantIdx) / (steps * nDSA)
			chk.exact(fmt.Sprintf("decode_dsa_topk_indices[%d]", i), concatI(dtr.DSAIndices), wantIdx[i*nDSA*k:(i+1)*nDSA*k])
		}
	}
	chk.exact("generated_ids", got, gen)
	if gm != nil {
		return decodeGraphs(ctx, gm, ids, gen, wantD, chk)
	}
	return nil
}

// decodeGraphs runs the decode again in a session of its own without a
// trace, which lets the model replay its captured graphs (a trace's reads
// would keep them off), and checks the logits again as route "(graphs)"
// and that graphs were replayed, token mixers' among them (alone, or
// inside a whole step's graph).
func decodeGraphs(ctx context.Context, m *k3.Model, ids, gen []int32, wantD []float32, chk *checker) error {
	s, err := m.NewSession()
	if err != nil {
		return err
	}
	defer s.Close()
	if _, err := s.Forward(ctx, ids); err != nil {
		return err
	}
	before := m.GraphStats()
	chk.route = " (graphs)"
	defer func() { chk.route = "" }()
	v := len(wantD) / len(gen)
	for i, tok := range gen {
		row, err := s.Forward(ctx, []int32{tok})
		if err != nil {
			return fmt.Errorf("graphs route: %w", err)
		}
		chk.close(fmt.Sprintf("decode_logits[%d]", i), row, wantD[i*v:(i+1)*v], logitAtol, 0)
	}
	after := m.GraphStats()
	replayed := int32(0)
	if after.Replayed > before.Replayed {
		replayed = 1
	}
	chk.exact("decode graphs replayed (1: some)", []int32{replayed}, []int32{1})
	replayed = 0
	if after.MixersReplayed > before.MixersReplayed || after.StepsReplayed > before.StepsReplayed {
		replayed = 1
	}
	chk.exact("token mixer graphs replayed, alone or in whole steps (1: some)", []int32{replayed}, []int32{1})
	return nil
}

func concatI(v [][]int32) []int32 {
	var out []int32
	for _, x := range v {
		out = append(out, x...)
	}
	return out
}

func concatF(v [][]float32) []float32 {
	var out []float32
	for _, x := range v {
		out = append(out, x...)
	}
	return out
}
