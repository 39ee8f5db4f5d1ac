package ascend

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
	"k3/internal/floatx"
)

// drivers are the ways to make a backend in this build: the host driver
// always, and (with -tags ascend) ACL over the fake CANN.
var drivers = []struct {
	name string
	open func(t *testing.T, arena int) *Backend
}{{"host", hostBackend}}

func hostBackend(t *testing.T, arena int) *Backend {
	t.Helper()
	b, err := OpenHost(Options{ArenaBytes: arena})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, b.Close()) })
	return b
}

// eachDriver runs f on a backend of every driver of this build.
func eachDriver(t *testing.T, arena int, f func(t *testing.T, b *Backend)) {
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) { f(t, d.open(t, arena)) })
	}
}

func randF32(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func bf16bytes(v []float32) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], floatx.BF16(x))
	}
	return b
}

// upload puts host data on both backends.
func both(t *testing.T, a, c compute.Backend, dt compute.DType, data []float32, shape ...int) (compute.Tensor, compute.Tensor) {
	t.Helper()
	raw, src := f32bytes(data), compute.F32
	if dt == compute.BF16 {
		raw, src = bf16bytes(data), compute.BF16
	}
	ta, err := a.FromHost(dt, src, raw, shape...)
	require.NoError(t, err)
	tc, err := c.FromHost(dt, src, append([]byte(nil), raw...), shape...)
	require.NoError(t, err)
	return ta, tc
}

func read(t *testing.T, b compute.Backend, x compute.Tensor) []float32 {
	t.Helper()
	out := make([]float32, x.Len())
	require.NoError(t, b.Read(out, x))
	return out
}

// TestFromHostCopies: a tensor made from host bytes keeps its values when
// the bytes change afterwards, as ReadsHost promises a loader that
// releases them.
func TestFromHostCopies(t *testing.T) {
	eachDriver(t, 1<<20, func(t *testing.T, b *Backend) {
		v := []float32{1, -2, 3.5, 4}
		for _, dt := range []compute.DType{compute.F32, compute.BF16} {
			raw, src := f32bytes(v), compute.F32
			if dt == compute.BF16 {
				raw, src = bf16bytes(v), compute.BF16
			}
			x, err := b.FromHost(dt, src, raw, len(v))
			require.NoError(t, err)
			require.False(t, b.ReadsHost(raw))
			clear(raw)
			assert.Equal(t, v, read(t, b, x), "%v", dt)
		}
	})
}

func TestBackendMemory(t *testing.T) { eachDriver(t, 8<<20, testBackendMemory) }

