package conform

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/internal/kernel"
)

// TestBF16IndexerAccuracy measures the bf16 Lightning Indexer's
// arithmetic (kernel.IndexerBlockBF16, the tile the fast backend's
// indexer runs for a group's rows; its Go twin where the CPU lacks
// VDPBF16PS) on the indexer cases, against their float64 goldens.
// Rounding q and k to bf16 moves a head's dot product by at most 2^-8 of
// Σ|q_d·k_d| (each operand within 2^-9 of itself), so a key's score lies
// within B = 2^-8·Σ_h |w_h|·Σ_d |q_hd·k_d| (plus float32 accumulation) of
// the golden's; and a key is picked over another only if the goldens'
// scores allow it within both keys' bounds. The share of the goldens'
// picks kept is logged (docs/bench reports it). The cases have 8 index
// heads, too few for the backend to take the bf16 path
// (cpu.NewFastBF16Indexer), so the tile is driven here directly.
func TestBF16IndexerAccuracy(t *testing.T) {
	for _, name := range []string{"li_core_prefill_T200_K32", "li_core_tnd_batch3_K16"} {
		t.Run(name, func(t *testing.T) {
			f, err := openCase("../../testdata/dsa/" + name + ".safetensors")
			require.NoError(t, err)
			defer f.Close()
			q, qs, err := f.f32("q", -1, -1, -1)
			require.NoError(t, err)
			tq, hi, di := qs[0], qs[1], qs[2]
			k, ks, err := f.f32("k", -1, di)
			require.NoError(t, err)
			w, _, err := f.f32("w", tq, hi)
			require.NoError(t, err)
			qpos, _, err := f.i32("q_pos", tq)
			require.NoError(t, err)
			want, ss, err := f.f32("scores", tq, -1)
			require.NoError(t, err)
			wantIdx, _, err := f.i32("topk_indices", tq, -1)
			require.NoError(t, err)
			topK, err := f.metaInt("K")
			require.NoError(t, err)
			cuQ, cuK := []int32{0, int32(tq)}, []int32{0, int32(ks[0])}
			if f.has("cu_seqlens_q") {
				cuQ, _, err = f.i32("cu_seqlens_q", -1)
				require.NoError(t, err)
				cuK, _, err = f.i32("cu_seqlens_k", len(cuQ))
				require.NoError(t, err)
			}
			// Each row's scores by the bf16 block tile, its picks by the
			// backend's top-k.
			const nk = kernel.IndexerKeys
			got, idx := make([]float32, tq*ss[1]), make([]int32, tq*topK)
			qb, kt, kb := make([]uint16, hi*di), make([]uint32, di/2*nk), make([]uint16, di)
			for row := range tq {
				s := 0
				for int(cuQ[s+1]) <= row {
					s++
				}
				vis := int(qpos[row]) + 1
				kernel.RoundBF16DAZ(qb, q[row*hi*di:(row+1)*hi*di])
				scores := make([]float32, (vis+nk-1)/nk*nk)
				for s0 := 0; s0 < vis; s0 += nk {
					clear(kt)
					for c := range min(nk, vis-s0) {
						key := int(cuK[s]) + s0 + c
						kernel.KeyPairsBF16(kt, c, k[key*di:(key+1)*di], kb)
					}
					kernel.IndexerBlockBF16(scores[s0:], kt, qb, w[row*hi:(row+1)*hi], hi, di)
				}
				copy(got[row*ss[1]:], scores[:vis])
				out := idx[row*topK : (row+1)*topK]
				for i := kernel.TopK(out, nil, scores[:vis], topK); i < topK; i++ {
					out[i] = -1
				}
			}
			same, picks, worst := 0, 0, 0.0
			for row := range tq {
				s := 0
				for int(cuQ[s+1]) <= row {
					s++
				}
				vis := int(qpos[row]) + 1
				bound := make([]float64, vis)
				for key := range vis {
					kv := k[(int(cuK[s])+key)*di:][:di]
					for h := range hi {
						var mag float64
						for d, x := range kv {
							mag += math.Abs(float64(q[(row*hi+h)*di+d]) * float64(x))
						}
						bound[key] += math.Abs(float64(w[row*hi+h])) * mag
					}
					bound[key] = bound[key]/256 + 1e-4
					g, e := float64(got[row*ss[1]+key]), float64(want[row*ss[1]+key])
					require.InDelta(t, e, g, bound[key], "row %d key %d", row, key)
					worst = math.Max(worst, math.Abs(g-e)/bound[key])
				}
				picked := make([]bool, vis)
				for _, p := range idx[row*topK : (row+1)*topK] {
					if p >= 0 {
						picked[p] = true
					}
				}
				for _, p := range wantIdx[row*topK : (row+1)*topK] {
					if p >= 0 {
						picks++
						if picked[p] {
							same++
						}
					}
				}
				for p := range vis {
					for u := range vis {
						if picked[p] && !picked[u] {
							gp, gu := float64(want[row*ss[1]+p]), float64(want[row*ss[1]+u])
							require.GreaterOrEqual(t, gp, gu-bound[p]-bound[u], "row %d: key %d picked over key %d", row, p, u)
						}
					}
				}
			}
			t.Logf("%s (%d heads of %d): %d of the goldens' %d picks kept (%.2f%%); score errors at most %.3f of the bound",
				name, hi, di, same, picks, 100*float64(same)/float64(picks), worst)
			require.Positive(t, picks)
		})
	}
}
