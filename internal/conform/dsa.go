package conform

import (
	"context"
	"fmt"

	"k3/compute"
	"k3/dsa"
)

func init() {
	handlers["dsa.indexer"] = runIndexer
	handlers["dsa.indexer_varlen"] = runIndexer
	handlers["dsa.sparse_gqa"] = runSparseGQA
	handlers["dsa.sparse_mla"] = runSparseMLA
	handlers["dsa.decode"] = runDSADecode
	handlers["dsa.dense_equiv"] = runDenseEquiv
}

// Tolerances from testdata/dsa/README.md: scores 1e-4 absolute, attention
// outputs and lse 1e-5; index lists exact.
const scoreAtol, attnAtol = 1e-4, 1e-5

// indexer runs the Lightning Indexer on host inputs and compares.
func indexer(b compute.Backend, chk *checker, f *caseFile, prefix string, q, k, w []float32, t, hi, di, l, topK int, qpos, cuQ, cuK []int32) ([]int32, error) {
	qt, err := upload(b, q, t, hi, di)
	if err != nil {
		return nil, err
	}
	kt, err := upload(b, k, l, di)
	if err != nil {
		return nil, err
	}
	wt, err := upload(b, w, t, hi)
	if err != nil {
		return nil, err
	}
	want, ss, err := f.f32("scores", t, -1)
	if err != nil {
		return nil, err
	}
	idx, _ := b.Alloc(compute.I32, t, topK)
	cnt, _ := b.Alloc(compute.I32, t)
	scores, _ := b.Alloc(compute.F32, t, ss[1])
	qposT, err := b.Alloc(compute.I32, t)
	if err != nil {
		return nil, err
	}
	if err := b.Write(qposT, qpos); err != nil {
		return nil, err
	}
	if err := b.LightningIndexer(&compute.IndexerArgs{Q: qt, K: kt, W: wt, QPos: qposT, CuSeqlensQ: cuQ, CuSeqlensK: cuK,
		TopK: topK, Indices: idx, Counts: cnt, Scores: scores}); err != nil {
		return nil, err
	}
	got, err := download(b, scores)
	if err != nil {
		return nil, err
	}
	chk.close(prefix+"scores", got, want, scoreAtol, 0)
	gi, err := downloadI32(b, idx)
	if err != nil {
		return nil, err
	}
	wi, _, err := f.i32("topk_indices", t, topK)
	if err != nil {
		return nil, err
	}
	chk.exact(prefix+"topk_indices", gi, wi)
	gc, err := downloadI32(b, cnt)
	if err != nil {
		return nil, err
	}
	wc, _, err := f.i32("topk_count", t)
	if err != nil {
		return nil, err
	}
	chk.exact(prefix+"topk_count", gc, wc)
	return gi, nil
}

func runIndexer(ctx context.Context, b compute.Backend, path string, chk *checker) error {
	f, err := openCase(path)
	if err != nil {
		return err
	}
	defer f.Close()
	q, qs, err := f.f32("q", -1, -1, -1)
	if err != nil {
		return err
	}
	t, hi, di := qs[0], qs[1], qs[2]
	k, ks, err := f.f32("k", -1, di)
	if err != nil {
		return err
	}
	w, _, err := f.f32("w", t, hi)
	if err != nil {
		return err
	}
	qpos, _, err := f.i32("q_pos", t)
	if err != nil {
		return err
	}
	var cuQ, cuK []int32
	if f.has("cu_seqlens_q") {
		if cuQ, _, err = f.i32("cu_seqlens_q", -1); err != nil {
			return err
		}
		if cuK, _, err = f.i32("cu_seqlens_k", len(cuQ)); err != nil {
			return err
		}
	}
	topK, err := f.metaInt("K")
	if err != nil {
		return err
	}
	_, err = indexer(b, chk, f, "", q, k, w, t, hi, di, ks[0], topK, qpos, cuQ, cuK)
	return err
}

