package conform

import (
	"context"
	"fmt"

	"k3/compute"
	"k3/internal/moe"
)

func init() {
	handlers["moe.router"] = runMoERouter
	handlers["moe.layer"] = bothExpertRoutes
}

// Tolerance from testdata/moe/README.md: about 1e-5 relative; indices exact.
const moeAtol, moeRtol = 1e-5, 1e-5

func routerFromMeta(f *caseFile) (moe.Router, error) {
	var r moe.Router
	var err error
	if r.TopK, err = f.metaInt("top_k"); err != nil {
		return r, err
	}
	if r.NumGroups, err = f.metaInt("n_group"); err != nil {
		return r, err
	}
	if r.TopKGroup, err = f.metaInt("topk_group"); err != nil {
		return r, err
	}
	s, err := f.metaFloat("routed_scaling_factor")
	if err != nil {
		return r, err
	}
	r.Scale = float32(s)
	renorm, err := f.metaInt("renormalize")
	r.Renormalize = renorm != 0
	return r, err
}

type routerCase struct {
	x, gate, bias compute.Tensor
	t, e, d       int
}

func loadRouter(b compute.Backend, f *caseFile) (*routerCase, error) {
	x, xs, err := f.f32("hidden", -1, -1)
	if err != nil {
		return nil, err
	}
	rc := &routerCase{t: xs[0], d: xs[1]}
	gw, gs, err := f.f32("gate_weight", -1, rc.d)
	if err != nil {
		return nil, err
	}
	rc.e = gs[0]
	bias, _, err := f.f32("e_score_correction_bias", rc.e)
	if err != nil {
		return nil, err
	}
	if rc.x, err = upload(b, x, rc.t, rc.d); err != nil {
		return nil, err
	}
	if rc.gate, err = upload(b, gw, rc.e, rc.d); err != nil {
		return nil, err
	}
	rc.bias, err = upload(b, bias, rc.e)
	return rc, err
}

