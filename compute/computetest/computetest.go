// Package computetest checks a compute.Backend's contracts that every
// backend shares, for the backends' own tests.
package computetest

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/floatx"
)

// TypedReadWrite checks Write and Read as compute.Backend types them:
// float32 values into and out of F32, BF16 and F16 tensors (rounded to
// nearest even, widened back exactly), int32 values for I32, raw bits for
// BF16 and F16, through slices and pointers to them, and an ErrShape for
// every other pairing or length. The expected values come from floatx.
func TypedReadWrite(t *testing.T, b compute.Backend) {
	t.Helper()
	rng := rand.New(rand.NewPCG(91, 92))
	v := make([]float32, 15)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	// A bf16 tie broken by the low bits; an f16 subnormal.
	v[0], v[1] = 1+1.0/256+1.0/65536, -3.0e-6
	for _, dt := range []compute.DType{compute.F32, compute.BF16, compute.F16} {
		x, err := b.Alloc(dt, 3, 5)
		require.NoError(t, err)
		require.NoError(t, b.Write(x, v))
		got := make([]float32, 15)
		require.NoError(t, b.Read(&got, x))
		bits := make([]uint16, 15)
		for i, f := range v {
			want := f
			switch dt {
			case compute.BF16:
				bits[i] = floatx.BF16(f)
				want = floatx.FromBF16(bits[i])
			case compute.F16:
				bits[i] = floatx.F16(f)
				want = floatx.FromF16(bits[i])
			}
			require.Equal(t, math.Float32bits(want), math.Float32bits(got[i]), "%v element %d", dt, i)
		}
		if dt == compute.F32 {
			require.ErrorIs(t, b.Read(make([]uint16, 15), x), compute.ErrShape)
			require.ErrorIs(t, b.Write(x, make([]uint16, 15)), compute.ErrShape)
			continue
		}
		raw := make([]uint16, 15)
		require.NoError(t, b.Read(raw, x))
		require.Equal(t, bits, raw, "%v bits", dt)
		raw[3] ^= 1
		require.NoError(t, b.Write(x, &raw))
		back := make([]uint16, 15)
		require.NoError(t, b.Read(back, x))
		require.Equal(t, raw, back, "%v raw round trip", dt)
	}

	ids, err := b.Alloc(compute.I32, 4)
	require.NoError(t, err)
	require.NoError(t, b.Write(ids, []int32{7, -1, 0, 1 << 30}))
	gotIDs := make([]int32, 4)
	require.NoError(t, b.Read(gotIDs, ids))
	require.Equal(t, []int32{7, -1, 0, 1 << 30}, gotIDs)

	f, err := b.Alloc(compute.F32, 4)
	require.NoError(t, err)
	for _, c := range []struct {
		dst compute.Tensor
		src any
	}{
		{f, []int32{1, 2, 3, 4}}, {ids, []float32{1, 2, 3, 4}}, {f, []float32{1, 2, 3}},
		{f, []float64{1, 2, 3, 4}}, {ids, []uint16{1, 2, 3, 4}},
	} {
		require.ErrorIs(t, b.Write(c.dst, c.src), compute.ErrShape, "write %T into %v", c.src, c.dst)
		require.ErrorIs(t, b.Read(c.src, c.dst), compute.ErrShape, "read %v into %T", c.dst, c.src)
	}
}

