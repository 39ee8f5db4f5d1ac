package ascend

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// attnCase is one Attention configuration.
type attnCase struct {
	name         string
	t, hq, hkv   int
	dk, dv, dr   int
	l, kvLen     int
	qpos         []int32
	lists, kn    int // 0: dense
	shared       bool
	paged        bool // pages of 64 rows
	causal, lse  bool
	idx          func(rng *rand.Rand, row, list, j int) int32 // sparse entries
	oneRowBlocks bool
}

// The Attention composition against the pure-Go backend over dense and
// index-sparse attention, shared and per-kv-head lists, MLA's shared
// key/value cache, rope parts, paged caches, -1 pads, indices past the
// cache length or past the query's position, a row with nothing to attend
// (zeros and LSE -Inf), and several row blocks.
func TestAttention(t *testing.T) {
	anyIdx := func(lim int) func(*rand.Rand, int, int, int) int32 {
		return func(rng *rand.Rand, _, _, _ int) int32 { return int32(rng.IntN(lim+1)) - 1 }
	}
	cases := []attnCase{
		{name: "dense mla", t: 3, hq: 4, hkv: 1, dk: 8, dv: 8, dr: 4, l: 9, kvLen: 7, qpos: []int32{4, 5, 6}, shared: true, lse: true},
		{name: "dense gqa", t: 4, hq: 4, hkv: 2, dk: 8, dv: 6, l: 6, kvLen: 6, qpos: []int32{0, 3, 4, 5}, lse: true},
		{name: "dense blocks", t: 5, hq: 2, hkv: 2, dk: 4, dv: 4, dr: 2, l: 8, kvLen: 8, qpos: []int32{3, 4, 5, 6, 7}, lse: true, oneRowBlocks: true},
		{name: "sparse shared", t: 4, hq: 4, hkv: 1, dk: 8, dv: 8, dr: 4, l: 12, kvLen: 10, qpos: []int32{2, 5, 8, 9},
			lists: 1, kn: 5, shared: true, causal: true, lse: true, idx: anyIdx(12)},
		{name: "sparse empty row", t: 2, hq: 2, hkv: 1, dk: 4, dv: 4, l: 6, kvLen: 6, qpos: []int32{1, 5},
			lists: 1, kn: 3, causal: true, lse: true, idx: func(_ *rand.Rand, row, _, j int) int32 {
				if row == 0 {
					return []int32{-1, 4, 5}[j] // nothing at or before position 1
				}
				return int32(j)
			}},
		{name: "sparse per head", t: 3, hq: 4, hkv: 2, dk: 6, dv: 5, dr: 2, l: 9, kvLen: 9, qpos: []int32{3, 6, 8},
			lists: 2, kn: 4, causal: true, lse: true, idx: anyIdx(9)},
		{name: "sparse not causal", t: 3, hq: 2, hkv: 1, dk: 4, dv: 3, l: 7, kvLen: 6, qpos: []int32{0, 1, 2},
			lists: 1, kn: 4, idx: anyIdx(7)},
		{name: "sparse blocks", t: 5, hq: 2, hkv: 1, dk: 4, dv: 4, dr: 2, l: 10, kvLen: 10, qpos: []int32{5, 6, 7, 8, 9},
			lists: 1, kn: 3, shared: true, causal: true, lse: true, idx: anyIdx(10), oneRowBlocks: true},
		{name: "paged dense mla", t: 2, hq: 2, hkv: 1, dk: 8, dv: 8, dr: 4, l: 128, kvLen: 70, qpos: []int32{68, 69}, shared: true, paged: true, lse: true},
		{name: "paged sparse", t: 3, hq: 4, hkv: 2, dk: 4, dv: 6, dr: 2, l: 128, kvLen: 100, qpos: []int32{63, 64, 99},
			lists: 1, kn: 6, paged: true, causal: true, lse: true, idx: anyIdx(100)},
	}
	eachDriver(t, 64<<20, func(t *testing.T, a *Backend) {
		c := cpu.New(1)
		defer c.Close()
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				if tc.oneRowBlocks {
					defer func(b int) { attnBudget = b }(attnBudget)
					attnBudget = 1 // one row a block: the blocks' offsets are exercised
				}
				rng := rand.New(rand.NewPCG(uint64(301+i), 302))
				in := attnInputs(rng, tc)
				want := runAttention(t, c, tc, in)
				got := runAttention(t, a, tc, in)
				sameFloats(t, want[0], got[0], 2e-5, "out")
				if tc.lse {
					sameFloats(t, want[1], got[1], 2e-5, "lse")
				}
			})
		}
	})
}

