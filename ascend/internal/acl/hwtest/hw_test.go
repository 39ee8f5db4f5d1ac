//go:build ascend && cgo

package hwtest

import (
	"cmp"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/ascend/internal/acl"
	"k3/ascend/internal/nz"
	"k3/compute"
	"k3/internal/cpu"
	"k3/internal/floatx"
)

var (
	lib     *acl.Lib
	dev     int
	skipWhy string
)

func TestMain(m *testing.M) {
	code := func() int {
		sel := os.Getenv("K3_ASCEND_DEVICE")
		switch sel {
		case "":
			skipWhy = "set K3_ASCEND_DEVICE to an NPU index (or to fake) to run the hardware tests"
			return m.Run()
		case "fake":
			dir, err := os.MkdirTemp("", "fakecann")
			if err != nil {
				panic(err)
			}
			defer os.RemoveAll(dir)
			if err := acl.BuildFake(dir, filepath.Join("..", "testdata", "fakecann")); err != nil {
				panic(err)
			}
			if lib, err = acl.Load(acl.Options{LibDirs: []string{dir}}); err != nil {
				panic(err)
			}
		default:
			var err error
			if dev, err = strconv.Atoi(sel); err != nil || dev < 0 {
				panic("K3_ASCEND_DEVICE=" + sel + ": want an NPU index or fake")
			}
			if lib, err = acl.Load(acl.Options{LibDirs: filepath.SplitList(os.Getenv("K3_ASCEND_LIB_DIRS"))}); err != nil {
				panic(err)
			}
		}
		return m.Run()
	}()
	os.Exit(code)
}

// context opens the device under test, or skips.
func context(t *testing.T) *acl.Context {
	t.Helper()
	if lib == nil {
		t.Skip(skipWhy)
	}
	ctx, err := lib.NewContext(dev)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, ctx.Close()) })
	return ctx
}

// workspace allocates op's workspace for the rest of the test.
func workspace(t *testing.T, ctx *acl.Context, op *acl.Op) acl.DevPtr {
	t.Helper()
	if op.WorkspaceSize == 0 {
		return acl.DevPtr{}
	}
	ws, err := ctx.Malloc(op.WorkspaceSize)
	require.NoError(t, err)
	t.Cleanup(func() { ctx.Free(ws) })
	return ws
}

// onDevice copies b into new device memory, freed with the test.
func onDevice(t *testing.T, ctx *acl.Context, b []byte) acl.DevPtr {
	t.Helper()
	p, err := ctx.Malloc(len(b))
	require.NoError(t, err)
	t.Cleanup(func() { ctx.Free(p) })
	require.NoError(t, ctx.CopyToDevice(p, b))
	return p
}

// describe is a contiguous descriptor of device memory, destroyed with
// the test.
func describe(t *testing.T, ctx *acl.Context, dt acl.DataType, p acl.DevPtr, dims ...int64) *acl.Tensor {
	t.Helper()
	x, err := ctx.NewTensor(acl.TensorDesc{DType: dt, Dims: dims, Data: p})
	require.NoError(t, err)
	t.Cleanup(func() { x.Destroy() })
	return x
}

func i32(v []int32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

func TestHWLoad(t *testing.T) {
	context(t)
	n, err := lib.DeviceCount()
	require.NoError(t, err)
	require.Greater(t, n, dev, "devices")
	t.Logf("CANN libraries: %v; %d devices", lib.Paths, n)
}

func TestHWCopies(t *testing.T) {
	ctx := context(t)
	const n = 1 << 20
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i * 7)
	}
	p, err := ctx.Malloc(n)
	require.NoError(t, err)
	defer ctx.Free(p)
	q, err := ctx.Malloc(n)
	require.NoError(t, err)
	defer ctx.Free(q)
	require.NoError(t, ctx.CopyToDevice(p, src))
	s, err := ctx.NewStream()
	require.NoError(t, err)
	defer s.Destroy()
	h, err := ctx.MallocHost(n)
	require.NoError(t, err)
	defer h.Free()
	require.NoError(t, s.CopyDevice(q, p, n))
	require.NoError(t, s.Memset(q, 0x5a, 64))
	require.NoError(t, s.Download(h, 0, q, n))
	require.NoError(t, s.Sync())
	want := append([]byte(nil), src...)
	for i := range 64 {
		want[i] = 0x5a
	}
	require.Equal(t, want, h.Bytes())
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// normals fills v with normal deviates times scale, in order.
func normals(rng *rand.Rand, v []float32, scale float64) {
	for i := range v {
		v[i] = float32(rng.NormFloat64() * scale)
	}
}

