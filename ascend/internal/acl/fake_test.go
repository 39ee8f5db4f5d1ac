//go:build ascend && cgo

package acl

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeDir holds the fake CANN of testdata/fakecann, built once per run
// with the system C compiler.
var fakeDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fakecann")
	if err != nil {
		panic(err)
	}
	if err := BuildFake(dir, filepath.Join("testdata", "fakecann")); err != nil {
		panic(err)
	}
	fakeDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func fake(t *testing.T) (*Lib, *Context) {
	t.Helper()
	lib, err := Load(Options{LibDirs: []string{fakeDir}})
	require.NoError(t, err)
	ctx, err := lib.NewContext(0)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, ctx.Close()) })
	return lib, ctx
}

// The failures name what is missing and what to do. They run through the
// uncached loader's inputs: directories without the libraries.
func TestLoadErrors(t *testing.T) {
	loadMu.Lock()
	saved := loaded
	loaded = nil
	loadMu.Unlock()
	defer func() { loadMu.Lock(); loaded = saved; loadMu.Unlock() }()

	empty := t.TempDir()
	_, err := Load(Options{LibDirs: []string{empty}})
	require.ErrorIs(t, err, ErrLibrary)
	assert.Contains(t, err.Error(), "libascendcl.so")
	assert.Contains(t, err.Error(), empty)
	assert.Contains(t, err.Error(), "set_env.sh")

	// A library of the right name without the symbols.
	bare := t.TempDir()
	stub := filepath.Join(bare, "stub.c")
	require.NoError(t, os.WriteFile(stub, []byte("int k3_nothing(void) { return 0; }\n"), 0o644))
	for _, name := range append(runtimeLibs, "libopapi.so") {
		out, err := exec.Command("cc", "-shared", "-fPIC", "-o", filepath.Join(bare, name), stub).CombinedOutput()
		require.NoError(t, err, string(out))
	}
	_, err = Load(Options{LibDirs: []string{bare}})
	require.ErrorIs(t, err, ErrLibrary)
	assert.Contains(t, err.Error(), "symbol aclInit")

	// The runtime without any operator library.
	noOps := t.TempDir()
	for _, name := range runtimeLibs {
		data, err := os.ReadFile(filepath.Join(fakeDir, name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(noOps, name), data, 0o755))
	}
	_, err = Load(Options{LibDirs: []string{noOps}})
	require.ErrorIs(t, err, ErrLibrary)
	assert.Contains(t, err.Error(), "no operator library")
	assert.Contains(t, err.Error(), "libopapi.so")
}

