package conform

import (
	"context"
	"fmt"
	"strconv"

	"k3/compute"
	"k3/internal/safetensors"
	"k3/kda"
)

func init() {
	handlers["kda.layer"] = runKDALayer
	handlers["kda.layer_decode"] = runKDALayerDecode
}

const kdaLayerAtol, kdaLayerRtol = 1e-5, 1e-4

func kdaLayerConfig(f *caseFile) (kda.Config, error) {
	var c kda.Config
	var err error
	if c.Hidden, err = f.metaInt("hidden"); err != nil {
		return c, err
	}
	if c.NumHeads, err = f.metaInt("num_heads"); err != nil {
		return c, err
	}
	if c.HeadDim, err = f.metaInt("head_dim"); err != nil {
		return c, err
	}
	if c.ConvKernel, err = f.metaInt("conv_kernel"); err != nil {
		return c, err
	}
	eps, err := f.metaFloat("rms_eps")
	if err != nil {
		return c, err
	}
	c.Eps = float32(eps)
	c.FullRankGate = f.Metadata()["full_rank_gate"] == "true"
	if lb := f.Metadata()["lower_bound"]; lb != "none" {
		v, err := strconv.ParseFloat(lb, 64)
		if err != nil {
			return c, fmt.Errorf("%s: metadata lower_bound %q: %v", f.Name(), lb, err)
		}
		c.LowerBound = float32(v)
	}
	return c, nil
}

// fileSource serves layer weights from a golden file.
func fileSource(f *caseFile) kda.Source {
	return func(name string) (compute.DType, []int, []byte, error) {
		b, ti, err := f.Bytes(name)
		if err != nil {
			return 0, nil, nil, err
		}
		dt, ok := map[safetensors.DType]compute.DType{safetensors.F32: compute.F32, safetensors.BF16: compute.BF16, safetensors.F16: compute.F16}[ti.DType]
		if !ok {
			return 0, nil, nil, fmt.Errorf("%s: tensor %s has dtype %s", f.Name(), name, ti.DType)
		}
		return dt, ti.Shape, b, nil
	}
}

func runKDALayer(ctx context.Context, b compute.Backend, path string, chk *checker) error {
	f, err := openCase(path)
	if err != nil {
		return err
	}
	defer f.Close()
	cfg, err := kdaLayerConfig(f)
	if err != nil {
		return err
	}
	x, xs, err := f.f32("x", -1, -1, cfg.Hidden)
	if err != nil {
		return err
	}
	bsz, t := xs[0], xs[1]
	hd := cfg.NumHeads * cfg.HeadDim
	w, err := kda.LoadWeights(b, cfg, fileSource(f))
	if err != nil {
		return err
	}
	wantY, _, err := f.f32("y", bsz, t, cfg.Hidden)
	if err != nil {
		return err
	}
	wantConv, _, err := f.f32("final_conv_state", bsz, cfg.ConvKernel-1, 3*hd)
	if err != nil {
		return err
	}
	wantS, _, err := f.f32("final_state", bsz, cfg.NumHeads, cfg.HeadDim, cfg.HeadDim)
	if err != nil {
		return err
	}
	initConv, _, err := f.f32("initial_conv_state", bsz, cfg.ConvKernel-1, 3*hd)
	if err != nil && f.has("initial_conv_state") {
		return err
	}
	initS, _, err := f.f32("initial_state", bsz, cfg.NumHeads, cfg.HeadDim, cfg.HeadDim)
	if err != nil && f.has("initial_state") {
		return err
	}
	// Packed batch: all sequences in one call, with every execution path.
	cu := make([]int32, bsz+1)
	for i := range cu {
		cu[i] = int32(i * t)
	}
	for _, chunk := range KDAChunkSizes {
		cfg.ChunkSize = chunk
		layer, err := kda.NewLayer(b, cfg, w, bsz*t)
		if err != nil {
			return err
		}
		st, err := kda.NewState(b, cfg, bsz)
		if err != nil {
			return err
		}
		if initConv != nil {
			if err := b.Write(st.Conv, initConv); err != nil {
				return err
			}
		}
		if initS != nil {
			if err := b.Write(st.S, vFirst(initS, bsz*cfg.NumHeads, cfg.HeadDim)); err != nil {
				return err
			}
		}
		xt, err := upload(b, x, bsz*t, cfg.Hidden)
		if err != nil {
			return err
		}
		y, _ := b.Alloc(compute.F32, bsz*t, cfg.Hidden)
		if err := layer.Forward(xt, kdaSeqs(st, cu, 0), y); err != nil {
			return err
		}
		for _, c := range []struct {
			name string
			t    compute.Tensor
			want []float32
		}{{"y", y, wantY}, {"final_conv_state", st.Conv, wantConv}, {"final_state", st.S, wantS}} {
			got, err := download(b, c.t)
			if err != nil {
				return err
			}
			if c.name == "final_state" {
				got = vFirst(got, bsz*cfg.NumHeads, cfg.HeadDim)
			}
			chk.close(fmt.Sprintf("%s(chunk %d)", c.name, chunk), got, c.want, kdaLayerAtol, kdaLayerRtol)
		}
	}
	return nil
}