func bytesF32(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// Matmul computes out = x · wᵀ (w [N, K] as a strided [K, N] view) on
// the device through a captured graph, replayed with new inputs, against
// float64 on the host.
func TestHWMatmul(t *testing.T) {
	ctx := context(t)
	rng := rand.New(rand.NewPCG(1, 2))
	const M, N, K = 64, 128, 256
	x, w := make([]float32, M*K), make([]float32, N*K)
	normals(rng, x, 1)
	normals(rng, w, 1)
	bufs := make([]acl.DevPtr, 3)
	for i, n := range []int{M * K, N * K, M * N} {
		var err error
		bufs[i], err = ctx.Malloc(4 * n)
		require.NoError(t, err)
		defer ctx.Free(bufs[i])
	}
	require.NoError(t, ctx.CopyToDevice(bufs[0], f32bytes(x)))
	require.NoError(t, ctx.CopyToDevice(bufs[1], f32bytes(w)))
	tx, err := ctx.NewTensor(acl.TensorDesc{DType: acl.Float, Dims: []int64{M, K}, Data: bufs[0]})
	require.NoError(t, err)
	defer tx.Destroy()
	tw, err := ctx.NewTensor(acl.TensorDesc{DType: acl.Float, Dims: []int64{K, N}, Strides: []int64{1, K}, StorageDims: []int64{N, K}, Format: acl.FormatND, Data: bufs[1]})
	require.NoError(t, err)
	defer tw.Destroy()
	to, err := ctx.NewTensor(acl.TensorDesc{DType: acl.Float, Dims: []int64{M, N}, Data: bufs[2]})
	require.NoError(t, err)
	defer to.Destroy()
	op, err := ctx.Matmul("aclnnMatmul", tx, tw, to, 0)
	require.NoError(t, err)
	require.NoError(t, op.SetRepeatable())
	defer op.Destroy()
	ws := workspace(t, ctx, op)
	s, err := ctx.NewStream()
	require.NoError(t, err)
	defer s.Destroy()
	g, err := s.Capture(acl.CaptureThreadLocal, func() error { return op.Launch(s, ws) })
	require.NoError(t, err)
	defer g.Destroy()
	for range 2 {
		normals(rng, x, 1)
		require.NoError(t, ctx.CopyToDevice(bufs[0], f32bytes(x)))
		require.NoError(t, g.Replay(s))
		require.NoError(t, s.Sync())
		got := make([]byte, 4*M*N)
		require.NoError(t, ctx.CopyToHost(got, bufs[2]))
		out := bytesF32(got)
		for m := range M {
			for n := range N {
				var want float64
				for k := range K {
					want += float64(x[m*K+k]) * float64(w[n*K+k])
				}
				require.InDelta(t, want, out[m*N+n], 1e-3*math.Sqrt(K), "out[%d][%d]", m, n)
			}
		}
	}
}

// The cube unit's weight format against k3's FRACTAL_NZ packing: what
// the backend will upload at load instead of converting on the device.
func TestHWWeightNZ(t *testing.T) {
	ctx := context(t)
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dims := range [][]int{{100, 30}, {64, 48}, {2, 17, 40}} {
		n := 1
		for _, d := range dims {
			n *= d
		}
		w := make([]uint16, n)
		for i := range w {
			w[i] = floatx.BF16(float32(rng.NormFloat64()))
		}
		d64 := make([]int64, len(dims))
		for i, d := range dims {
			d64[i] = int64(d)
		}
		elems, err := ctx.MatmulWeightSize(d64, acl.BF16)
		require.NoError(t, err)
		l, err := nz.NewLayout(dims, nz.C0(2))
		require.NoError(t, err)
		require.Equal(t, l.Len(), elems, "%v: stored elements", dims)

		p, err := ctx.Malloc(2 * elems)
		require.NoError(t, err)
		raw := make([]byte, 2*elems)
		for i, v := range w {
			binary.LittleEndian.PutUint16(raw[2*i:], v)
		}
		require.NoError(t, ctx.CopyToDevice(p, raw))
		tw, err := ctx.NewTensor(acl.TensorDesc{DType: acl.BF16, Dims: d64, Data: p})
		require.NoError(t, err)
		op, err := ctx.TransMatmulWeight(tw)
		require.NoError(t, err)
		s, err := ctx.NewStream()
		require.NoError(t, err)
		var ws acl.DevPtr
		if op.WorkspaceSize > 0 {
			ws, err = ctx.Malloc(op.WorkspaceSize)
			require.NoError(t, err)
		}
		require.NoError(t, op.Launch(s, ws))
		require.NoError(t, s.Sync())
		got := make([]byte, 2*elems)
		require.NoError(t, ctx.CopyToHost(got, p))
		want := make([]uint16, elems)
		require.NoError(t, nz.Pack(l, want, w))
		for i := range want {
			require.Equal(t, want[i], binary.LittleEndian.Uint16(got[2*i:]), "%v: stored element %d", dims, i)
		}
		require.NoError(t, tw.Destroy())
		require.NoError(t, s.Destroy())
		if !ws.IsNil() {
			require.NoError(t, ctx.Free(ws))
		}
		require.NoError(t, ctx.Free(p))
	}
}

// aclnnRecurrentGatedDeltaRule as k3 calls it for KDA decode (per-channel
// decay gk, no per-head g, one state block per sequence) against the
// equations in float64: S ← S·Diag(exp(gk)), S ← S + β(v − S k)kᵀ,
// out = scale · S q, state V-first [blocks, Nv, Dv, Dk].
func TestHWRecurrentGatedDeltaRule(t *testing.T) {
	ctx := context(t)
	rng := rand.New(rand.NewPCG(5, 6))
	const H, D = 4, 128
	lensHost := []int32{1, 3, 2}
	N, T := len(lensHost), 6
	idxHost := []int32{0, 1, 1, 1, 2, 2}
	unit := func(n int) []float32 {
		v := make([]float32, n)
		for i := 0; i < n; i += D {
			var ss float64
			for j := i; j < i+D; j++ {
				v[j] = float32(rng.NormFloat64())
				ss += float64(v[j]) * float64(v[j])
			}
			for j := i; j < i+D; j++ {
				v[j] = float32(float64(v[j]) / math.Sqrt(ss))
			}
		}
		return v
	}
	q, k := unit(T*H*D), unit(T*H*D)
	v, gk, beta, st := make([]float32, T*H*D), make([]float32, T*H*D), make([]float32, T*H), make([]float32, N*H*D*D)
	for i := range v {
		v[i], gk[i] = float32(rng.NormFloat64()), float32(-0.05*rng.Float64())
	}
	for i := range beta {
		beta[i] = rng.Float32()
	}
	normals(rng, st, 0.1)
	const scale = 0.088
	// The reference.
	want, wantSt := make([]float64, T*H*D), make([]float64, len(st))
	for i, x := range st {
		wantSt[i] = float64(x)
	}
	t0 := 0
	for s, n := range lensHost {
		for h := range H {
			S := wantSt[(s*H+h)*D*D : (s*H+h+1)*D*D]
			for tt := t0; tt < t0+int(n); tt++ {
				base := (tt*H + h) * D
				for c := range D {
					e := math.Exp(float64(gk[base+c]))
					for r := range D {
						S[r*D+c] *= e
					}
				}
				for r := range D {
					var sk float64
					for c := range D {
						sk += S[r*D+c] * float64(k[base+c])
					}
					u := float64(beta[tt*H+h]) * (float64(v[base+r]) - sk)
					for c := range D {
						S[r*D+c] += u * float64(k[base+c])
					}
				}
				for r := range D {
					var sq float64
					for c := range D {
						sq += S[r*D+c] * float64(q[base+c])
					}
					want[base+r] = scale * sq
				}
			}
		}
		t0 += int(n)
	}
	up := func(b []byte) acl.DevPtr { return onDevice(t, ctx, b) }
	desc := func(dt acl.DataType, p acl.DevPtr, dims ...int64) *acl.Tensor {
		return describe(t, ctx, dt, p, dims...)
	}
	outP := up(make([]byte, 4*T*H*D))
	stP := up(f32bytes(st))
	op, err := ctx.RecurrentGatedDeltaRule(
		desc(acl.Float, up(f32bytes(q)), int64(T), H, D), desc(acl.Float, up(f32bytes(k)), int64(T), H, D),
		desc(acl.Float, up(f32bytes(v)), int64(T), H, D), desc(acl.Float, up(f32bytes(beta)), int64(T), H),
		desc(acl.Float, stP, int64(N), H, D, D), desc(acl.Int32, up(i32(lensHost)), int64(N)),
		desc(acl.Int32, up(i32(idxHost)), int64(T)), nil, desc(acl.Float, up(f32bytes(gk)), int64(T), H, D),
		scale, desc(acl.Float, outP, int64(T), H, D))
	require.NoError(t, err)
	ws := workspace(t, ctx, op)
	s, err := ctx.NewStream()
	require.NoError(t, err)
	defer s.Destroy()
	require.NoError(t, op.Launch(s, ws))
	require.NoError(t, s.Sync())
	got := make([]byte, 4*T*H*D)
	require.NoError(t, ctx.CopyToHost(got, outP))
	for i, x := range bytesF32(got) {
		require.InDelta(t, want[i], x, 1e-4+1e-4*math.Abs(want[i]), "out element %d", i)
	}
	gotSt := make([]byte, 4*len(st))
	require.NoError(t, ctx.CopyToHost(gotSt, stP))
	for i, x := range bytesF32(gotSt) {
		require.InDelta(t, wantSt[i], x, 1e-4+1e-4*math.Abs(wantSt[i]), "state element %d", i)
	}
}

// aclnnMoeGatingTopK as k3 calls it (sigmoid, groups by their top two,
// renormalised, scaled) against the pure-Go backend's router: the same
// experts in the same order, weights within 1e-5.
func TestHWMoeGatingTopK(t *testing.T) {
	ctx := context(t)
	rng := rand.New(rand.NewPCG(7, 8))
	const T, E, K, G, KG = 4, 64, 6, 8, 3
	logits, bias := make([]float32, T*E), make([]float32, E)
	normals(rng, logits, 1)
	normals(rng, bias, 0.1)
	// The reference.
	c := cpu.New(1)
	defer c.Close()
	up := func(v []float32, shape ...int) compute.Tensor {
		x, err := c.FromHost(compute.F32, compute.F32, f32bytes(v), shape...)
		require.NoError(t, err)
		return x
	}
	ri, err := c.Alloc(compute.I32, T, K)
	require.NoError(t, err)
	rw, err := c.Alloc(compute.F32, T, K)
	require.NoError(t, err)
	require.NoError(t, c.MoERoute(&compute.RouteArgs{Logits: up(logits, T, E), Bias: up(bias, E), TopK: K, NumGroups: G, TopKGroup: KG,
		Renormalize: true, Scale: 2.5, Indices: ri, Weights: rw}))
	wantIdx, wantW := make([]int32, T*K), make([]float32, T*K)
	require.NoError(t, c.Read(&wantIdx, ri))
	require.NoError(t, c.Read(&wantW, rw))

	dev := func(b []byte) acl.DevPtr { return onDevice(t, ctx, b) }
	desc := func(dt acl.DataType, p acl.DevPtr, dims ...int64) *acl.Tensor {
		return describe(t, ctx, dt, p, dims...)
	}
	yP, iP := dev(make([]byte, 4*T*K)), dev(make([]byte, 4*T*K))
	op, err := ctx.MoeGatingTopK(desc(acl.Float, dev(f32bytes(logits)), T, E), desc(acl.Float, dev(f32bytes(bias)), E), K, KG, G, true, 2.5,
		desc(acl.Float, yP, T, K), desc(acl.Int32, iP, T, K))
	require.NoError(t, err)
	ws := workspace(t, ctx, op)
	s, err := ctx.NewStream()
	require.NoError(t, err)
	defer s.Destroy()
	require.NoError(t, op.Launch(s, ws))
	require.NoError(t, s.Sync())
	gotW, gotI := make([]byte, 4*T*K), make([]byte, 4*T*K)
	require.NoError(t, ctx.CopyToHost(gotW, yP))
	require.NoError(t, ctx.CopyToHost(gotI, iP))
	for i := range T * K {
		require.Equal(t, wantIdx[i], int32(binary.LittleEndian.Uint32(gotI[4*i:])), "expert %d", i)
	}
	for i, w := range bytesF32(gotW) {
		require.InDelta(t, wantW[i], w, 1e-5, "weight %d", i)
	}
}

// aclnnAmax over the last dimension (keepDim) and aclnnLog, the softmax
// statistics of the attention composition, against float64, over a
// transposed (strided) input.
func TestHWAmaxLog(t *testing.T) {
	ctx := context(t)
	rng := rand.New(rand.NewPCG(9, 10))
	const R, N = 5, 37
	x := make([]float32, N*R) // stored [N, R]; read as [R, N]
	normals(rng, x, 4)
	xP := onDevice(t, ctx, f32bytes(x))
	xT, err := ctx.NewTensor(acl.TensorDesc{DType: acl.Float, Format: acl.FormatND, Dims: []int64{R, N}, Strides: []int64{1, R}, Data: xP, StorageDims: []int64{N * R}})
	require.NoError(t, err)
	defer xT.Destroy()
	mP, lP := onDevice(t, ctx, make([]byte, 4*R)), onDevice(t, ctx, make([]byte, 4*R))
	s, err := ctx.NewStream()
	require.NoError(t, err)
	defer s.Destroy()
	amax, err := ctx.Amax(xT, []int64{-1}, true, describe(t, ctx, acl.Float, mP, R, 1))
	require.NoError(t, err)
	require.NoError(t, amax.Launch(s, workspace(t, ctx, amax)))
	// aclnnLog of positive values
	pos := make([]float32, R)
	for r := range R {
		pos[r] = float32(r) + 0.5
	}
	log, err := ctx.Unary("aclnnLog", describe(t, ctx, acl.Float, onDevice(t, ctx, f32bytes(pos)), R), describe(t, ctx, acl.Float, lP, R))
	require.NoError(t, err)
	require.NoError(t, log.Launch(s, workspace(t, ctx, log)))
	require.NoError(t, s.Sync())
	gotM, gotL := make([]byte, 4*R), make([]byte, 4*R)
	require.NoError(t, ctx.CopyToHost(gotM, mP))
	require.NoError(t, ctx.CopyToHost(gotL, lP))
	for r, m := range bytesF32(gotM) {
		want := math.Inf(-1)
		for i := range N {
			want = max(want, float64(x[i*R+r]))
		}
		require.Equal(t, float32(want), m, "max of row %d", r)
	}
	for r, l := range bytesF32(gotL) {
		require.InDelta(t, math.Log(float64(pos[r])), float64(l), 1e-6, "log of %g", pos[r])
	}
}

// aclnnMatmul as the backend calls it with a prepared weight: an f32 x
// times a bf16 weight [N, K] stored as its transpose [K, N] in FRACTAL_NZ
// (nz.Pack) and described as such, against float64. Shapes off the 16
// grid exercise the padding.
func TestHWMatmulNZ(t *testing.T) {
	ctx := context(t)
	rng := rand.New(rand.NewPCG(11, 12))
	for _, s := range [][3]int{{4, 48, 64}, {3, 37, 21}} {
		M, N, K := s[0], s[1], s[2]
		x := make([]float32, M*K)
		normals(rng, x, 1)
		w := make([]uint16, N*K) // [N, K] row-major, bf16
		for i := range w {
			w[i] = floatx.BF16(float32(rng.NormFloat64()))
		}
		wt := make([]uint16, K*N) // its transpose [K, N]
		for n := range N {
			for k := range K {
				wt[k*N+n] = w[n*K+k]
			}
		}
		l, err := nz.NewLayout([]int{K, N}, nz.C0(2))
		require.NoError(t, err)
		packed := make([]uint16, l.Len())
		require.NoError(t, nz.Pack(l, packed, wt))
		raw := make([]byte, 2*len(packed))
		for i, v := range packed {
			binary.LittleEndian.PutUint16(raw[2*i:], v)
		}
		xP, wP, oP := onDevice(t, ctx, f32bytes(x)), onDevice(t, ctx, raw), onDevice(t, ctx, make([]byte, 4*M*N))
		sd := l.StorageDims(nil)
		tw, err := ctx.NewTensor(acl.TensorDesc{DType: acl.BF16, Format: acl.FormatFractalNZ, Dims: []int64{int64(K), int64(N)},
			Strides: []int64{int64(N), 1}, StorageDims: []int64{int64(sd[0]), int64(sd[1]), int64(sd[2]), int64(sd[3])}, Data: wP})
		require.NoError(t, err)
		defer tw.Destroy()
		op, err := ctx.Matmul("aclnnMatmul", describe(t, ctx, acl.Float, xP, int64(M), int64(K)), tw, describe(t, ctx, acl.Float, oP, int64(M), int64(N)), 0)
		require.NoError(t, err, "an f32 x with a bf16 FRACTAL_NZ weight, as the backend passes them")
		st, err := ctx.NewStream()
		require.NoError(t, err)
		require.NoError(t, op.Launch(st, workspace(t, ctx, op)))
		require.NoError(t, st.Sync())
		require.NoError(t, st.Destroy())
		got := make([]byte, 4*M*N)
		require.NoError(t, ctx.CopyToHost(got, oP))
		out := bytesF32(got)
		for m := range M {
			for n := range N {
				var want float64
				for k := range K {
					want += float64(x[m*K+k]) * float64(floatx.FromBF16(w[n*K+k]))
				}
				require.InDelta(t, want, out[m*N+n], 1e-2*math.Sqrt(float64(K)), "%v: out[%d][%d]", s, m, n)
			}
		}
	}
}

// aclnnMoeInitRoutingV2 (dropless, cumulative counts) then
// aclnnGroupedMatmulV4 over the sorted rows with one stacked weight, the
// grouped expert route's two device operators: the routing exactly (each
// pair's row at its place, the counts), the products against float64.
// The weight is a strided view [E, K, N] of experts stored [N, K], in f32
// and in bf16 beside f32 rows (what k3 passes for a bf16 checkpoint, which
// the operator's documentation does not list: this test decides it).
func TestHWMoeRoutingGroupedMatmul(t *testing.T) {
	ctx := context(t)
	rng := rand.New(rand.NewPCG(11, 12))
	const T, K, E, H, N = 6, 3, 5, 32, 48
	x, idx := make([]float32, T*H), make([]int32, T*K)
	normals(rng, x, 1)
	count := make([]int, E)
	for i := range idx {
		idx[i] = int32(rng.IntN(E - 1)) // the last expert has no rows
		count[idx[i]]++
	}
	dev := func(b []byte) acl.DevPtr { return onDevice(t, ctx, b) }
	desc := func(dt acl.DataType, p acl.DevPtr, dims ...int64) *acl.Tensor {
		return describe(t, ctx, dt, p, dims...)
	}
	s, err := ctx.NewStream()
	require.NoError(t, err)
	defer s.Destroy()
	run := func(op *acl.Op, err error) {
		t.Helper()
		require.NoError(t, err)
		require.NoError(t, op.Launch(s, workspace(t, ctx, op)))
		require.NoError(t, s.Sync())
	}
	exP, rowP, csP := dev(make([]byte, 4*T*K*H)), dev(make([]byte, 4*T*K)), dev(make([]byte, 4*E))
	run(ctx.MoeInitRouting(desc(acl.Float, dev(f32bytes(x)), T, H), desc(acl.Int32, dev(i32(idx)), T, K), E,
		desc(acl.Float, exP, T*K, H), desc(acl.Int32, rowP, T*K), desc(acl.Int32, csP, E)))
	exB, rowB, csB := make([]byte, 4*T*K*H), make([]byte, 4*T*K), make([]byte, 4*E)
	require.NoError(t, ctx.CopyToHost(exB, exP))
	require.NoError(t, ctx.CopyToHost(rowB, rowP))
	require.NoError(t, ctx.CopyToHost(csB, csP))
	ex := bytesF32(exB)
	cum := make([]int64, E)
	c := 0
	for e := range E {
		c += count[e]
		cum[e] = int64(c)
		require.Equal(t, int32(c), int32(binary.LittleEndian.Uint32(csB[4*e:])), "cumulative count of expert %d", e)
	}
	seen := make([]bool, T*K)
	for p := range T * K {
		i := int(int32(binary.LittleEndian.Uint32(rowB[4*p:])))
		require.True(t, i >= 0 && i < T*K && !seen[i], "pair %d at place %d", p, i)
		seen[i] = true
		e := int(idx[p])
		require.True(t, int64(i) >= cum[e]-int64(count[e]) && int64(i) < cum[e], "pair %d (expert %d) at place %d, outside its group", p, e, i)
		require.Equal(t, x[p/K*H:p/K*H+H], ex[i*H:i*H+H], "row of pair %d", p)
	}
	glB := make([]byte, 8*E)
	for e, v := range cum {
		binary.LittleEndian.PutUint64(glB[8*e:], uint64(v))
	}
	for _, dt := range []acl.DataType{acl.Float, acl.BF16} {
		t.Run(map[acl.DataType]string{acl.Float: "f32", acl.BF16: "bf16"}[dt], func(t *testing.T) {
			w := make([]float32, E*N*H) // [E, N, H]: each expert [N, K=H]
			var wb []byte
			for i := range w {
				w[i] = float32(rng.NormFloat64())
				if dt == acl.BF16 {
					w[i] = floatx.FromBF16(floatx.BF16(w[i]))
				}
			}
			if dt == acl.BF16 {
				wb = make([]byte, 2*len(w))
				for i, v := range w {
					binary.LittleEndian.PutUint16(wb[2*i:], floatx.BF16(v))
				}
			} else {
				wb = f32bytes(w)
			}
			tw, err := ctx.NewTensor(acl.TensorDesc{DType: dt, Dims: []int64{E, H, N}, Strides: []int64{N * H, 1, H},
				StorageDims: []int64{E * N * H}, Format: acl.FormatND, Data: dev(wb)})
			require.NoError(t, err)
			defer tw.Destroy()
			outP := dev(make([]byte, 4*T*K*N))
			run(ctx.GroupedMatmul(desc(acl.Float, exP, T*K, H), tw, desc(acl.Int64, dev(glB), E), desc(acl.Float, outP, T*K, N)))
			outB := make([]byte, 4*T*K*N)
			require.NoError(t, ctx.CopyToHost(outB, outP))
			out := bytesF32(outB)
			for p := range T * K {
				i, e := int(int32(binary.LittleEndian.Uint32(rowB[4*p:]))), int(idx[p])
				for n := range N {
					var want float64
					for k := range H {
						want += float64(x[p/K*H+k]) * float64(w[(e*N+n)*H+k])
					}
					require.InDelta(t, want, out[i*N+n], 1e-3*math.Sqrt(H), "pair %d, column %d", p, n)
				}
			}
		})
	}
}

// Cross-stream capture as the backend's side streams use it: inside a
// capture on the main stream, a fork event recorded there and waited on
// by a second stream makes that stream join the capture; its product is
// captured too, and a join event returns it. Replays with new inputs
// against float64.
func TestHWCrossStreamCapture(t *testing.T) {
	ctx := context(t)
	rng := rand.New(rand.NewPCG(13, 14))
	const M, K, N = 16, 64, 32
	w1, w2 := make([]float32, K*K), make([]float32, N*K)
	normals(rng, w1, 1.0/8)
	normals(rng, w2, 1.0/8)
	xP, yP, zP := onDevice(t, ctx, make([]byte, 4*M*K)), onDevice(t, ctx, make([]byte, 4*M*K)), onDevice(t, ctx, make([]byte, 4*M*N))
	wT := func(p acl.DevPtr, n int) *acl.Tensor { // [K, n] view of a row-major [n, K] weight
		x, err := ctx.NewTensor(acl.TensorDesc{DType: acl.Float, Dims: []int64{K, int64(n)}, Strides: []int64{1, K},
			StorageDims: []int64{int64(n), K}, Format: acl.FormatND, Data: p})
		require.NoError(t, err)
		t.Cleanup(func() { x.Destroy() })
		return x
	}
	op1, err := ctx.Matmul("aclnnMatmul", describe(t, ctx, acl.Float, xP, M, K), wT(onDevice(t, ctx, f32bytes(w1)), K),
		describe(t, ctx, acl.Float, yP, M, K), 0)
	require.NoError(t, err)
	op2, err := ctx.Matmul("aclnnMatmul", describe(t, ctx, acl.Float, yP, M, K), wT(onDevice(t, ctx, f32bytes(w2)), N),
		describe(t, ctx, acl.Float, zP, M, N), 0)
	require.NoError(t, err)
	for _, op := range []*acl.Op{op1, op2} {
		require.NoError(t, op.SetRepeatable())
		defer op.Destroy()
	}
	ws1, ws2 := workspace(t, ctx, op1), workspace(t, ctx, op2)
	main, err := ctx.NewStream()
	require.NoError(t, err)
	defer main.Destroy()
	side, err := ctx.NewStream()
	require.NoError(t, err)
	defer side.Destroy()
	fork, err := ctx.NewEvent()
	require.NoError(t, err)
	defer fork.Destroy()
	join, err := ctx.NewEvent()
	require.NoError(t, err)
	defer join.Destroy()
	// The side stream forks and joins once, then twice in one capture (as
	// every layer's shared experts do in a captured decode step: the
	// second product recomputes the same z from the same y).
	for forks := 1; forks <= 2; forks++ {
		crossStreamCapture(t, ctx, main, side, fork, join, forks, func(s *acl.Stream) error { return op1.Launch(s, ws1) },
			func(s *acl.Stream) error { return op2.Launch(s, ws2) }, func(x []float32) {
				normals(rng, x, 1)
				require.NoError(t, ctx.CopyToDevice(xP, f32bytes(x)))
			}, zP, w1, w2, M, K, N)
	}
}

// crossStreamCapture captures first on main, then forks times second on
// side between a fork and a join event, and replays the graph twice on
// new inputs (fill), checking z = (x·w1ᵀ)·w2ᵀ against float64.
func crossStreamCapture(t *testing.T, ctx *acl.Context, main, side *acl.Stream, fork, join *acl.Event, forks int,
	first, second func(*acl.Stream) error, fill func(x []float32), zP acl.DevPtr, w1, w2 []float32, M, K, N int) {
	t.Helper()
	g, err := main.Capture(acl.CaptureThreadLocal, func() error {
		steps := []func() error{func() error { return first(main) }}
		for range forks {
			steps = append(steps,
				func() error { return main.Record(fork) },
				func() error { return side.Wait(fork) },
				func() error { return second(side) },
				func() error { return side.Record(join) },
				func() error { return main.Wait(join) })
		}
		for _, f := range steps {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err, "%d forks", forks)
	defer g.Destroy()
	x := make([]float32, M*K)
	for range 2 {
		fill(x)
		require.NoError(t, g.Replay(main))
		require.NoError(t, main.Sync())
		got := make([]byte, 4*M*N)
		require.NoError(t, ctx.CopyToHost(got, zP))
		z := bytesF32(got)
		for m := range M {
			y := make([]float64, K)
			for j := range K {
				for k := range K {
					y[j] += float64(x[m*K+k]) * float64(w1[j*K+k])
				}
			}
			for n := range N {
				var want float64
				for k := range K {
					want += y[k] * float64(w2[n*K+k])
				}
				require.InDelta(t, want, z[m*N+n], 1e-3*float64(K), "z[%d][%d], %d forks", m, n, forks)
			}
		}
	}
}

// aclnnInplaceIndexCopy along the first dimension with int32 indices, as
// the backend's slot-mapped cache writes and state put-backs call it:
// each source row lands in the row its index names, the others keep
// their values, exactly (a copy).
func TestHWInplaceIndexCopy(t *testing.T) {
	ctx := context(t)
	rng := rand.New(rand.NewPCG(11, 12))
	const R, W = 9, 37
	self, src := make([]float32, R*W), make([]float32, 3*W)
	normals(rng, self, 1)
	normals(rng, src, 1)
	idx := []int32{7, 0, 4}
	selfP := onDevice(t, ctx, f32bytes(self))
	s, err := ctx.NewStream()
	require.NoError(t, err)
	defer s.Destroy()
	op, err := ctx.InplaceIndexCopy(describe(t, ctx, acl.Float, selfP, R, W), 0,
		describe(t, ctx, acl.Int32, onDevice(t, ctx, i32(idx)), 3), describe(t, ctx, acl.Float, onDevice(t, ctx, f32bytes(src)), 3, W))
	require.NoError(t, err)
	require.NoError(t, op.Launch(s, workspace(t, ctx, op)))
	require.NoError(t, s.Sync())
	got := make([]byte, 4*R*W)
	require.NoError(t, ctx.CopyToHost(got, selfP))
	want := append([]float32(nil), self...)
	for i, r := range idx {
		copy(want[int(r)*W:int(r+1)*W], src[i*W:(i+1)*W])
	}
	require.Equal(t, want, bytesF32(got))
}

// runOnce launches op on a new stream and waits for it.
func runOnce(t *testing.T, ctx *acl.Context, op *acl.Op) {
	t.Helper()
	s, err := ctx.NewStream()
	require.NoError(t, err)
	defer s.Destroy()
	require.NoError(t, op.Launch(s, workspace(t, ctx, op)))
	require.NoError(t, s.Sync())
}

// bf16Values draws n normal deviates times scale rounded to bf16: the
// values and their bf16 bytes.
func bf16Values(rng *rand.Rand, n int, scale float64) ([]float64, []byte) {
	v, b := make([]float64, n), make([]byte, 2*n)
	for i := range v {
		h := floatx.BF16(float32(rng.NormFloat64() * scale))
		v[i] = float64(floatx.FromBF16(h))
		binary.LittleEndian.PutUint16(b[2*i:], h)
	}
	return v, b
}

// The paged cache of the fused DSA tests: blocks of bs rows, the
// sequence's blocks in table order.
var (
	dsaTable   = []int32{2, 0, 3}
	dsaBlock   = 128
	dsaBlocks  = 4
	dsaKeys    = 300 // in three blocks, the last partly
	dsaQueries = 3   // the last three positions
)

// dsaRow is where position s of the sequence lies in the cache.
func dsaRow(s int) int { return int(dsaTable[s/dsaBlock])*dsaBlock + s%dsaBlock }

// aclnnLightningIndexer as k3 calls it (fused.go): each query's top 16
// positions by Σ_h w_h·ReLU(q_h·k) over the keys up to its own position
// (the last keys, which score highest, only from the queries that see
// them), against float64 over the same bf16 operands. The device's order within
// a list is not asserted (SparseFlashAttention does not need it), only
// the set; a position whose score is within 2⁻⁸ of the sixteenth's may
// stand in for another.
func TestHWLightningIndexer(t *testing.T) {
	ctx := context(t)
	rng := rand.New(rand.NewPCG(7, 8))
	const N1, D, K = 64, 128, 16
	T, bs := dsaQueries, dsaBlock
	q, qb := bf16Values(rng, T*N1*D, 1)
	k, kb := bf16Values(rng, dsaBlocks*bs*D, 1)
	w, wb := bf16Values(rng, T*N1, 1)
	// Positive weights and the last keys four times as long: those keys
	// top every list that may see them, so causality shows.
	for i := range w {
		w[i] = math.Abs(w[i])
		binary.LittleEndian.PutUint16(wb[2*i:], floatx.BF16(float32(w[i])))
	}
	for p := dsaKeys - T + 1; p < dsaKeys; p++ {
		for c := range D {
			j := dsaRow(p)*D + c
			k[j] *= 4
			binary.LittleEndian.PutUint16(kb[2*j:], floatx.BF16(float32(k[j])))
		}
	}
	up := func(b []byte) acl.DevPtr { return onDevice(t, ctx, b) }
	desc := func(dt acl.DataType, p acl.DevPtr, dims ...int64) *acl.Tensor {
		return describe(t, ctx, dt, p, dims...)
	}
	ixP := up(make([]byte, 4*T*K))
	op, err := ctx.LightningIndexer(desc(acl.BF16, up(qb), 1, int64(T), N1, D), desc(acl.BF16, up(kb), int64(dsaBlocks), int64(bs), 1, D),
		desc(acl.BF16, up(wb), 1, int64(T), N1), desc(acl.Int32, up(i32([]int32{int32(dsaKeys)})), 1),
		desc(acl.Int32, up(i32(dsaTable)), 1, int64(len(dsaTable))), K, desc(acl.Int32, ixP, 1, int64(T), 1, K))
	require.NoError(t, err)
	runOnce(t, ctx, op)
	raw := make([]byte, 4*T*K)
	require.NoError(t, ctx.CopyToHost(raw, ixP))
	for i := range T {
		pos := dsaKeys - T + i
		score := make([]float64, pos+1)
		for p := range score {
			r := dsaRow(p)
			for h := range N1 {
				var dot float64
				for c := range D {
					dot += q[(i*N1+h)*D+c] * k[r*D+c]
				}
				score[p] += w[i*N1+h] * max(dot, 0)
			}
		}
		order := make([]int, len(score))
		for p := range order {
			order[p] = p
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(score[b], score[a]) })
		kth := score[order[K-1]]
		want := map[int]bool{}
		for _, p := range order[:K] {
			want[p] = true
		}
		for j := range K {
			p := int(int32(binary.LittleEndian.Uint32(raw[4*(i*K+j):])))
			require.True(t, p >= 0 && p <= pos, "query %d slot %d: position %d outside 0..%d", i, j, p, pos)
			if !want[p] {
				require.InDelta(t, kth, score[p], math.Abs(kth)/256, "query %d slot %d: position %d (score %g) is not in the top %d (the last %g)", i, j, p, score[p], K, kth)
			}
		}
	}
}

// aclnnSparseFlashAttention in MLA-absorb mode as k3 calls it (fused.go),
// DeepSeek's shapes (latent 512, rope 64) with a sparse count of 2048
// mostly −1: each query attends to its listed positions up to its own,
// against float64 over the same bf16 operands, the output within bf16's
// rounding and the softmax's max and sum within 1e-3.
func TestHWSparseFlashAttention(t *testing.T) {
	ctx := context(t)
	rng := rand.New(rand.NewPCG(9, 10))
	const N, Dc, Dr, K = 16, 512, 64, 2048
	const scale = 0.0417
	T, bs := dsaQueries, dsaBlock
	q, qb := bf16Values(rng, T*N*Dc, 1)
	qr, qrb := bf16Values(rng, T*N*Dr, 1)
	kv, kvb := bf16Values(rng, dsaBlocks*bs*Dc, 1)
	kr, krb := bf16Values(rng, dsaBlocks*bs*Dr, 1)
	idx := make([]int32, T*K)
	for i := range idx {
		idx[i] = -1
	}
	for i := range T {
		for j, p := range rng.Perm(dsaKeys)[:100] {
			idx[i*K+j] = int32(p) // some past the query's position: skipped
		}
	}
	up := func(b []byte) acl.DevPtr { return onDevice(t, ctx, b) }
	desc := func(dt acl.DataType, p acl.DevPtr, dims ...int64) *acl.Tensor {
		return describe(t, ctx, dt, p, dims...)
	}
	outP, mxP, smP := up(make([]byte, 2*T*N*Dc)), up(make([]byte, 4*T*N)), up(make([]byte, 4*T*N))
	op, err := ctx.SparseFlashAttention(desc(acl.BF16, up(qb), int64(T), N, Dc), desc(acl.BF16, up(kvb), int64(dsaBlocks), int64(bs), 1, Dc),
		desc(acl.Int32, up(i32(idx)), int64(T), 1, K), desc(acl.Int32, up(i32(dsaTable)), 1, int64(len(dsaTable))),
		desc(acl.Int32, up(i32([]int32{int32(T)})), 1), desc(acl.Int32, up(i32([]int32{int32(dsaKeys)})), 1),
		desc(acl.BF16, up(qrb), int64(T), N, Dr), desc(acl.BF16, up(krb), int64(dsaBlocks), int64(bs), 1, Dr), scale,
		desc(acl.BF16, outP, int64(T), N, Dc), desc(acl.Float, mxP, 1, int64(T), N), desc(acl.Float, smP, 1, int64(T), N))
	require.NoError(t, err)
	runOnce(t, ctx, op)
	out, mx, sm := make([]byte, 2*T*N*Dc), make([]byte, 4*T*N), make([]byte, 4*T*N)
	require.NoError(t, ctx.CopyToHost(out, outP))
	require.NoError(t, ctx.CopyToHost(mx, mxP))
	require.NoError(t, ctx.CopyToHost(sm, smP))
	gotMax, gotSum := bytesF32(mx), bytesF32(sm)
	for i := range T {
		pos := dsaKeys - T + i
		var rows []int
		for _, p := range idx[i*K : (i+1)*K] {
			if p >= 0 && int(p) <= pos {
				rows = append(rows, dsaRow(int(p)))
			}
		}
		for h := range N {
			z := make([]float64, len(rows))
			m := math.Inf(-1)
			for j, r := range rows {
				var dot float64
				for c := range Dc {
					dot += q[(i*N+h)*Dc+c] * kv[r*Dc+c]
				}
				for c := range Dr {
					dot += qr[(i*N+h)*Dr+c] * kr[r*Dr+c]
				}
				z[j] = scale * dot
				m = max(m, z[j])
			}
			var sum float64
			want := make([]float64, Dc)
			for j, r := range rows {
				e := math.Exp(z[j] - m)
				sum += e
				for c := range Dc {
					want[c] += e * kv[r*Dc+c]
				}
			}
			require.InDelta(t, m, gotMax[i*N+h], 1e-3*(1+math.Abs(m)), "query %d head %d: max", i, h)
			require.InDelta(t, sum, gotSum[i*N+h], 1e-3*sum, "query %d head %d: sum", i, h)
			for c := range Dc {
				g := float64(floatx.FromBF16(binary.LittleEndian.Uint16(out[2*((i*N+h)*Dc+c):])))
				require.InDelta(t, want[c]/sum, g, 1e-3+math.Abs(want[c]/sum)/128, "query %d head %d element %d", i, h, c)
			}
		}
	}
}
