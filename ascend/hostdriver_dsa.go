package ascend

import (
	"cmp"
	"math"
	"slices"

	"k3/ascend/internal/acl"
)

// The host driver's fused DSA operators compute in float64 over the
// 16-bit operands as stored, and check the shapes and limits the CANN
// documentation states, so that a call the device would refuse fails
// here too.

// hasOperator reports true: the host driver implements every operator it
// is asked for (the others fail at preparation).
func (d *hostDriver) hasOperator(string) bool { return true }

// contiguous reports whether every tensor is a contiguous view.
func contiguous(ts ...*hostTensor) bool {
	for _, t := range ts {
		if _, ok := t.contiguousRows(); !ok {
			return false
		}
	}
	return true
}

func shapeIs(t *hostTensor, dims ...int64) bool { return slices.Equal(t.dims, dims) }

func half(dt acl.DataType) bool { return dt == acl.BF16 || dt == acl.Float16 }

func (d *hostDriver) lightningIndexer(q, k, weights, actSeqK, blockTable tensorDesc, sparseCount int, indices tensorDesc) (prepared, error) {
	api := "aclnnLightningIndexerGetWorkspaceSize"
	ts, err := operands(api, q, k, weights, actSeqK, blockTable, indices)
	if err != nil {
		return nil, err
	}
	tq, tk, tw, kl, bt, ix := ts[0], ts[1], ts[2], ts[3], ts[4], ts[5]
	ok := len(tq.dims) == 4 && len(tk.dims) == 4 && len(bt.dims) == 2 && contiguous(ts...)
	if ok {
		S1, N1, D, bs, K := tq.dims[1], tq.dims[2], tq.dims[3], tk.dims[1], int64(sparseCount)
		ok = tq.dims[0] == 1 && half(tq.dt) && tk.dt == tq.dt && tw.dt == tq.dt &&
			D == 128 && N1 >= 1 && N1 <= 64 && shapeIs(tk, tk.dims[0], bs, 1, D) && bs%16 == 0 && bs <= 1024 &&
			shapeIs(tw, 1, S1, N1) && shapeIs(kl, 1) && kl.dt == acl.Int32 && bt.dims[0] == 1 && bt.dt == acl.Int32 &&
			shapeIs(ix, 1, S1, 1, K) && ix.dt == acl.Int32 && ((K >= 1 && K <= 2048) || (K >= 3072 && K <= 8192))
	}
	if !ok {
		return nil, hostErr(acl.ACLNN, 161002, api, "q %v (type %d), k %v, weights %v, key count %v, block table %v, sparse count %d, indices %v: "+
			"q [1, S1, N1 ≤ 64, 128] and k [blocks, 16k ≤ 1024, 1, 128] in one 16-bit type expected", tq.dims, tq.dt, tk.dims, tw.dims, kl.dims, bt.dims, sparseCount, ix.dims)
	}
	S1, N1, D, bs, K, P := tq.dims[1], tq.dims[2], tq.dims[3], tk.dims[1], int64(sparseCount), bt.dims[1]
	run := func([]byte) error {
		sk := int64(kl.get(kl.offset))
		if sk < 0 || sk > P*bs {
			return hostErr(acl.ACL, 507015, "aclnnLightningIndexer", "%d keys in %d blocks of %d", sk, P, bs)
		}
		// row is where key s starts in k's storage.
		row := func(s int64) (int64, error) {
			blk := int64(bt.get(bt.offset + s/bs))
			if blk < 0 || blk >= tk.dims[0] {
				return 0, hostErr(acl.ACL, 507015, "aclnnLightningIndexer", "block %d outside [0, %d)", blk, tk.dims[0])
			}
			return tk.offset + (blk*bs+s%bs)*D, nil
		}
		type cand struct {
			pos   int64
			score float64
		}
		var cands []cand
		for i := range S1 {
			cands = cands[:0]
			for s := int64(0); s <= sk-S1+i && s < sk; s++ {
				r, err := row(s)
				if err != nil {
					return err
				}
				var score float64
				for h := range N1 {
					qo := tq.offset + (i*N1+h)*D
					var dot float64
					for c := range D {
						dot += tq.get(qo+c) * tk.get(r+c)
					}
					score += tw.get(tw.offset+i*N1+h) * max(dot, 0)
				}
				cands = append(cands, cand{s, score})
			}
			slices.SortStableFunc(cands, func(a, b cand) int { return cmp.Compare(b.score, a.score) })
			for j := range K {
				v := int64(-1)
				if j < int64(len(cands)) {
					v = cands[j].pos
				}
				ix.put(ix.offset+i*K+j, float64(v))
			}
		}
		return nil
	}
	return &hostOp{d: d, api: "aclnnLightningIndexer", run: run}, nil
}