// unfused is a backend without the fused KDA decode step, so that a
// layer takes its composition of smaller operations instead.
type unfused struct{ compute.Backend }

func (unfused) KDAStep(*compute.KDAStepArgs) error {
	return fmt.Errorf("%w: KDAStep withheld to test the composition", compute.ErrUnsupported)
}

// runKDALayerDecode checks both routes of the decode step: the backend's
// fused KDAStep, and the layer's composition of smaller operations; on a
// backend that captures graphs (ascend), the composed step once more,
// captured after the first step and replayed for the others.
func runKDALayerDecode(ctx context.Context, b compute.Backend, path string, chk *checker) error {
	if err := runKDALayerDecodeOn(b, path, chk, ""); err != nil {
		return err
	}
	if err := runKDALayerDecodeOn(unfused{b}, path, chk, " (composed)"); err != nil {
		return err
	}
	if err := runKDALayerDecodeWith(unfused{b}, nil, path, chk, " (pooled)", true); err != nil {
		return err
	}
	if c, ok := b.(capturer); ok {
		return runKDALayerDecodeGraph(unfused{b}, c, path, chk)
	}
	return nil
}

// capturer is a backend that records work into a graph replayed later.
type capturer = compute.Capturer

func runKDALayerDecodeOn(b compute.Backend, path string, chk *checker, route string) error {
	return runKDALayerDecodeWith(b, nil, path, chk, route, false)
}

// runKDALayerDecodeGraph is the decode case with every step after the
// first replayed from a graph captured once: the input is written into
// the same tensor before each replay, and the states advance in place.
func runKDALayerDecodeGraph(b compute.Backend, c capturer, path string, chk *checker) error {
	return runKDALayerDecodeWith(b, c, path, chk, " (graph)", false)
}