func TestOperatorMissing(t *testing.T) {
	lib, _ := fake(t)
	_, _, _, err := lib.operator("aclnnNoSuchOperator", "V2", "")
	require.ErrorIs(t, err, ErrKernelMissing)
	assert.Contains(t, err.Error(), "aclnnNoSuchOperator")
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func bytesF32(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func randF32(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// Calls on other OS threads than the one that created the context work
// only because every shim call makes the context current: the fake's
// current context is per thread, as ACL's is, and a thread without one
// fails with 107002.
func TestContextOnAnyThread(t *testing.T) {
	_, ctx := fake(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // not unlocked: the thread ends with the goroutine, so each is new
			p, err := ctx.Malloc(256)
			if err != nil {
				errs <- err
				return
			}
			in := f32bytes([]float32{float32(i), 1, 2, 3})
			out := make([]byte, len(in))
			if err := ctx.CopyToDevice(p, in); err != nil {
				errs <- err
			} else if err := ctx.CopyToHost(out, p); err != nil {
				errs <- err
			} else if string(out) != string(in) {
				errs <- assert.AnError
			}
			if err := ctx.Free(p); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestMemoryErrors(t *testing.T) {
	_, ctx := fake(t)
	_, err := ctx.Malloc(4 << 30)
	require.ErrorIs(t, err, ErrOutOfMemory)
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, "aclrtMalloc", e.API)
	assert.Equal(t, 200000, e.Code)
	assert.Contains(t, e.Msg, "requested")

	// An address that is not device memory is refused with the runtime's
	// message, not written to.
	err = ctx.CopyToDevice(DevPtr{}.Add(4096), []byte{1, 2, 3})
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "not device memory")

	p, err := ctx.Malloc(64)
	require.NoError(t, err)
	require.NoError(t, ctx.Free(p))
	err = ctx.Free(p)
	require.ErrorIs(t, err, ErrInvalidArgument)
}

// matmulRef is out = x · wᵀ for x [M,K], w [N,K], in float64.
func matmulRef(x, w []float32, M, N, K int) []float32 {
	out := make([]float32, M*N)
	for m := range M {
		for n := range N {
			var s float64
			for k := range K {
				s += float64(x[m*K+k]) * float64(w[n*K+k])
			}
			out[m*N+n] = float32(s)
		}
	}
	return out
}

// device holds the buffers of one x·wᵀ product on the fake device.
type device struct {
	ctx       *Context
	x, w, out DevPtr
	tx, tw, o *Tensor
	host      *HostBuffer // x's bytes, then out's
	M, N, K   int
}

func newMatmul(t *testing.T, ctx *Context, w []float32, M, N, K int) *device {
	t.Helper()
	d := &device{ctx: ctx, M: M, N: N, K: K}
	var err error
	for _, p := range []struct {
		ptr *DevPtr
		n   int
	}{{&d.x, M * K}, {&d.w, N * K}, {&d.out, M * N}} {
		*p.ptr, err = ctx.Malloc(4 * p.n)
		require.NoError(t, err)
	}
	require.NoError(t, ctx.CopyToDevice(d.w, f32bytes(w)))
	d.tx, err = ctx.NewTensor(TensorDesc{DType: Float, Dims: []int64{int64(M), int64(K)}, Data: d.x})
	require.NoError(t, err)
	// k3 keeps w as [N, K]; aclnnMatmul reads it as its transpose [K, N]
	// through strides.
	d.tw, err = ctx.NewTensor(TensorDesc{DType: Float, Dims: []int64{int64(K), int64(N)}, Strides: []int64{1, int64(K)},
		StorageDims: []int64{int64(N), int64(K)}, Format: FormatND, Data: d.w})
	require.NoError(t, err)
	d.o, err = ctx.NewTensor(TensorDesc{DType: Float, Dims: []int64{int64(M), int64(N)}, Data: d.out})
	require.NoError(t, err)
	d.host, err = ctx.MallocHost(4 * max(M*K, M*N))
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, tt := range []*Tensor{d.tx, d.tw, d.o} {
			assert.NoError(t, tt.Destroy())
		}
		for _, p := range []DevPtr{d.x, d.w, d.out} {
			assert.NoError(t, ctx.Free(p))
		}
		assert.NoError(t, d.host.Free())
	})
	return d
}

// queue puts x's upload, the product and out's download on s.
func (d *device) queue(t *testing.T, s *Stream, op *Op, ws DevPtr) {
	t.Helper()
	require.NoError(t, s.Upload(d.x, d.host, 0, 4*d.M*d.K))
	require.NoError(t, op.Launch(s, ws))
	require.NoError(t, s.Download(d.host, 0, d.out, 4*d.M*d.N))
}

func TestMatmulOnStream(t *testing.T) {
	_, ctx := fake(t)
	rng := rand.New(rand.NewPCG(3, 4))
	M, N, K := 5, 7, 33
	x, w := randF32(rng, M*K), randF32(rng, N*K)
	d := newMatmul(t, ctx, w, M, N, K)
	s, err := ctx.NewStream()
	require.NoError(t, err)
	defer s.Destroy()

	op, err := ctx.Matmul("aclnnMatmul", d.tx, d.tw, d.o, 0)
	require.NoError(t, err)
	assert.Positive(t, op.WorkspaceSize)
	ws, err := ctx.Malloc(op.WorkspaceSize)
	require.NoError(t, err)
	defer ctx.Free(ws)

	copy(d.host.Bytes(), f32bytes(x))
	d.queue(t, s, op, ws)
	// Nothing has run until the stream is synchronised: the host buffer
	// still holds x.
	assert.Equal(t, x[:M*N], bytesF32(d.host.Bytes()[:4*M*N]))
	require.NoError(t, s.Sync())
	assert.InDeltaSlice(t, matmulRef(x, w, M, N, K), bytesF32(d.host.Bytes()[:4*M*N]), 1e-4)

	// A non-repeatable executor is consumed by its launch.
	err = op.Launch(s, ws)
	require.ErrorIs(t, err, ErrInvalidArgument)
}

func TestOpErrors(t *testing.T) {
	_, ctx := fake(t)
	d := newMatmul(t, ctx, make([]float32, 6*4), 3, 6, 4)
	s, err := ctx.NewStream()
	require.NoError(t, err)
	defer s.Destroy()

	// x [3,4] · out as the weight: shapes do not chain.
	_, err = ctx.Matmul("aclnnMatmul", d.tx, d.o, d.o, 0)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "aclnnMatmulGetWorkspaceSize")
	assert.Contains(t, err.Error(), "shapes")

	// A workspace smaller than phase 1 asked for is refused by phase 2.
	op, err := ctx.Matmul("aclnnMatmul", d.tx, d.tw, d.o, 0)
	require.NoError(t, err)
	small, err := ctx.Malloc(4)
	require.NoError(t, err)
	defer ctx.Free(small)
	err = op.Launch(s, small)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "workspace")

	// A descriptor of memory the device does not own.
	_, err = ctx.NewTensor(TensorDesc{DType: Float, Dims: []int64{4}, Data: DevPtr{}.Add(1 << 12)})
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "aclCreateTensor")
}

