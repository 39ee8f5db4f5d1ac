package conform

import (
	"context"
	"fmt"
	"strings"

	"k3/attnres"
	"k3/compute"
)

func init() {
	handlers["attnres.aggregate"] = bothAttnResRoutes(runAttnResAggregate)
	handlers["attnres.two_phase"] = bothAttnResRoutes(runAttnResTwoPhase)
	handlers["attnres.stack"] = bothAttnResRoutes(runAttnResStack)
}

// Tolerances from testdata/attnres/README.md: about 1e-5 relative, 1e-4
// absolute where values reach about 10.
const attnResAtol, attnResRtol = 2e-5, 2e-5

func fused(w, g []float32) []float32 {
	q := make([]float32, len(w))
	attnres.FuseQuery(q, w, g)
	return q
}

// bothAttnResRoutes runs an AttnRes case on the backend's fused phases
// and again on their composition of smaller operations (the backend with
// the fused ones withheld); the second route's failures are labelled
// "(composed)".
func bothAttnResRoutes(run handler) handler {
	return func(ctx context.Context, b compute.Backend, path string, chk *checker) error {
		if err := run(ctx, b, path, chk); err != nil {
			return err
		}
		chk.route = " (composed)"
		defer func() { chk.route = "" }()
		if err := run(ctx, unfusedAttnRes{b}, path, chk); err != nil {
			return fmt.Errorf("composed route: %w", err)
		}
		return nil
	}
}

// unfusedAttnRes is a backend without the fused AttnRes phases.
type unfusedAttnRes struct{ compute.Backend }

func (unfusedAttnRes) AttnResPrepare(*compute.AttnResPrepareArgs) error {
	return fmt.Errorf("%w: AttnResPrepare withheld to test the composition", compute.ErrUnsupported)
}

func (unfusedAttnRes) AttnResUpdate(*compute.AttnResUpdateArgs) error {
	return fmt.Errorf("%w: AttnResUpdate withheld to test the composition", compute.ErrUnsupported)
}

func runAttnResAggregate(ctx context.Context, b compute.Backend, path string, chk *checker) error {
	f, err := openCase(path)
	if err != nil {
		return err
	}
	defer f.Close()
	vals, shape, err := f.f32("values", -1, -1, -1)
	if err != nil {
		return err
	}
	n, t, d := shape[0], shape[1], shape[2]
	query, _, err := f.f32("query", d)
	if err != nil {
		return err
	}
	g, _, err := f.f32("norm_weight", d)
	if err != nil {
		return err
	}
	want, _, err := f.f32("out", t, d)
	if err != nil {
		return err
	}
	eps, err := f.metaFloat("eps")
	if err != nil {
		return err
	}
	blocks := make([]compute.Tensor, n)
	for i := range blocks {
		if blocks[i], err = upload(b, vals[i*t*d:(i+1)*t*d], t, d); err != nil {
			return err
		}
	}
	q, err := upload(b, fused(query, g), 1, d)
	if err != nil {
		return err
	}
	num, _ := b.Alloc(compute.F32, 1, t, d)
	mx, _ := b.Alloc(compute.F32, 1, t)
	sum, _ := b.Alloc(compute.F32, 1, t)
	h, _ := b.Alloc(compute.F32, t, d)
	partial, _ := b.Alloc(compute.F32, t, d)
	if err := attnres.Prepare(b, &compute.AttnResPrepareArgs{Blocks: blocks, Queries: q, Eps: float32(eps), Num: num, Max: mx, Sum: sum}); err != nil {
		return err
	}
	if err := attnres.Update(b, &compute.AttnResUpdateArgs{Partial: partial, Query: q.Reshape(d), Eps: float32(eps),
		Num: num.Reshape(t, d), Max: mx.Reshape(t), Sum: sum.Reshape(t), H: h}); err != nil {
		return err
	}
	got, err := download(b, h)
	if err != nil {
		return err
	}
	chk.close("out", got, want, 1e-4, attnResRtol)
	return nil
}