type attnData struct {
	q, qr, k, kr, v []float32
	idx             []int32
}

func attnInputs(rng *rand.Rand, tc attnCase) attnData {
	d := attnData{
		q: randF32(rng, tc.t*tc.hq*tc.dk),
		k: randF32(rng, tc.l*tc.hkv*tc.dk),
		v: randF32(rng, tc.l*tc.hkv*tc.dv),
	}
	if tc.dr > 0 {
		d.qr, d.kr = randF32(rng, tc.t*tc.hq*tc.dr), randF32(rng, tc.l*tc.dr)
	}
	if tc.shared {
		d.v = d.k
	}
	if tc.lists > 0 {
		d.idx = make([]int32, tc.t*tc.lists*tc.kn)
		for row := range tc.t {
			for l := range tc.lists {
				for j := range tc.kn {
					d.idx[(row*tc.lists+l)*tc.kn+j] = tc.idx(rng, row, l, j)
				}
			}
		}
	}
	return d
}

// runAttention runs the case on be and returns Out and LSE.
func runAttention(t *testing.T, be compute.Backend, tc attnCase, d attnData) [2][]float32 {
	t.Helper()
	up := func(v []float32, shape ...int) compute.Tensor {
		x, err := be.FromHost(compute.F32, compute.F32, f32bytes(v), shape...)
		require.NoError(t, err)
		return x
	}
	pages := func(v []float32, width int) []compute.Tensor {
		var ps []compute.Tensor
		for p := 0; p*64 < tc.l; p++ {
			ps = append(ps, up(v[p*64*width:(p+1)*64*width], 64, width))
		}
		return ps
	}
	a := &compute.AttnArgs{Q: up(d.q, tc.t, tc.hq, tc.dk), QPos: positions(t, be, tc.qpos), KVLen: tc.kvLen, Causal: tc.causal, Scale: 1 / float32(math.Sqrt(float64(tc.dk+tc.dr)))}
	if tc.dr > 0 {
		a.QRope = up(d.qr, tc.t, tc.hq, tc.dr)
	}
	if tc.paged {
		require.Zero(t, tc.l%64)
		a.PageSize = 64
		a.KPages = pages(d.k, tc.hkv*tc.dk)
		for i := range a.KPages {
			a.KPages[i] = a.KPages[i].Reshape(64, tc.hkv, tc.dk)
		}
		if !tc.shared {
			a.VPages = pages(d.v, tc.hkv*tc.dv)
			for i := range a.VPages {
				a.VPages[i] = a.VPages[i].Reshape(64, tc.hkv, tc.dv)
			}
		}
		if tc.dr > 0 {
			a.KRopePages = pages(d.kr, tc.dr)
		}
	} else {
		a.K = up(d.k, tc.l, tc.hkv, tc.dk)
		a.V = a.K
		if !tc.shared {
			a.V = up(d.v, tc.l, tc.hkv, tc.dv)
		}
		if tc.dr > 0 {
			a.KRope = up(d.kr, tc.l, tc.dr)
		}
	}
	if tc.lists > 0 {
		ix, err := be.FromHost(compute.I32, compute.I32, i32bytes(d.idx), tc.t, tc.lists, tc.kn)
		require.NoError(t, err)
		a.Indices = ix
	}
	var err error
	a.Out, err = be.Alloc(compute.F32, tc.t, tc.hq, tc.dv)
	require.NoError(t, err)
	require.NoError(t, be.Fill(a.Out, 7), "stale output values must be overwritten")
	if tc.lse {
		a.LSE, err = be.Alloc(compute.F32, tc.t, tc.hq)
		require.NoError(t, err)
	}
	require.NoError(t, be.Attention(a))
	out := [2][]float32{read(t, be, a.Out)}
	if tc.lse {
		out[1] = read(t, be, a.LSE)
	}
	return out
}