// Work on one stream waits for an event recorded on another.
func TestEventsOrderStreams(t *testing.T) {
	_, ctx := fake(t)
	rng := rand.New(rand.NewPCG(5, 6))
	M, N, K := 2, 3, 8
	x, w := randF32(rng, M*K), randF32(rng, N*K)
	d := newMatmul(t, ctx, w, M, N, K)
	a, err := ctx.NewStream()
	require.NoError(t, err)
	defer a.Destroy()
	b, err := ctx.NewStream()
	require.NoError(t, err)
	defer b.Destroy()
	start, err := ctx.NewEvent()
	require.NoError(t, err)
	defer start.Destroy()
	uploaded, err := ctx.NewEvent()
	require.NoError(t, err)
	defer uploaded.Destroy()

	copy(d.host.Bytes(), f32bytes(x))
	require.NoError(t, a.Record(start))
	require.NoError(t, a.Upload(d.x, d.host, 0, 4*M*K))
	require.NoError(t, a.Record(uploaded))
	require.NoError(t, b.Wait(uploaded))
	op, err := ctx.Matmul("aclnnMatmul", d.tx, d.tw, d.o, 0)
	require.NoError(t, err)
	ws, err := ctx.Malloc(op.WorkspaceSize)
	require.NoError(t, err)
	defer ctx.Free(ws)
	require.NoError(t, op.Launch(b, ws))
	require.NoError(t, b.Download(d.host, 0, d.out, 4*M*N))
	require.NoError(t, b.Sync()) // only b: its wait runs a's upload
	assert.InDeltaSlice(t, matmulRef(x, w, M, N, K), bytesF32(d.host.Bytes()[:4*M*N]), 1e-4)
	ms, err := uploaded.Elapsed(start)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, ms, float32(0))
}

// A captured decode-like step replays with whatever its host buffer holds
// at replay time; the capture survives goroutine moves because Capture
// locks the thread.
func TestCaptureReplay(t *testing.T) {
	_, ctx := fake(t)
	rng := rand.New(rand.NewPCG(7, 8))
	M, N, K := 1, 16, 64
	w := randF32(rng, N*K)
	d := newMatmul(t, ctx, w, M, N, K)
	s, err := ctx.NewStream()
	require.NoError(t, err)
	defer s.Destroy()
	op, err := ctx.Matmul("aclnnMatmul", d.tx, d.tw, d.o, 0)
	require.NoError(t, err)
	require.NoError(t, op.SetRepeatable())
	defer op.Destroy()
	ws, err := ctx.Malloc(op.WorkspaceSize)
	require.NoError(t, err)
	defer ctx.Free(ws)

	stop := make(chan struct{})
	defer close(stop)
	for range 4 { // busy goroutines to move the capturing one between threads
		go func() {
			for {
				select {
				case <-stop:
					return
				default:
					runtime.Gosched()
				}
			}
		}()
	}
	g, err := s.Capture(CaptureThreadLocal, func() error {
		for range 20 {
			runtime.Gosched()
		}
		d.queue(t, s, op, ws)
		return nil
	})
	require.NoError(t, err)
	defer g.Destroy()
	for range 3 {
		x := randF32(rng, M*K)
		copy(d.host.Bytes(), f32bytes(x))
		require.NoError(t, g.Replay(s))
		require.NoError(t, s.Sync())
		require.InDeltaSlice(t, matmulRef(x, w, M, N, K), bytesF32(d.host.Bytes()[:4*M*N]), 1e-4)
	}
}

func TestRMSNorm(t *testing.T) {
	_, ctx := fake(t)
	rng := rand.New(rand.NewPCG(9, 10))
	rows, D := 3, 40
	x, g := randF32(rng, rows*D), randF32(rng, D)
	eps := 1e-6
	var bufs [4]DevPtr
	var err error
	for i, n := range []int{rows * D, D, rows * D, rows} {
		bufs[i], err = ctx.Malloc(4 * n)
		require.NoError(t, err)
		defer ctx.Free(bufs[i])
	}
	require.NoError(t, ctx.CopyToDevice(bufs[0], f32bytes(x)))
	require.NoError(t, ctx.CopyToDevice(bufs[1], f32bytes(g)))
	var ts [4]*Tensor
	for i, dims := range [][]int64{{int64(rows), int64(D)}, {int64(D)}, {int64(rows), int64(D)}, {int64(rows), 1}} {
		ts[i], err = ctx.NewTensor(TensorDesc{DType: Float, Dims: dims, Data: bufs[i]})
		require.NoError(t, err)
		defer ts[i].Destroy()
	}
	op, err := ctx.RMSNorm(ts[0], ts[1], eps, ts[2], ts[3])
	require.NoError(t, err)
	s, err := ctx.NewStream()
	require.NoError(t, err)
	defer s.Destroy()
	require.NoError(t, op.Launch(s, DevPtr{}))
	require.NoError(t, s.Sync())
	got := make([]byte, 4*rows*D)
	require.NoError(t, ctx.CopyToHost(got, bufs[2]))
	want := make([]float32, rows*D)
	for r := range rows {
		var ss float64
		for _, v := range x[r*D : (r+1)*D] {
			ss += float64(v) * float64(v)
		}
		rs := 1 / math.Sqrt(ss/float64(D)+eps)
		for i := range D {
			want[r*D+i] = float32(float64(x[r*D+i]) * rs * float64(g[i]))
		}
	}
	assert.InDeltaSlice(t, want, bytesF32(got), 1e-5)

	_, err = ctx.RMSNorm(ts[0], ts[1], 0, ts[2], ts[3])
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "eps")
}