// StatePools checks KDAChunk and CausalConv over a pool of states
// (StateIdx) against the same calls over one state per sequence: the
// outputs and the sequences' states bitwise equal, the pool's other rows
// untouched. The sequences' token counts include one longer than eight
// (a device's recurrent operator takes at most eight a call).
func StatePools(t *testing.T, b compute.Backend) {
	t.Helper()
	const H, D, W, P = 2, 8, 4, 5
	C := 3 * H * D
	rng := rand.New(rand.NewPCG(97, 98))
	normal := func(n int, scale float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(scale * rng.NormFloat64())
		}
		return v
	}
	tensor := func(v []float32, dims ...int) compute.Tensor {
		x, err := b.Alloc(compute.F32, dims...)
		require.NoError(t, err)
		require.NoError(t, b.Write(x, v))
		return x
	}
	read := func(x compute.Tensor) []float32 {
		v := make([]float32, x.Len())
		require.NoError(t, b.Read(v, x))
		return v
	}
	for _, lens := range [][]int32{{1, 2, 1}, {1, 11, 2}} {
		N := len(lens)
		cu := make([]int32, N+1)
		for i, n := range lens {
			cu[i+1] = cu[i] + n
		}
		T := int(cu[N])
		slots := []int32{4, 0, 2}[:N]
		idx, err := b.Alloc(compute.I32, N)
		require.NoError(t, err)
		require.NoError(t, b.Write(idx, slots))

		// The pools' rows, and the same sequences' rows packed in order.
		convPool, sPool := normal(P*(W-1)*C, 1), normal(P*H*D*D, 0.3)
		convRows, sRows := make([]float32, 0, N*(W-1)*C), make([]float32, 0, N*H*D*D)
		for _, s := range slots {
			convRows = append(convRows, convPool[int(s)*(W-1)*C:int(s+1)*(W-1)*C]...)
			sRows = append(sRows, sPool[int(s)*H*D*D:int(s+1)*H*D*D]...)
		}
		x, wt := normal(T*C, 1), normal(C*W, 0.5)
		g, beta := normal(T*H*D, 1), normal(T*H, 1)
		alog, dtb := normal(H, 0.5), normal(H*D, 0.5)

		type result struct{ conv, convState, out, state []float32 }
		run := func(pooled bool) result {
			xs, ws := tensor(x, T, C), tensor(wt, C, W)
			convOut, _ := b.Alloc(compute.F32, T, C)
			ca := compute.ConvArgs{X: xs, Weight: ws, Out: convOut, CuSeqlens: cu}
			ka := compute.KDAArgs{G: tensor(g, T, H, D), Beta: tensor(beta, T, H), ALog: tensor(alog, H), DTBias: tensor(dtb, H*D),
				Gate: compute.GateSoftplus, Preprocess: true, Scale: float32(1 / math.Sqrt(D)), CuSeqlens: cu}
			if pooled {
				ca.State, ca.StateIdx = tensor(convPool, P, W-1, C), idx
				ka.State, ka.StateIdx = tensor(sPool, P, H, D, D), idx
			} else {
				ca.State, ka.State = tensor(convRows, N, W-1, C), tensor(sRows, N, H, D, D)
			}
			require.NoError(t, b.CausalConv(&ca), "conv, pooled %v", pooled)
			ka.QKV = convOut
			ka.Out, _ = b.Alloc(compute.F32, T, H, D)
			require.NoError(t, b.KDAChunk(&ka), "KDA, pooled %v", pooled)
			return result{read(convOut), read(ca.State), read(ka.Out), read(ka.State)}
		}
		alone, pool := run(false), run(true)
		require.Equal(t, alone.conv, pool.conv, "lens %v: conv outputs", lens)
		require.Equal(t, alone.out, pool.out, "lens %v: KDA outputs", lens)
		for i, s := range slots {
			cw, sw := (W-1)*C, H*D*D
			require.Equal(t, alone.convState[i*cw:(i+1)*cw], pool.convState[int(s)*cw:int(s+1)*cw], "lens %v: conv state of sequence %d", lens, i)
			require.Equal(t, alone.state[i*sw:(i+1)*sw], pool.state[int(s)*sw:int(s+1)*sw], "lens %v: state of sequence %d", lens, i)
		}
		for _, r := range []int{1, 3} { // rows no sequence names
			cw, sw := (W-1)*C, H*D*D
			require.Equal(t, convPool[r*cw:(r+1)*cw], pool.convState[r*cw:(r+1)*cw], "lens %v: conv pool row %d", lens, r)
			require.Equal(t, sPool[r*sw:(r+1)*sw], pool.state[r*sw:(r+1)*sw], "lens %v: pool row %d", lens, r)
		}
		require.NotEqual(t, convRows, alone.convState, "the conv states moved")
	}
}