func runAttnResTwoPhase(ctx context.Context, b compute.Backend, path string, chk *checker) error {
	f, err := openCase(path)
	if err != nil {
		return err
	}
	defer f.Close()
	queries, qs, err := f.f32("queries", -1, -1)
	if err != nil {
		return err
	}
	s, d := qs[0], qs[1]
	g, _, err := f.f32("norm_weights", s, d)
	if err != nil {
		return err
	}
	deltas, ds, err := f.f32("deltas", s, -1, d)
	if err != nil {
		return err
	}
	t := ds[1]
	eps, err := f.metaFloat("eps")
	if err != nil {
		return err
	}
	var blocks []compute.Tensor
	if f.has("blocks") {
		bv, bs, err := f.f32("blocks", -1, t, d)
		if err != nil {
			return err
		}
		for i := 0; i < bs[0]; i++ {
			bt, err := upload(b, bv[i*t*d:(i+1)*t*d], t, d)
			if err != nil {
				return err
			}
			blocks = append(blocks, bt)
		}
	}
	fq := make([]float32, s*d)
	for i := 0; i < s; i++ {
		attnres.FuseQuery(fq[i*d:(i+1)*d], queries[i*d:(i+1)*d], g[i*d:(i+1)*d])
	}
	wantFQ, _, err := f.f32("fused_queries", s, d)
	if err != nil {
		return err
	}
	chk.close("fused_queries", fq, wantFQ, attnResAtol, attnResRtol)
	q, err := upload(b, fq, s, d)
	if err != nil {
		return err
	}
	num, _ := b.Alloc(compute.F32, s, t, d)
	mx, _ := b.Alloc(compute.F32, s, t)
	sum, _ := b.Alloc(compute.F32, s, t)
	if err := attnres.Prepare(b, &compute.AttnResPrepareArgs{Blocks: blocks, Queries: q, Eps: float32(eps), Num: num, Max: mx, Sum: sum}); err != nil {
		return err
	}
	for _, c := range []struct {
		name string
		t    compute.Tensor
	}{{"phase1_numerator", num}, {"phase1_logit_max", mx}, {"phase1_exp_sum", sum}} {
		got, err := download(b, c.t)
		if err != nil {
			return err
		}
		want, _, err := f.f32(c.name)
		if err != nil {
			return err
		}
		chk.close(c.name, got, want, attnResAtol, attnResRtol)
	}
	present := strings.Fields(strings.NewReplacer("[", " ", "]", " ", ",", " ").Replace(f.Metadata()["partial_present"]))
	if len(present) != s {
		return fmt.Errorf("%s: metadata partial_present %q does not list %d sublayers", path, f.Metadata()["partial_present"], s)
	}
	partial, _ := b.Alloc(compute.F32, t, d)
	has := false
	if f.has("initial_partial") {
		ip, _, err := f.f32("initial_partial", t, d)
		if err != nil {
			return err
		}
		if err := b.Write(partial, ip); err != nil {
			return err
		}
		has = true
	}
	wantP, _, err := f.f32("partials", s, t, d)
	if err != nil {
		return err
	}
	wantH, _, err := f.f32("h", s, t, d)
	if err != nil {
		return err
	}
	h, _ := b.Alloc(compute.F32, t, d)
	for i := 0; i < s; i++ {
		a := compute.AttnResUpdateArgs{Partial: partial, HasPartial: has, Query: q.Rows(i, i+1).Reshape(d), Eps: float32(eps),
			Num: num.Rows(i, i+1).Reshape(t, d), Max: mx.Rows(i, i+1).Reshape(t), Sum: sum.Rows(i, i+1).Reshape(t), H: h}
		if i > 0 {
			dt, err := upload(b, deltas[(i-1)*t*d:i*t*d], t, d)
			if err != nil {
				return err
			}
			a.Delta = dt
		}
		if err := attnres.Update(b, &a); err != nil {
			return err
		}
		has = a.HasPartial
		if has != (present[i] == "1") {
			return fmt.Errorf("sublayer %d: partial present %v, metadata says %s", i, has, present[i])
		}
		if has {
			got, err := download(b, partial)
			if err != nil {
				return err
			}
			chk.close(fmt.Sprintf("partials[%d]", i), got, wantP[i*t*d:(i+1)*t*d], attnResAtol, attnResRtol)
		}
		got, err := download(b, h)
		if err != nil {
			return err
		}
		chk.close(fmt.Sprintf("h[%d]", i), got, wantH[i*t*d:(i+1)*t*d], attnResAtol, attnResRtol)
	}
	return nil
}