func testBackendMemory(t *testing.T, b *Backend) {
	x, err := b.Alloc(compute.F32, 3, 5)
	require.NoError(t, err)
	assert.Equal(t, make([]float32, 15), read(t, b, x), "Alloc zeroes (the fake's fresh memory is NaN)")
	v := randF32(rand.New(rand.NewPCG(1, 2)), 15)
	require.NoError(t, b.Write(x, v))
	assert.Equal(t, v, read(t, b, x))
	assert.Equal(t, v[5:10], read(t, b, x.Rows(1, 2)))

	// Copies between views, 64-byte aligned or not.
	y, err := b.Alloc(compute.F32, 3, 5)
	require.NoError(t, err)
	require.NoError(t, b.Copy(y, x))
	assert.Equal(t, v, read(t, b, y))
	require.NoError(t, b.Copy(y.Rows(0, 1), x.Rows(2, 3)))
	assert.Equal(t, v[10:15], read(t, b, y.Rows(0, 1)))
	// Unaligned views of the other dtypes (aclnnInplaceCopy); a bf16
	// tensor is read back widened by an embedding lookup of its rows.
	want := []float32{0, 0, -2, 3, 4, 0, 0}
	for _, dt := range []compute.DType{compute.BF16, compute.I32} {
		raw, from := f32bytes([]float32{1, -2, 3, 4, 5, 6, 7}), compute.F32
		if dt == compute.I32 {
			raw, from = i32bytes([]int32{1, -2, 3, 4, 5, 6, 7}), compute.I32
		}
		src, err := b.FromHost(dt, from, raw, 7)
		require.NoError(t, err)
		dst, err := b.Alloc(dt, 7)
		require.NoError(t, err)
		require.NoError(t, b.Copy(dst.Rows(2, 5), src.Rows(1, 4)))
		got := make([]float32, 7)
		if dt == compute.I32 {
			ints := make([]int32, 7)
			require.NoError(t, b.Read(&ints, dst))
			for i, v := range ints {
				got[i] = float32(v)
			}
		} else {
			rows, err := b.FromHost(compute.I32, compute.I32, i32bytes([]int32{0, 1, 2, 3, 4, 5, 6}), 7)
			require.NoError(t, err)
			wide, err := b.Alloc(compute.F32, 7)
			require.NoError(t, err)
			require.NoError(t, b.Embedding(wide, dst.Reshape(7, 1), rows))
			require.NoError(t, b.Read(got, wide))
			b.Free(rows)
			b.Free(wide)
		}
		assert.Equal(t, want, got, "%v", dt)
		b.Free(src)
		b.Free(dst)
	}

	require.NoError(t, b.Fill(y.Rows(1, 3), 0.5))
	assert.Equal(t, append(append(append([]float32(nil), v[10:15]...), 0.5, 0.5, 0.5, 0.5, 0.5), 0.5, 0.5, 0.5, 0.5, 0.5), read(t, b, y))
	require.NoError(t, b.Fill(y, 0))
	assert.Equal(t, make([]float32, 15), read(t, b, y))

	ids, err := b.Alloc(compute.I32, 4)
	require.NoError(t, err)
	require.NoError(t, b.Write(ids, &[]int32{1, -2, 3, 4}))
	got := make([]int32, 4)
	require.NoError(t, b.Read(&got, ids))
	assert.Equal(t, []int32{1, -2, 3, 4}, got)

	assert.ErrorIs(t, b.Write(x, make([]float32, 3)), compute.ErrShape)
	assert.ErrorIs(t, b.Write(ids, make([]float32, 4)), compute.ErrShape)
	assert.ErrorIs(t, b.Read(make([]float64, 15), x), compute.ErrShape)

	// Larger than the pinned stage: the copy goes in chunks.
	big := randF32(rand.New(rand.NewPCG(3, 4)), stageBytes/4*2+7)
	tb, err := b.FromHost(compute.F32, compute.F32, f32bytes(big), len(big))
	require.NoError(t, err)
	assert.Equal(t, big, read(t, b, tb))

	b.Free(x)
	b.Free(x) // a second free is a no-op
	assert.ErrorIs(t, b.Write(x, v), compute.ErrShape)
	b.Free(y)
	b.Free(ids)
	b.Free(tb)
	assert.Zero(t, b.arena.used)

	// The arena is the limit, with the error saying so.
	_, err = b.Alloc(compute.F32, 4<<20)
	require.ErrorIs(t, err, ErrOutOfMemory)
	assert.Contains(t, err.Error(), "arena")
}

// MatMul and RMSNorm against the pure-Go backend, over shapes and weight
// types.
func TestBackendOps(t *testing.T) { eachDriver(t, 64<<20, testBackendOps) }