func (d *hostDriver) sparseFlashAttention(q, kv, indices, blockTable, actSeqQ, actSeqKV, qRope, kRope tensorDesc, scale float64, out, softmaxMax, softmaxSum tensorDesc) (prepared, error) {
	api := "aclnnSparseFlashAttentionGetWorkspaceSize"
	ts, err := operands(api, q, kv, indices, blockTable, actSeqQ, actSeqKV, qRope, kRope, out, softmaxMax, softmaxSum)
	if err != nil {
		return nil, err
	}
	tq, tkv, ix, bt, sq, skv, tqr, tkr, o, mx, sm := ts[0], ts[1], ts[2], ts[3], ts[4], ts[5], ts[6], ts[7], ts[8], ts[9], ts[10]
	ok := len(tq.dims) == 3 && len(tkv.dims) == 4 && len(ix.dims) == 3 && len(bt.dims) == 2 && len(tqr.dims) == 3 && contiguous(ts...)
	if ok {
		T, N, Dc, Dr, bs := tq.dims[0], tq.dims[1], tq.dims[2], tqr.dims[2], tkv.dims[1]
		ok = half(tq.dt) && tkv.dt == tq.dt && tqr.dt == tq.dt && tkr.dt == tq.dt && o.dt == tq.dt &&
			shapeIs(tkv, tkv.dims[0], bs, 1, Dc) && shapeIs(tkr, tkv.dims[0], bs, 1, Dr) && shapeIs(tqr, T, N, Dr) &&
			ix.dims[0] == T && ix.dims[1] == 1 && ix.dt == acl.Int32 && bt.dims[0] == 1 && bt.dt == acl.Int32 &&
			shapeIs(sq, 1) && shapeIs(skv, 1) && sq.dt == acl.Int32 && skv.dt == acl.Int32 && shapeIs(o, T, N, Dc) &&
			shapeIs(mx, 1, T, N) && shapeIs(sm, 1, T, N) && mx.dt == acl.Float && sm.dt == acl.Float
	}
	if !ok {
		return nil, hostErr(acl.ACLNN, 161002, api, "q %v (type %d), kv %v, indices %v, block table %v, q rope %v, k rope %v, out %v, max %v, sum %v do not match",
			tq.dims, tq.dt, tkv.dims, ix.dims, bt.dims, tqr.dims, tkr.dims, o.dims, mx.dims, sm.dims)
	}
	T, N, Dc, Dr, bs, K, P := tq.dims[0], tq.dims[1], tq.dims[2], tqr.dims[2], tkv.dims[1], ix.dims[2], bt.dims[1]
	run := func([]byte) error {
		nq, sk := int64(sq.get(sq.offset)), int64(skv.get(skv.offset))
		if nq != T || sk < 0 || sk > P*bs {
			return hostErr(acl.ACL, 507015, "aclnnSparseFlashAttention", "%d queries of %d, %d keys in %d blocks of %d", nq, T, sk, P, bs)
		}
		var rows []int64 // the storage rows of a query's valid keys
		z := make([]float64, K)
		acc := make([]float64, Dc)
		for t := range T {
			rows = rows[:0]
			lim := min(sk-1, sk-T+t)
			for j := range K {
				s := int64(ix.get(ix.offset + t*K + j))
				if s < 0 || s > lim {
					continue
				}
				blk := int64(bt.get(bt.offset + s/bs))
				if blk < 0 || blk >= tkv.dims[0] {
					return hostErr(acl.ACL, 507015, "aclnnSparseFlashAttention", "block %d outside [0, %d)", blk, tkv.dims[0])
				}
				rows = append(rows, blk*bs+s%bs)
			}
			for h := range N {
				m := math.Inf(-1)
				for j, r := range rows {
					var dot float64
					qo, qro := tq.offset+(t*N+h)*Dc, tqr.offset+(t*N+h)*Dr
					for c := range Dc {
						dot += tq.get(qo+c) * tkv.get(tkv.offset+r*Dc+c)
					}
					for c := range Dr {
						dot += tqr.get(qro+c) * tkr.get(tkr.offset+r*Dr+c)
					}
					z[j] = scale * dot
					m = max(m, z[j])
				}
				clear(acc)
				var sum float64
				for j, r := range rows {
					e := math.Exp(z[j] - m)
					sum += e
					for c := range Dc {
						acc[c] += e * tkv.get(tkv.offset+r*Dc+c)
					}
				}
				for c := range Dc {
					v := 0.0
					if sum > 0 {
						v = acc[c] / sum
					}
					o.put(o.offset+(t*N+h)*Dc+c, v)
				}
				mx.put(mx.offset+t*N+h, m)
				sm.put(sm.offset+t*N+h, sum)
			}
		}
		return nil
	}
	return &hostOp{d: d, api: "aclnnSparseFlashAttention", run: run}, nil
}