// sameFloats requires got to match want within tol (absolute plus
// relative), infinities exactly, and no NaN anywhere.
func sameFloats(t *testing.T, want, got []float32, tol float64, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for i := range want {
		w, g := float64(want[i]), float64(got[i])
		msg := fmt.Sprintf("%s element %d: %g, want %g", what, i, g, w)
		require.False(t, math.IsNaN(w) || math.IsNaN(g), msg)
		if math.IsInf(w, 0) || math.IsInf(g, 0) {
			require.Equal(t, w, g, msg)
			continue
		}
		require.LessOrEqual(t, math.Abs(g-w), tol*(1+math.Abs(w)), msg)
	}
}

func i32bytes(v []int32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

// A decode loop's cache grows by a position a step: the attention and
// the indexer make no constant, scalar or table per length (each would be
// a device upload a step and memory kept for good), dense and sparse,
// causal and not.
func TestAttentionNoConstantPerLength(t *testing.T) {
	eachDriver(t, 64<<20, func(t *testing.T, a *Backend) {
		var consts, scalars int
		for kv := 200; kv < 240; kv++ {
			for _, tc := range []attnCase{
				{t: 1, hq: 2, hkv: 1, dk: 8, dv: 8, dr: 4, l: 256, kvLen: kv, qpos: []int32{int32(kv - 1)}, shared: true, lse: true},
				{t: 1, hq: 2, hkv: 1, dk: 8, dv: 8, l: 256, kvLen: kv, qpos: []int32{int32(kv - 1)}, lists: 1, kn: 4, shared: true,
					causal: true, idx: func(_ *rand.Rand, _, _, j int) int32 { return int32(kv - 1 - j) }},
				{t: 1, hq: 2, hkv: 1, dk: 8, dv: 8, l: 256, kvLen: kv, qpos: []int32{int32(kv - 1)}, lists: 1, kn: 4, shared: true,
					idx: func(_ *rand.Rand, _, _, j int) int32 { return int32(j) }},
			} {
				runAttention(t, a, tc, attnInputs(rand.New(rand.NewPCG(1, 2)), tc))
			}
			if kv == 200 {
				consts, scalars = len(a.consts), len(a.scalars)
			}
		}
		require.Equal(t, consts, len(a.consts), "constants made per cache length")
		require.Equal(t, scalars, len(a.scalars), "scalars made per cache length")
	})
}

// Attention and the indexer refuse positions that are not an I32 tensor
// of one per row, on both backends, with compute.ErrShape.
func TestPositionsErrors(t *testing.T) {
	c := cpu.New(1)
	defer c.Close()
	eachDriver(t, 8<<20, func(t *testing.T, a *Backend) {
		for _, be := range []compute.Backend{a, c} {
			alloc := func(dt compute.DType, dims ...int) compute.Tensor {
				x, err := be.Alloc(dt, dims...)
				require.NoError(t, err)
				return x
			}
			q, k, out := alloc(compute.F32, 2, 2, 8), alloc(compute.F32, 6, 1, 8), alloc(compute.F32, 2, 2, 8)
			iq, ik, iw, idx := alloc(compute.F32, 2, 2, 8), alloc(compute.F32, 6, 8), alloc(compute.F32, 2, 2), alloc(compute.I32, 2, 3)
			for name, pos := range map[string]compute.Tensor{
				"f32 positions": alloc(compute.F32, 2),
				"one position":  positions(t, be, []int32{3}),
				"no positions":  {},
			} {
				at := compute.AttnArgs{Q: q, K: k, V: k, QPos: pos, KVLen: 6, Causal: true, Scale: 1, Out: out}
				require.ErrorIs(t, be.Attention(&at), compute.ErrShape, "%s: attention, %s", be.Name(), name)
				ix := compute.IndexerArgs{Q: iq, K: ik, W: iw, QPos: pos, TopK: 3, Indices: idx}
				require.ErrorIs(t, be.LightningIndexer(&ix), compute.ErrShape, "%s: indexer, %s", be.Name(), name)
			}
		}
	})
}