func runMoERouter(ctx context.Context, b compute.Backend, path string, chk *checker) error {
	f, err := openCase(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := routerFromMeta(f)
	if err != nil {
		return err
	}
	rc, err := loadRouter(b, f)
	if err != nil {
		return err
	}
	logits, _ := b.Alloc(compute.F32, rc.t, rc.e)
	if err := b.MatMul(logits, rc.x, rc.gate); err != nil {
		return err
	}
	got, err := download(b, logits)
	if err != nil {
		return err
	}
	want, _, err := f.f32("logits", rc.t, rc.e)
	if err != nil {
		return err
	}
	chk.close("logits", got, want, moeAtol, moeRtol)
	idx, _ := b.Alloc(compute.I32, rc.t, r.TopK)
	wts, _ := b.Alloc(compute.F32, rc.t, r.TopK)
	if err := b.MoERoute(&compute.RouteArgs{Logits: logits, Bias: rc.bias, TopK: r.TopK, NumGroups: r.NumGroups, TopKGroup: r.TopKGroup,
		Renormalize: r.Renormalize, Scale: r.Scale, Indices: idx, Weights: wts}); err != nil {
		return err
	}
	gotIdx, err := downloadI32(b, idx)
	if err != nil {
		return err
	}
	wantIdx, _, err := f.i32("topk_idx", rc.t, r.TopK)
	if err != nil {
		return err
	}
	chk.exact("topk_idx", gotIdx, wantIdx)
	if got, err = download(b, wts); err != nil {
		return err
	}
	if want, _, err = f.f32("topk_weight", rc.t, r.TopK); err != nil {
		return err
	}
	chk.close("topk_weight", got, want, moeAtol, moeRtol)
	return nil
}

// bothExpertRoutes runs a MoE layer case with the experts as loaded and,
// on a backend that stacks them (compute.ExpertPreparer), again with them
// stacked; the second route's failures are labelled "(stacked)".
func bothExpertRoutes(ctx context.Context, b compute.Backend, path string, chk *checker) error {
	if err := runMoELayer(ctx, b, path, chk, false); err != nil {
		return err
	}
	if _, ok := b.(compute.ExpertPreparer); !ok {
		return nil
	}
	chk.route = " (stacked)"
	defer func() { chk.route = "" }()
	if err := runMoELayer(ctx, b, path, chk, true); err != nil {
		return fmt.Errorf("stacked route: %w", err)
	}
	if c, ok := b.(capturer); ok {
		chk.route = " (graph)"
		if err := runMoELayerWith(b, c, path, chk, true); err != nil {
			return fmt.Errorf("graph route: %w", err)
		}
	}
	return nil
}

func runMoELayer(ctx context.Context, b compute.Backend, path string, chk *checker, stack bool) error {
	return runMoELayerWith(b, nil, path, chk, stack)
}

// runMoELayerWith runs the layer directly, or, with c, captures it once
// into a graph (over a zeroed input; the shared experts on their side
// stream join the capture) and replays that graph after writing the input:
// a layer that read anything on the host could not be captured, and a
// graph that did not read the input tensor would give the zero input's
// output.
func runMoELayerWith(b compute.Backend, c capturer, path string, chk *checker, stack bool) error {
	f, err := openCase(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := routerFromMeta(f)
	if err != nil {
		return err
	}
	rc, err := loadRouter(b, f)
	if err != nil {
		return err
	}
	w1, s1, err := f.f32("experts_w1", rc.e, -1, rc.d)
	if err != nil {
		return err
	}
	inter := s1[1]
	w3, _, err := f.f32("experts_w3", rc.e, inter, rc.d)
	if err != nil {
		return err
	}
	w2, _, err := f.f32("experts_w2", rc.e, rc.d, inter)
	if err != nil {
		return err
	}
	w := &moe.Weights{Gate: rc.gate, Bias: rc.bias, Act: compute.Activation{Kind: compute.SwiGLU}}
	for e := 0; e < rc.e; e++ {
		n := inter * rc.d
		t1, err := upload(b, w1[e*n:(e+1)*n], inter, rc.d)
		if err != nil {
			return err
		}
		t3, err := upload(b, w3[e*n:(e+1)*n], inter, rc.d)
		if err != nil {
			return err
		}
		t2, err := upload(b, w2[e*n:(e+1)*n], rc.d, inter)
		if err != nil {
			return err
		}
		w.W1, w.W3, w.W2 = append(w.W1, t1), append(w.W3, t3), append(w.W2, t2)
	}
	if stack {
		if err := compute.PrepareExperts(b, w.W1, w.W3, w.W2); err != nil {
			return err
		}
	}
	if f.has("shared_w1") {
		sw1, ss, err := f.f32("shared_w1", -1, rc.d)
		if err != nil {
			return err
		}
		is := ss[0]
		sw3, _, err := f.f32("shared_w3", is, rc.d)
		if err != nil {
			return err
		}
		sw2, _, err := f.f32("shared_w2", rc.d, is)
		if err != nil {
			return err
		}
		m := &moe.MLP{Act: w.Act}
		if m.Gate, err = upload(b, sw1, is, rc.d); err != nil {
			return err
		}
		if m.Up, err = upload(b, sw3, is, rc.d); err != nil {
			return err
		}
		if m.Down, err = upload(b, sw2, rc.d, is); err != nil {
			return err
		}
		w.Shared = m
	}
	layer, err := moe.NewLayer(b, w, r, rc.t)
	if err != nil {
		return err
	}
	out, _ := b.Alloc(compute.F32, rc.t, rc.d)
	routed, _ := b.Alloc(compute.F32, rc.t, rc.d)
	shared, _ := b.Alloc(compute.F32, rc.t, rc.d)
	if w.Shared == nil {
		shared = compute.Tensor{}
	}
	if c == nil {
		if err := layer.Forward(rc.x, out, routed, shared); err != nil {
			return err
		}
	} else {
		x, err := download(b, rc.x)
		if err != nil {
			return err
		}
		if err := b.Write(rc.x, make([]float32, len(x))); err != nil {
			return err
		}
		g, err := c.Capture(func() error { return layer.Forward(rc.x, out, routed, shared) })
		if err != nil {
			return err
		}
		defer g.Close()
		if err := b.Write(rc.x, x); err != nil {
			return err
		}
		if err := g.Replay(); err != nil {
			return err
		}
	}
	idx, _ := layer.Routing(rc.t)
	gotIdx, err := downloadI32(b, idx)
	if err != nil {
		return err
	}
	if f.has("topk_idx") {
		wantIdx, _, err := f.i32("topk_idx", rc.t, r.TopK)
		if err != nil {
			return err
		}
		chk.exact("topk_idx", gotIdx, wantIdx)
	}
	for _, c := range []struct {
		name string
		t    compute.Tensor
	}{{"routed_out", routed}, {"shared_out", shared}, {"out", out}} {
		if c.t.IsZero() {
			continue
		}
		got, err := download(b, c.t)
		if err != nil {
			return err
		}
		want, _, err := f.f32(c.name, rc.t, rc.d)
		if err != nil {
			return fmt.Errorf("%w", err)
		}
		chk.close(c.name, got, want, moeAtol, moeRtol)
	}
	return nil
}