func runSparseGQA(ctx context.Context, b compute.Backend, path string, chk *checker) error {
	f, err := openCase(path)
	if err != nil {
		return err
	}
	defer f.Close()
	q, qs, err := f.f32("q", -1, -1, -1)
	if err != nil {
		return err
	}
	t, hq, dk := qs[0], qs[1], qs[2]
	k, ks, err := f.f32("k", -1, -1, dk)
	if err != nil {
		return err
	}
	l, hkv := ks[0], ks[1]
	v, vs, err := f.f32("v", l, hkv, -1)
	if err != nil {
		return err
	}
	dv := vs[2]
	qpos, _, err := f.i32("q_pos", t)
	if err != nil {
		return err
	}
	idx, is, err := f.i32("indices", t, hkv, -1)
	if err != nil {
		return err
	}
	scale, _, err := f.f32("softmax_scale", 1)
	if err != nil {
		return err
	}
	qposT, err := upload(b, qpos, len(qpos))
	if err != nil {
		return err
	}
	a := compute.AttnArgs{QPos: qposT, KVLen: l, Scale: scale[0]}
	if a.Q, err = upload(b, q, t, hq, dk); err != nil {
		return err
	}
	if a.K, err = upload(b, k, l, hkv, dk); err != nil {
		return err
	}
	if a.V, err = upload(b, v, l, hkv, dv); err != nil {
		return err
	}
	if a.Indices, err = upload(b, idx, t, hkv, is[2]); err != nil {
		return err
	}
	for _, causal := range []bool{true, false} {
		a.Causal = causal
		a.Out, _ = b.Alloc(compute.F32, t, hq, dv)
		a.LSE, _ = b.Alloc(compute.F32, t, hq)
		if err := b.Attention(&a); err != nil {
			return err
		}
		suffix := "causal"
		if !causal {
			suffix = "nocausal"
		}
		if err := compareOut(b, chk, f, "out_"+suffix, a.Out, attnAtol); err != nil {
			return err
		}
		if err := compareOut(b, chk, f, "lse_"+suffix, a.LSE, attnAtol); err != nil {
			return err
		}
	}
	return nil
}

func compareOut(b compute.Backend, chk *checker, f *caseFile, name string, t compute.Tensor, atol float64) error {
	got, err := download(b, t)
	if err != nil {
		return err
	}
	want, _, err := f.f32(name)
	if err != nil {
		return err
	}
	chk.close(name, got, want, atol, 0)
	return nil
}

// mlaCase holds the absorbed-MLA operands of a case on the backend.
type mlaCase struct {
	qnope, qpe, kvc, kpe, ukT, uv compute.Tensor
	t, h, dn, dr, dv, dc, l       int
	scale                         float32
}