// PagePools checks Attention and LightningIndexer over pages that are
// rows of pools named by a page table (AttnArgs.PageTable,
// IndexerArgs.PageTable) against the same pages given as a list of
// tensors: bitwise equal outputs, for dense causal and index-sparse
// attention, MLA's shared latent with rope keys and GQA with values of
// their own, and a table that names the pool's pages out of order.
func PagePools(t *testing.T, b compute.Backend) {
	t.Helper()
	const P, N, T, KV = 64, 4, 3, 150 // page size, pool pages, query rows, cached positions
	table := []int32{2, 0, 3}
	rng := rand.New(rand.NewPCG(99, 100))
	tensor := func(dt compute.DType, dims ...int) compute.Tensor {
		x, err := b.Alloc(dt, dims...)
		require.NoError(t, err)
		return x
	}
	normal := func(dims ...int) compute.Tensor {
		x := tensor(compute.F32, dims...)
		v := make([]float32, x.Len())
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		require.NoError(t, b.Write(x, v))
		return x
	}
	ints := func(v []int32, dims ...int) compute.Tensor {
		x := tensor(compute.I32, dims...)
		require.NoError(t, b.Write(x, v))
		return x
	}
	read := func(x compute.Tensor) []float32 {
		if x.IsZero() {
			return nil
		}
		v := make([]float32, x.Len())
		require.NoError(t, b.Read(v, x))
		return v
	}
	pages := func(pool compute.Tensor) []compute.Tensor {
		if pool.IsZero() {
			return nil
		}
		var out []compute.Tensor
		for _, p := range table {
			out = append(out, pool.Rows(int(p)*P, int(p+1)*P))
		}
		return out
	}
	tab := ints(table, len(table))
	pos := ints([]int32{KV - 3, KV - 2, KV - 1}, T)
	for _, c := range []struct {
		name                string
		hq, hkv, dk, dv, dr int
		sparse              bool
	}{
		{"mla dense", 4, 1, 16, 16, 8, false},
		{"mla sparse", 4, 1, 16, 16, 8, true},
		{"gqa dense", 4, 2, 16, 12, 0, false},
		{"gqa sparse", 4, 2, 16, 12, 0, true},
	} {
		kPool := normal(N*P, c.hkv, c.dk)
		var vPool, krPool, qr compute.Tensor
		if c.dv != c.dk {
			vPool = normal(N*P, c.hkv, c.dv)
		}
		if c.dr > 0 {
			krPool, qr = normal(N*P, c.dr), normal(T, c.hq, c.dr)
		}
		q := normal(T, c.hq, c.dk)
		var idx compute.Tensor
		if c.sparse {
			idx = ints([]int32{0, 5, 64, 130, -1, KV - 3, 1, 2, 70, 149, 148, -1, 3, 100, 128, 147, -1, -1}, T, 1, 6)
		}
		run := func(pooled bool) ([]float32, []float32) {
			a := compute.AttnArgs{Q: q, QRope: qr, PageSize: P, Indices: idx, QPos: pos, KVLen: KV, Causal: true, Scale: 0.25,
				Out: tensor(compute.F32, T, c.hq, c.dv), LSE: tensor(compute.F32, T, c.hq)}
			if pooled {
				a.KPool, a.VPool, a.KRopePool, a.PageTable = kPool, vPool, krPool, tab
			} else {
				a.KPages, a.VPages, a.KRopePages = pages(kPool), pages(vPool), pages(krPool)
			}
			require.NoError(t, b.Attention(&a), "%s, pooled %v", c.name, pooled)
			return read(a.Out), read(a.LSE)
		}
		o1, l1 := run(false)
		o2, l2 := run(true)
		require.Equal(t, o1, o2, "%s: outputs", c.name)
		require.Equal(t, l1, l2, "%s: log-sum-exp", c.name)
	}

	const HI, DI, K = 2, 16, 8
	kPool := normal(N*P, DI)
	q, w := normal(T, HI, DI), normal(T, HI)
	run := func(pooled bool) ([]int32, []int32) {
		a := compute.IndexerArgs{Q: q, W: w, PageSize: P, KLen: KV, QPos: pos, TopK: K,
			Indices: tensor(compute.I32, T, K), Counts: tensor(compute.I32, T)}
		if pooled {
			a.KPool, a.PageTable = kPool, tab
		} else {
			a.KPages = pages(kPool)
		}
		require.NoError(t, b.LightningIndexer(&a), "indexer, pooled %v", pooled)
		ix, n := make([]int32, T*K), make([]int32, T)
		require.NoError(t, b.Read(ix, a.Indices))
		require.NoError(t, b.Read(n, a.Counts))
		return ix, n
	}
	i1, n1 := run(false)
	i2, n2 := run(true)
	require.Equal(t, i1, i2, "indexer indices")
	require.Equal(t, n1, n2, "indexer counts")
	require.Equal(t, []int32{K, K, K}, n1)
}

// Scatter checks ScatterRows: each source row lands in the row its index
// names, the others keep their values, for F32 rows and BF16 bits.
func Scatter(t *testing.T, b compute.Backend) {
	t.Helper()
	const rows, w = 7, 5
	idx, err := b.Alloc(compute.I32, 3)
	require.NoError(t, err)
	slots := []int32{6, 0, 3}
	require.NoError(t, b.Write(idx, slots))
	for _, dt := range []compute.DType{compute.F32, compute.BF16} {
		dst, err := b.Alloc(dt, rows, w)
		require.NoError(t, err)
		src, err := b.Alloc(dt, 3, w)
		require.NoError(t, err)
		before, rowsIn := make([]float32, rows*w), make([]float32, 3*w)
		for i := range before {
			before[i] = float32(i) + 0.5
		}
		for i := range rowsIn {
			rowsIn[i] = -float32(i) - 1
		}
		require.NoError(t, b.Write(dst, before))
		require.NoError(t, b.Write(src, rowsIn))
		require.NoError(t, b.ScatterRows(dst, idx, src), "%v", dt)
		got := make([]float32, rows*w)
		require.NoError(t, b.Read(got, dst))
		want := append([]float32(nil), before...)
		for i, r := range slots {
			copy(want[int(r)*w:int(r+1)*w], rowsIn[i*w:(i+1)*w])
		}
		require.Equal(t, want, got, "%v", dt)
	}
	f, err := b.Alloc(compute.F32, rows, w)
	require.NoError(t, err)
	g, err := b.Alloc(compute.F32, 3, w+1)
	require.NoError(t, err)
	require.ErrorIs(t, b.ScatterRows(f, idx, g), compute.ErrShape, "rows of another width")
}