func testBackendOps(t *testing.T, a *Backend) {
	c := cpu.New(1)
	defer c.Close()
	rng := rand.New(rand.NewPCG(5, 6))
	for _, s := range []struct{ M, N, K int }{{1, 16, 64}, {5, 7, 33}, {40, 24, 96}} {
		for _, wt := range []compute.DType{compute.F32, compute.BF16} {
			xa, xc := both(t, a, c, compute.F32, randF32(rng, s.M*s.K), s.M, s.K)
			wa, wc := both(t, a, c, wt, randF32(rng, s.N*s.K), s.N, s.K)
			oa, err := a.Alloc(compute.F32, s.M, s.N)
			require.NoError(t, err)
			oc, err := c.Alloc(compute.F32, s.M, s.N)
			require.NoError(t, err)
			require.NoError(t, a.MatMul(oa, xa, wa))
			require.NoError(t, c.MatMul(oc, xc, wc))
			assert.InDeltaSlice(t, read(t, c, oc), read(t, a, oa), 1e-4, "%v %v", s, wt)

			// A view of rows: the descriptor carries its offset.
			if s.M > 2 {
				require.NoError(t, a.MatMul(oa.Rows(1, 3), xa.Rows(2, 4), wa))
				require.NoError(t, c.MatMul(oc.Rows(1, 3), xc.Rows(2, 4), wc))
				assert.InDeltaSlice(t, read(t, c, oc), read(t, a, oa), 1e-4, "rows %v %v", s, wt)
			}
		}
		{
			xa, xc := both(t, a, c, compute.F32, randF32(rng, s.M*s.K), s.M, s.K)
			ga, gc := both(t, a, c, compute.F32, randF32(rng, s.K), s.K)
			ba, bc := both(t, a, c, compute.F32, randF32(rng, s.K), s.K)
			ya, err := a.Alloc(compute.F32, s.M, s.K)
			require.NoError(t, err)
			yc, err := c.Alloc(compute.F32, s.M, s.K)
			require.NoError(t, err)
			require.NoError(t, a.LayerNorm(ya, xa, ga, ba, 1e-5))
			require.NoError(t, c.LayerNorm(yc, xc, gc, bc, 1e-5))
			assert.InDeltaSlice(t, read(t, c, yc), read(t, a, ya), 1e-5, "layernorm %v", s)
		}
		for _, weighted := range []bool{true, false} {
			xa, xc := both(t, a, c, compute.F32, randF32(rng, s.M*s.K), s.M, s.K)
			var ga, gc compute.Tensor
			if weighted {
				ga, gc = both(t, a, c, compute.F32, randF32(rng, s.K), s.K)
			}
			ya, err := a.Alloc(compute.F32, s.M, s.K)
			require.NoError(t, err)
			yc, err := c.Alloc(compute.F32, s.M, s.K)
			require.NoError(t, err)
			require.NoError(t, a.RMSNorm(ya, xa, ga, 1e-6))
			require.NoError(t, c.RMSNorm(yc, xc, gc, 1e-6))
			assert.InDeltaSlice(t, read(t, c, yc), read(t, a, ya), 1e-5, "rmsnorm %v weighted %v", s, weighted)
		}
	}
}

func TestBackendErrors(t *testing.T) { eachDriver(t, 8<<20, testBackendErrors) }

func testBackendErrors(t *testing.T, b *Backend) {
	x, err := b.Alloc(compute.F32, 2, 3)
	require.NoError(t, err)
	w, err := b.Alloc(compute.F32, 4, 5)
	require.NoError(t, err)
	err = b.MatMul(x, x, w)
	require.ErrorIs(t, err, compute.ErrShape)
	// An operation not mapped to aclnn says so, on the host driver too.
	err = b.KDAChunk(&compute.KDAArgs{})
	require.ErrorIs(t, err, compute.ErrUnsupported)
	assert.Contains(t, err.Error(), "KDAChunk")
	err = b.MatMul(x, x, compute.Tensor{DType: compute.F32, Rank: 2, Dims: [compute.MaxRank]int{3, 3}, Mem: "host"})
	require.ErrorIs(t, err, compute.ErrShape)
	assert.Contains(t, err.Error(), "not a live tensor")
}

// The elementwise operations, the gather and the per-head product against
// the pure-Go backend.
func TestBackendMoreOps(t *testing.T) { eachDriver(t, 64<<20, testBackendMoreOps) }