func loadMLA(b compute.Backend, f *caseFile, prefix string) (*mlaCase, error) {
	m := &mlaCase{}
	qn, qs, err := f.f32(prefix+"q_nope", -1, -1, -1)
	if err != nil {
		return nil, err
	}
	m.t, m.h, m.dn = qs[0], qs[1], qs[2]
	qp, ps, err := f.f32(prefix+"q_pe", m.t, m.h, -1)
	if err != nil {
		return nil, err
	}
	m.dr = ps[2]
	kv, kvs, err := f.f32(prefix+"kv_c", -1, -1)
	if err != nil {
		return nil, err
	}
	m.l, m.dc = kvs[0], kvs[1]
	kp, _, err := f.f32(prefix+"k_pe", m.l, m.dr)
	if err != nil {
		return nil, err
	}
	wkvb, ws, err := f.f32(prefix+"wkv_b", -1, m.dc)
	if err != nil {
		return nil, err
	}
	m.dv = ws[0]/m.h - m.dn
	ukT, uv, err := dsa.SplitKVB(wkvb, m.h, m.dn, m.dv, m.dc)
	if err != nil {
		return nil, err
	}
	sc, _, err := f.f32(prefix+"softmax_scale", 1)
	if err != nil {
		return nil, err
	}
	m.scale = sc[0]
	for _, u := range []struct {
		dst  *compute.Tensor
		v    []float32
		dims []int
	}{
		{&m.qnope, qn, []int{m.t, m.h, m.dn}}, {&m.qpe, qp, []int{m.t, m.h, m.dr}}, {&m.kvc, kv, []int{m.l, m.dc}},
		{&m.kpe, kp, []int{m.l, m.dr}}, {&m.ukT, ukT, []int{m.h, m.dc, m.dn}}, {&m.uv, uv, []int{m.h, m.dv, m.dc}},
	} {
		if *u.dst, err = upload(b, u.v, u.dims...); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// attend runs absorbed MQA attention over the latent cache: indices nil
// means dense causal. It returns q_absorbed, o_latent, lse and out.
func (m *mlaCase) attend(b compute.Backend, indices compute.Tensor) (qa, ol, lse, out compute.Tensor, err error) {
	qa, _ = b.Alloc(compute.F32, m.t, m.h, m.dc)
	if err = b.HeadMatMul(qa, m.qnope, m.ukT); err != nil {
		return
	}
	qpos := make([]int32, m.t)
	for i := range qpos {
		qpos[i] = int32(i)
	}
	ol, _ = b.Alloc(compute.F32, m.t, m.h, m.dc)
	lse, _ = b.Alloc(compute.F32, m.t, m.h)
	lat := m.kvc.Reshape(m.l, 1, m.dc)
	var qposT compute.Tensor
	if qposT, err = upload(b, qpos, len(qpos)); err != nil {
		return
	}
	a := compute.AttnArgs{Q: qa, QRope: m.qpe, K: lat, KRope: m.kpe, V: lat, Indices: indices, QPos: qposT, KVLen: m.l,
		Causal: true, Scale: m.scale, Out: ol, LSE: lse}
	if err = b.Attention(&a); err != nil {
		return
	}
	out, _ = b.Alloc(compute.F32, m.t, m.h, m.dv)
	err = b.HeadMatMul(out, ol, m.uv)
	return
}

func runSparseMLA(ctx context.Context, b compute.Backend, path string, chk *checker) error {
	f, err := openCase(path)
	if err != nil {
		return err
	}
	defer f.Close()
	m, err := loadMLA(b, f, "")
	if err != nil {
		return err
	}
	idx, is, err := f.i32("topk_indices", m.t, -1)
	if err != nil {
		return err
	}
	it, err := upload(b, idx, m.t, 1, is[1])
	if err != nil {
		return err
	}
	qa, ol, lse, out, err := m.attend(b, it)
	if err != nil {
		return err
	}
	for _, c := range []struct {
		name string
		t    compute.Tensor
	}{{"q_absorbed", qa}, {"o_latent", ol}, {"lse", lse}, {"out", out}} {
		if err := compareOut(b, chk, f, c.name, c.t, attnAtol); err != nil {
			return err
		}
	}
	return nil
}

func runDSADecode(ctx context.Context, b compute.Backend, path string, chk *checker) error {
	f, err := openCase(path)
	if err != nil {
		return err
	}
	defer f.Close()
	// s_q query rows at the last positions (several when a verification
	// pass scores drafted tokens): row i sits at l - s_q + i.
	qi, qs, err := f.f32("q_index", -1, -1, -1)
	if err != nil {
		return err
	}
	sq, hi, di := qs[0], qs[1], qs[2]
	ki, ks, err := f.f32("k_index", -1, di)
	if err != nil {
		return err
	}
	l := ks[0]
	if sq < 1 || sq > l {
		return fmt.Errorf("%s: %d query rows for %d keys", path, sq, l)
	}
	wi, _, err := f.f32("w_index", sq, hi)
	if err != nil {
		return err
	}
	topK, err := f.metaInt("K")
	if err != nil {
		return err
	}
	qpos := make([]int32, sq)
	for i := range qpos {
		qpos[i] = int32(l - sq + i)
	}
	picks, err := indexer(b, chk, f, "", qi, ki, wi, sq, hi, di, l, topK, qpos, nil, nil)
	if err != nil {
		return err
	}
	ql, qls, err := f.f32("q_latent", sq, -1, -1)
	if err != nil {
		return err
	}
	h, dc := qls[1], qls[2]
	qp, ps, err := f.f32("q_pe", sq, h, -1)
	if err != nil {
		return err
	}
	dr := ps[2]
	kv, _, err := f.f32("kv_c", l, dc)
	if err != nil {
		return err
	}
	kp, _, err := f.f32("k_pe", l, dr)
	if err != nil {
		return err
	}
	sc, _, err := f.f32("softmax_scale", 1)
	if err != nil {
		return err
	}
	qposT, err := upload(b, qpos, len(qpos))
	if err != nil {
		return err
	}
	a := compute.AttnArgs{QPos: qposT, KVLen: l, Causal: true, Scale: sc[0]}
	if a.Q, err = upload(b, ql, sq, h, dc); err != nil {
		return err
	}
	if a.QRope, err = upload(b, qp, sq, h, dr); err != nil {
		return err
	}
	lat, err := upload(b, kv, l, 1, dc)
	if err != nil {
		return err
	}
	a.K, a.V = lat, lat
	if a.KRope, err = upload(b, kp, l, dr); err != nil {
		return err
	}
	for _, sparse := range []bool{true, false} {
		a.Indices = compute.Tensor{}
		suffix := "_dense"
		if sparse {
			if a.Indices, err = upload(b, picks, sq, 1, topK); err != nil {
				return err
			}
			suffix = ""
		}
		a.Out, _ = b.Alloc(compute.F32, sq, h, dc)
		a.LSE, _ = b.Alloc(compute.F32, sq, h)
		if err := b.Attention(&a); err != nil {
			return err
		}
		if err := compareOut(b, chk, f, "o_latent"+suffix, a.Out, attnAtol); err != nil {
			return err
		}
		if err := compareOut(b, chk, f, "lse"+suffix, a.LSE, attnAtol); err != nil {
			return err
		}
	}
	return nil
}

func runDenseEquiv(ctx context.Context, b compute.Backend, path string, chk *checker) error {
	f, err := openCase(path)
	if err != nil {
		return err
	}
	defer f.Close()
	qi, qs, err := f.f32("q_index", -1, -1, -1)
	if err != nil {
		return err
	}
	t, hi, di := qs[0], qs[1], qs[2]
	ki, _, err := f.f32("k_index", t, di)
	if err != nil {
		return err
	}
	wi, _, err := f.f32("w_index", t, hi)
	if err != nil {
		return err
	}
	topK, err := f.metaInt("K")
	if err != nil {
		return err
	}
	qpos := make([]int32, t)
	for i := range qpos {
		qpos[i] = int32(i)
	}
	picks, err := indexer(b, chk, f, "", qi, ki, wi, t, hi, di, t, topK, qpos, nil, nil)
	if err != nil {
		return err
	}
	m, err := loadMLA(b, f, "")
	if err != nil {
		return err
	}
	it, err := upload(b, picks, t, 1, topK)
	if err != nil {
		return err
	}
	_, _, lse, sparse, err := m.attend(b, it)
	if err != nil {
		return err
	}
	_, _, lseD, dense, err := m.attend(b, compute.Tensor{})
	if err != nil {
		return err
	}
	for _, c := range []struct {
		name string
		t    compute.Tensor
	}{{"mla_out_sparse", sparse}, {"mla_out_dense", dense}, {"mla_lse", lse}, {"mla_lse", lseD}} {
		if err := compareOut(b, chk, f, c.name, c.t, attnAtol); err != nil {
			return err
		}
	}
	// GQA: the same picks for every kv head.
	gq, gs, err := f.f32("gqa_q", t, -1, -1)
	if err != nil {
		return err
	}
	hq, dk := gs[1], gs[2]
	gk, gks, err := f.f32("gqa_k", t, -1, dk)
	if err != nil {
		return err
	}
	hkv := gks[1]
	gv, gvs, err := f.f32("gqa_v", t, hkv, -1)
	if err != nil {
		return err
	}
	gsc, _, err := f.f32("gqa_softmax_scale", 1)
	if err != nil {
		return err
	}
	rep := make([]int32, 0, t*hkv*topK)
	for r := 0; r < t; r++ {
		for g := 0; g < hkv; g++ {
			rep = append(rep, picks[r*topK:(r+1)*topK]...)
		}
	}
	qposT, err := upload(b, qpos, len(qpos))
	if err != nil {
		return err
	}
	a := compute.AttnArgs{QPos: qposT, KVLen: t, Causal: true, Scale: gsc[0]}
	if a.Q, err = upload(b, gq, t, hq, dk); err != nil {
		return err
	}
	if a.K, err = upload(b, gk, t, hkv, dk); err != nil {
		return err
	}
	if a.V, err = upload(b, gv, t, hkv, gvs[2]); err != nil {
		return err
	}
	for _, sparse := range []bool{true, false} {
		name := "gqa_out_dense"
		a.Indices = compute.Tensor{}
		if sparse {
			name = "gqa_out_sparse"
			if a.Indices, err = upload(b, rep, t, hkv, topK); err != nil {
				return err
			}
		}
		a.Out, _ = b.Alloc(compute.F32, t, hq, gvs[2])
		a.LSE, _ = b.Alloc(compute.F32, t, hq)
		if err := b.Attention(&a); err != nil {
			return err
		}
		if err := compareOut(b, chk, f, name, a.Out, attnAtol); err != nil {
			return err
		}
		if err := compareOut(b, chk, f, "gqa_lse", a.LSE, attnAtol); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}