func runAttnResStack(ctx context.Context, b compute.Backend, path string, chk *checker) error {
	f, err := openCase(path)
	if err != nil {
		return err
	}
	defer f.Close()
	emb, es, err := f.f32("embedding", -1, -1)
	if err != nil {
		return err
	}
	t, d := es[0], es[1]
	rq, rs, err := f.f32("res_query", -1, d)
	if err != nil {
		return err
	}
	j := rs[0]
	rg, _, err := f.f32("res_norm_weight", j, d)
	if err != nil {
		return err
	}
	pre, _, err := f.f32("pre_norm_weight", j, d)
	if err != nil {
		return err
	}
	sw, _, err := f.f32("sublayer_weight", j, d, d)
	if err != nil {
		return err
	}
	oq, _, err := f.f32("output_res_query", d)
	if err != nil {
		return err
	}
	og, _, err := f.f32("output_res_norm_weight", d)
	if err != nil {
		return err
	}
	fg, _, err := f.f32("final_norm_weight", d)
	if err != nil {
		return err
	}
	eps, err := f.metaFloat("eps")
	if err != nil {
		return err
	}
	per := 1
	if f.Metadata()["kind"] == "block" {
		if per, err = f.metaInt("block_sublayers"); err != nil {
			return err
		}
	}
	fq := make([]float32, j*d)
	for i := 0; i < j; i++ {
		attnres.FuseQuery(fq[i*d:(i+1)*d], rq[i*d:(i+1)*d], rg[i*d:(i+1)*d])
	}
	queries, err := upload(b, fq, j, d)
	if err != nil {
		return err
	}
	outQ, err := upload(b, fused(oq, og), d)
	if err != nil {
		return err
	}
	st, err := attnres.NewStream(b, queries, outQ, per, t, float32(eps))
	if err != nil {
		return err
	}
	x, err := upload(b, emb, t, d)
	if err != nil {
		return err
	}
	if err := st.Begin(x); err != nil {
		return err
	}
	wantIn, _, err := f.f32("sublayer_inputs", j, t, d)
	if err != nil {
		return err
	}
	wantOut, _, err := f.f32("sublayer_outputs", j, t, d)
	if err != nil {
		return err
	}
	h, _ := b.Alloc(compute.F32, t, d)
	normed, _ := b.Alloc(compute.F32, t, d)
	var y compute.Tensor
	for i := 0; i < j; i++ {
		if err := st.Next(y, h, attnres.Norm{}); err != nil {
			return err
		}
		got, err := download(b, h)
		if err != nil {
			return err
		}
		chk.close(fmt.Sprintf("sublayer_inputs[%d]", i), got, wantIn[i*t*d:(i+1)*t*d], attnResAtol, attnResRtol)
		g, err := upload(b, pre[i*d:(i+1)*d], d)
		if err != nil {
			return err
		}
		w, err := upload(b, sw[i*d*d:(i+1)*d*d], d, d)
		if err != nil {
			return err
		}
		if err := b.RMSNorm(normed, h, g, float32(eps)); err != nil {
			return err
		}
		y, _ = b.Alloc(compute.F32, t, d)
		if err := b.MatMul(y, normed, w); err != nil {
			return err
		}
		got, err = download(b, y)
		if err != nil {
			return err
		}
		chk.close(fmt.Sprintf("sublayer_outputs[%d]", i), got, wantOut[i*t*d:(i+1)*t*d], attnResAtol, attnResRtol)
	}
	if err := st.Final(y, h, attnres.Norm{}); err != nil {
		return err
	}
	blocks := st.Blocks()
	wantB, bs, err := f.f32("blocks", -1, t, d)
	if err != nil {
		return err
	}
	if len(blocks) != bs[0] {
		return fmt.Errorf("%d blocks committed, want %d", len(blocks), bs[0])
	}
	for i, blk := range blocks {
		got, err := download(b, blk)
		if err != nil {
			return err
		}
		chk.close(fmt.Sprintf("blocks[%d]", i), got, wantB[i*t*d:(i+1)*t*d], attnResAtol, attnResRtol)
	}
	p, _ := st.Partial()
	got, err := download(b, p)
	if err != nil {
		return err
	}
	want, _, err := f.f32("final_partial", t, d)
	if err != nil {
		return err
	}
	chk.close("final_partial", got, want, attnResAtol, attnResRtol)
	if got, err = download(b, h); err != nil {
		return err
	}
	if want, _, err = f.f32("output_aggregate", t, d); err != nil {
		return err
	}
	chk.close("output_aggregate", got, want, attnResAtol, attnResRtol)
	fgT, err := upload(b, fg, d)
	if err != nil {
		return err
	}
	if err := b.RMSNorm(normed, h, fgT, float32(eps)); err != nil {
		return err
	}
	if got, err = download(b, normed); err != nil {
		return err
	}
	if want, _, err = f.f32("final_hidden", t, d); err != nil {
		return err
	}
	chk.close("final_hidden", got, want, attnResAtol, attnResRtol)
	return nil
}