// runKDALayerDecodeWith runs the decode case on b, capturing the steps
// with c when set. With pooled, the sequences' states are rows of one
// pool in reverse order, row 0 no sequence's, and the decode steps name
// the pool and the rows (kda.Seqs.Pool): a backend without the fused step
// runs them through CausalConv's and KDAChunk's StateIdx.
func runKDALayerDecodeWith(b compute.Backend, c capturer, path string, chk *checker, route string, pooled bool) error {
	f, err := openCase(path)
	if err != nil {
		return err
	}
	defer f.Close()
	cfg, err := kdaLayerConfig(f)
	if err != nil {
		return err
	}
	cfg.ChunkSize = 16
	xp, xs, err := f.f32("x_prefill", -1, -1, cfg.Hidden)
	if err != nil {
		return err
	}
	bsz, t := xs[0], xs[1]
	hd := cfg.NumHeads * cfg.HeadDim
	xd, ds, err := f.f32("x_decode", bsz, -1, cfg.Hidden)
	if err != nil {
		return err
	}
	steps := ds[1]
	w, err := kda.LoadWeights(b, cfg, fileSource(f))
	if err != nil {
		return err
	}
	layer, err := kda.NewLayer(b, cfg, w, bsz*t)
	if err != nil {
		return err
	}
	rows := bsz
	if pooled {
		rows++
	}
	st, err := kda.NewState(b, cfg, rows)
	if err != nil {
		return err
	}
	slots := make([]int32, bsz) // each sequence's row of st
	for i := range slots {
		slots[i] = int32(i)
		if pooled {
			slots[i] = int32(bsz - i)
		}
	}
	// states reads st's rows in sequence order.
	states := func(t compute.Tensor) ([]float32, error) {
		all, err := download(b, t)
		if err != nil {
			return nil, err
		}
		per := len(all) / rows
		out := make([]float32, 0, bsz*per)
		for _, r := range slots {
			out = append(out, all[int(r)*per:int(r+1)*per]...)
		}
		if pooled {
			chk.close("unused pool row"+route, all[:per], make([]float32, per), 0, 0)
		}
		return out, nil
	}
	seqs := func(cu []int32, exact int) *kda.Seqs {
		s := &kda.Seqs{Cu: cu, Exact: exact}
		for _, r := range slots {
			s.States = append(s.States, st.Seq(int(r)))
		}
		return s
	}
	cu := make([]int32, bsz+1)
	for i := range cu {
		cu[i] = int32(i * t)
	}
	xt, err := upload(b, xp, bsz*t, cfg.Hidden)
	if err != nil {
		return err
	}
	y, _ := b.Alloc(compute.F32, bsz*t, cfg.Hidden)
	if err := layer.Forward(xt, seqs(cu, 0), y); err != nil {
		return err
	}
	for _, c := range []struct {
		name string
		t    compute.Tensor
	}{{"y_prefill", y}, {"conv_state_after_prefill", st.Conv}, {"state_after_prefill", st.S}} {
		got, err := download(b, c.t)
		if c.name != "y_prefill" {
			got, err = states(c.t)
		}
		if err != nil {
			return err
		}
		if c.name == "state_after_prefill" {
			got = vFirst(got, bsz*cfg.NumHeads, cfg.HeadDim)
		}
		want, _, err := f.f32(c.name)
		if err != nil {
			return err
		}
		chk.close(c.name+route, got, want, kdaLayerAtol, kdaLayerRtol)
	}
	wantY, _, err := f.f32("y_decode", bsz, steps, cfg.Hidden)
	if err != nil {
		return err
	}
	wantConv, _, err := f.f32("conv_state_after_step", bsz, steps, cfg.ConvKernel-1, 3*hd)
	if err != nil {
		return err
	}
	wantS, _, err := f.f32("state_after_step", bsz, steps, cfg.NumHeads, cfg.HeadDim, cfg.HeadDim)
	if err != nil {
		return err
	}
	xstep, _ := b.Alloc(compute.F32, bsz, cfg.Hidden)
	ystep, _ := b.Alloc(compute.F32, bsz, cfg.Hidden)
	pick := func(all []float32, s, per int) []float32 {
		out := make([]float32, 0, bsz*per)
		for bi := 0; bi < bsz; bi++ {
			out = append(out, all[(bi*steps+s)*per:(bi*steps+s+1)*per]...)
		}
		return out
	}
	stepRows := make([]int32, bsz+1)
	for i := range stepRows {
		stepRows[i] = int32(i)
	}
	steps1 := seqs(stepRows, bsz)
	if pooled {
		idx, err := b.Alloc(compute.I32, bsz)
		if err != nil {
			return err
		}
		if err := b.Write(idx, slots); err != nil {
			return err
		}
		steps1.Pool, steps1.Slots = st, idx
	}
	var g compute.Graph
	defer func() {
		if g != nil {
			g.Close()
		}
	}()
	for s := 0; s < steps; s++ {
		if err := b.Write(xstep, pick(xd, s, cfg.Hidden)); err != nil {
			return err
		}
		step := func() error { return layer.Forward(xstep, steps1, ystep) }
		switch {
		case c != nil && s == 1:
			// Step 0 ran eagerly (warming what the step builds once);
			// step 1 is captured, then run by its first replay.
			if g, err = c.Capture(step); err != nil {
				return fmt.Errorf("capturing the decode step: %w", err)
			}
			err = g.Replay()
		case g != nil:
			err = g.Replay()
		default:
			err = step()
		}
		if err != nil {
			return err
		}
		for _, c := range []struct {
			name string
			t    compute.Tensor
			want []float32
		}{
			{"y_decode", ystep, pick(wantY, s, cfg.Hidden)},
			{"conv_state_after_step", st.Conv, pick(wantConv, s, (cfg.ConvKernel-1)*3*hd)},
			{"state_after_step", st.S, pick(wantS, s, cfg.NumHeads*cfg.HeadDim*cfg.HeadDim)},
		} {
			got, err := download(b, c.t)
			if c.name != "y_decode" {
				got, err = states(c.t)
			}
			if err != nil {
				return err
			}
			if c.name == "state_after_step" {
				got = vFirst(got, bsz*cfg.NumHeads, cfg.HeadDim)
			}
			chk.close(fmt.Sprintf("%s[step %d]%s", c.name, s, route), got, c.want, kdaLayerAtol, kdaLayerRtol)
		}
	}
	return nil
}

// vFirst transposes n square d×d states (K-first <-> V-first).
func vFirst(x []float32, n, d int) []float32 {
	out := make([]float32, len(x))
	kda.TransposeState(out, x, n, d, d)
	return out
}

// kdaSeqs describes the sequences of a multi-sequence state st as a
// layer's Forward takes them: rows cu, the first exact of them exact runs.
func kdaSeqs(st *kda.State, cu []int32, exact int) *kda.Seqs {
	s := &kda.Seqs{Cu: cu, Exact: exact}
	for i := range len(cu) - 1 {
		s.States = append(s.States, st.Seq(i))
	}
	return s
}