func testBackendMoreOps(t *testing.T, a *Backend) {
	c := cpu.New(1)
	defer c.Close()
	rng := rand.New(rand.NewPCG(11, 12))
	alloc := func(shape ...int) (compute.Tensor, compute.Tensor) {
		ta, err := a.Alloc(compute.F32, shape...)
		require.NoError(t, err)
		tc, err := c.Alloc(compute.F32, shape...)
		require.NoError(t, err)
		return ta, tc
	}
	check := func(oa, oc compute.Tensor, tol float64, what string) {
		t.Helper()
		assert.InDeltaSlice(t, read(t, c, oc), read(t, a, oa), tol, what)
	}
	const T, D = 6, 20
	for _, op := range []compute.UnaryOp{compute.SiLU, compute.Sigmoid, compute.Softplus} {
		xa, xc := both(t, a, c, compute.F32, randF32(rng, T*D), T, D)
		oa, oc := alloc(T, D)
		require.NoError(t, a.Unary(op, oa, xa))
		require.NoError(t, c.Unary(op, oc, xc))
		check(oa, oc, 1e-5, "unary")
		require.NoError(t, a.Unary(op, xa, xa)) // in place
		require.NoError(t, c.Unary(op, xc, xc))
		check(xa, xc, 1e-5, "unary in place")
	}
	for _, op := range []compute.BinaryOp{compute.Add, compute.Mul} {
		for _, rows := range []int{T, 1} {
			xa, xc := both(t, a, c, compute.F32, randF32(rng, T*D), T, D)
			ya, yc := both(t, a, c, compute.F32, randF32(rng, rows*D), rows, D)
			if rows == 1 {
				ya, yc = ya.Reshape(D), yc.Reshape(D)
			}
			oa, oc := alloc(T, D)
			require.NoError(t, a.Binary(op, oa, xa, ya))
			require.NoError(t, c.Binary(op, oc, xc, yc))
			check(oa, oc, 1e-6, "binary")
		}
	}
	ga, gc := both(t, a, c, compute.F32, randF32(rng, T*D), T, D)
	ua, uc := both(t, a, c, compute.F32, randF32(rng, T*D), T, D)
	oa, oc := alloc(T, D)
	act := compute.Activation{Kind: compute.SwiGLU}
	require.NoError(t, a.GatedAct(act, oa, ga, ua))
	require.NoError(t, c.GatedAct(act, oc, gc, uc))
	check(oa, oc, 1e-5, "swiglu")
	for _, situ := range []compute.Activation{{Kind: compute.SiTU, Beta: 1.5, LinearBeta: 2}, {Kind: compute.SiTU, Beta: 3}} {
		require.NoError(t, a.GatedAct(situ, oa, ga, ua))
		require.NoError(t, c.GatedAct(situ, oc, gc, uc))
		check(oa, oc, 1e-5, "situ")
	}
	gate := compute.Activation{Kind: compute.SigmoidGate}
	require.NoError(t, a.GatedAct(gate, oa, ga, ua))
	require.NoError(t, c.GatedAct(gate, oc, gc, uc))
	check(oa, oc, 1e-6, "sigmoid gate")
	require.NoError(t, a.GatedAct(gate, ua, ga, ua)) // in place, as the layers run it
	require.NoError(t, c.GatedAct(gate, uc, gc, uc))
	check(ua, uc, 1e-6, "sigmoid gate in place")

	const V = 50
	for _, dt := range []compute.DType{compute.F32, compute.BF16} {
		ta, tc := both(t, a, c, dt, randF32(rng, V*D), V, D)
		ids := []int32{3, 0, 49, 3, 17}
		ia, err := a.Alloc(compute.I32, len(ids))
		require.NoError(t, err)
		require.NoError(t, a.Write(ia, ids))
		ic, err := c.Alloc(compute.I32, len(ids))
		require.NoError(t, err)
		require.NoError(t, c.Write(ic, ids))
		ea, ec := alloc(len(ids), D)
		require.NoError(t, a.Embedding(ea, ta, ia))
		require.NoError(t, c.Embedding(ec, tc, ic))
		check(ea, ec, 0, "embedding")
	}

	const H, K, N = 3, 24, 10
	for _, dt := range []compute.DType{compute.F32, compute.BF16} {
		xa, xc := both(t, a, c, compute.F32, randF32(rng, T*H*K), T, H, K)
		wa, wc := both(t, a, c, dt, randF32(rng, H*N*K), H, N, K)
		ha, hc := alloc(T, H, N)
		require.NoError(t, a.HeadMatMul(ha, xa, wa))
		require.NoError(t, c.HeadMatMul(hc, xc, wc))
		check(ha, hc, 1e-4, "head matmul")
	}
}

// An id outside the table faults on the device; the next synchronisation
// reports it, as the real runtime does.
func TestBackendEmbeddingFault(t *testing.T) { eachDriver(t, 8<<20, testBackendEmbeddingFault) }

func testBackendEmbeddingFault(t *testing.T, b *Backend) {
	table, err := b.Alloc(compute.F32, 4, 8)
	require.NoError(t, err)
	ids, err := b.Alloc(compute.I32, 1)
	require.NoError(t, err)
	require.NoError(t, b.Write(ids, []int32{9}))
	out, err := b.Alloc(compute.F32, 1, 8)
	require.NoError(t, err)
	require.NoError(t, b.Embedding(out, table, ids))
	err = b.Read(make([]float32, 8), out)
	require.ErrorIs(t, err, ErrDevice)
	assert.Contains(t, err.Error(), "index 9")
}
