package conform

import (
	"context"
	"fmt"
	"math"

	"k3/compute"
)

func init() { handlers["dsa.indexer_module"] = runIndexerModule }

// hadamard applies the Sylvester-order Hadamard transform scaled by n^-1/2
// to every row of width n (DeepSeek's indexer rotation; orthonormal, so it
// changes no score: it is applied here only to compare the stored
// intermediates).
func hadamard(x []float32, n int) {
	s := float32(1 / math.Sqrt(float64(n)))
	for r := 0; r+n <= len(x); r += n {
		row := x[r : r+n]
		for h := 1; h < n; h *= 2 {
			for i := 0; i < n; i += 2 * h {
				for j := i; j < i+h; j++ {
					a, b := row[j], row[j+h]
					row[j], row[j+h] = a+b, a-b
				}
			}
		}
		for i := range row {
			row[i] *= s
		}
	}
}

func runIndexerModule(ctx context.Context, b compute.Backend, path string, chk *checker) error {
	f, err := openCase(path)
	if err != nil {
		return err
	}
	defer f.Close()
	hi, err := f.metaInt("index_n_heads")
	if err != nil {
		return err
	}
	di, err := f.metaInt("index_head_dim")
	if err != nil {
		return err
	}
	rope, err := f.metaInt("rope_dim")
	if err != nil {
		return err
	}
	theta, err := f.metaFloat("rope_theta")
	if err != nil {
		return err
	}
	topK, err := f.metaInt("K")
	if err != nil {
		return err
	}
	eps, err := f.metaFloat("layernorm_eps")
	if err != nil {
		return err
	}
	x, xs, err := f.f32("x", -1, -1)
	if err != nil {
		return err
	}
	t, dim := xs[0], xs[1]
	qr, qs, err := f.f32("qr", t, -1)
	if err != nil {
		return err
	}
	qlora := qs[1]
	tensors := map[string][]int{"wq_b": {hi * di, qlora}, "wk": {di, dim}, "k_norm_weight": {di}, "k_norm_bias": {di}, "weights_proj": {hi, dim}}
	up := map[string]compute.Tensor{}
	for name, dims := range tensors {
		v, _, err := f.f32(name, dims...)
		if err != nil {
			return err
		}
		if up[name], err = upload(b, v, dims...); err != nil {
			return err
		}
	}
	xt, err := upload(b, x, t, dim)
	if err != nil {
		return err
	}
	qrt, err := upload(b, qr, t, qlora)
	if err != nil {
		return err
	}
	pos := make([]int32, t)
	for i := range pos {
		pos[i] = int32(i)
	}
	q, _ := b.Alloc(compute.F32, t, hi, di)
	if err := b.MatMul(q.Reshape(t, hi*di), qrt, up["wq_b"]); err != nil {
		return err
	}
	k, _ := b.Alloc(compute.F32, t, di)
	if err := b.MatMul(k, xt, up["wk"]); err != nil {
		return err
	}
	if err := b.LayerNorm(k, k, up["k_norm_weight"], up["k_norm_bias"], float32(eps)); err != nil {
		return err
	}
	pt, err := b.Alloc(compute.I32, t)
	if err != nil {
		return err
	}
	if err := b.Write(pt, pos); err != nil {
		return err
	}
	for _, x := range []compute.Tensor{q, k} {
		if err := b.RoPE(&compute.RopeArgs{X: x, Pos: pt, MaxPos: t, Dims: rope, Theta: theta}); err != nil {
			return err
		}
	}
	w, _ := b.Alloc(compute.F32, t, hi)
	if err := b.MatMul(w, xt, up["weights_proj"]); err != nil {
		return err
	}
	wv, err := download(b, w)
	if err != nil {
		return err
	}
	scale := float32(1 / math.Sqrt(float64(hi*di)))
	for i := range wv {
		wv[i] *= scale
	}
	qv, err := download(b, q)
	if err != nil {
		return err
	}
	kv, err := download(b, k)
	if err != nil {
		return err
	}
	hadamard(qv, di)
	hadamard(kv, di)
	for _, c := range []struct {
		name string
		got  []float32
	}{{"q_index", qv}, {"k_index", kv}, {"w_index", wv}} {
		want, _, err := f.f32(c.name)
		if err != nil {
			return err
		}
		chk.close(c.name, c.got, want, 1e-5, 1e-5)
	}
	if _, err := indexer(b, chk, f, "", qv, kv, wv, t, hi, di, t, topK, pos, nil, nil); err != nil {
		return fmt.Errorf("indexer: %w", err)
	}
	return nil
}
