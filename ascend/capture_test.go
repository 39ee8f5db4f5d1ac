package ascend

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// mlpStep is a decode step made of mapped operations: embed the ids,
// normalise, a SwiGLU feed-forward and the residual.
type mlpStep struct {
	table, norm, gate, up, down compute.Tensor
	ids, out                    compute.Tensor
}

func newMLPStep(t *testing.T, b compute.Backend, rng *rand.Rand, B, V, D, F int) *mlpStep {
	t.Helper()
	r := rand.New(rand.NewPCG(rng.Uint64(), 0)) // the same weights on every backend given the same seed
	m := &mlpStep{}
	var err error
	for _, w := range []struct {
		t     *compute.Tensor
		dt    compute.DType
		shape []int
	}{{&m.table, compute.BF16, []int{V, D}}, {&m.norm, compute.F32, []int{D}}, {&m.gate, compute.BF16, []int{F, D}},
		{&m.up, compute.BF16, []int{F, D}}, {&m.down, compute.BF16, []int{D, F}}} {
		n := 1
		for _, d := range w.shape {
			n *= d
		}
		raw := bf16bytes(randF32(r, n))
		src := compute.BF16
		if w.dt == compute.F32 {
			raw, src = f32bytes(randF32(r, n)), compute.F32
		}
		*w.t, err = b.FromHost(w.dt, src, raw, w.shape...)
		require.NoError(t, err)
	}
	m.ids, err = b.Alloc(compute.I32, B)
	require.NoError(t, err)
	m.out, err = b.Alloc(compute.F32, B, D)
	require.NoError(t, err)
	return m
}

// run queues the step; its scratch tensors are freed at the end.
func (m *mlpStep) run(b compute.Backend) error {
	B, D, F := m.out.Dims[0], m.out.Dims[1], m.gate.Dims[0]
	var scratch []compute.Tensor
	alloc := func(shape ...int) compute.Tensor {
		x, err := b.Alloc(compute.F32, shape...)
		if err == nil {
			scratch = append(scratch, x)
		}
		return x
	}
	defer func() {
		for _, x := range scratch {
			b.Free(x)
		}
	}()
	h, n, g, u, a := alloc(B, D), alloc(B, D), alloc(B, F), alloc(B, F), alloc(B, F)
	for _, err := range []error{
		b.Embedding(h, m.table, m.ids),
		b.RMSNorm(n, h, m.norm, 1e-6),
		b.MatMul(g, n, m.gate),
		b.MatMul(u, n, m.up),
		b.GatedAct(compute.Activation{Kind: compute.SwiGLU}, a, g, u),
		b.MatMul(m.out, a, m.down),
		b.Binary(compute.Add, m.out, m.out, h),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// A captured step replays with new ids written between replays and
// matches the step run eagerly on the pure-Go backend each time.
func TestCaptureDecodeStep(t *testing.T) { eachDriver(t, 32<<20, testCaptureDecodeStep) }

func testCaptureDecodeStep(t *testing.T, a *Backend) {
	const B, V, D, F = 3, 40, 32, 48
	c := cpu.New(1)
	defer c.Close()
	ma := newMLPStep(t, a, rand.New(rand.NewPCG(7, 7)), B, V, D, F)
	mc := newMLPStep(t, c, rand.New(rand.NewPCG(7, 7)), B, V, D, F)
	usedBefore := a.arena.used
	launched := a.Launches()

	g, err := a.Capture(func() error {
		if err := a.Write(ma.ids, []int32{0, 0, 0}); err == nil {
			t.Error("Write inside a capture succeeded")
		} else {
			assert.ErrorIs(t, err, ErrCapturing)
		}
		return ma.run(a)
	})
	require.NoError(t, err)
	assert.Greater(t, a.arena.used, usedBefore, "the graph keeps its scratch spans")
	assert.Equal(t, launched, a.Launches(), "a capture launches nothing")

	rng := rand.New(rand.NewPCG(8, 8))
	for range 4 {
		ids := []int32{int32(rng.IntN(V)), int32(rng.IntN(V)), int32(rng.IntN(V))}
		require.NoError(t, a.Write(ma.ids, ids))
		require.NoError(t, g.Replay())
		require.NoError(t, c.Write(mc.ids, ids))
		require.NoError(t, mc.run(c))
		assert.InDeltaSlice(t, read(t, c, mc.out), read(t, a, ma.out), 1e-4, "ids %v", ids)
	}
	require.NoError(t, g.Close())
	assert.Equal(t, usedBefore, a.arena.used, "closing the graph frees its spans")
	require.ErrorIs(t, g.Replay(), ErrInvalidArgument)
	assert.Equal(t, launched, a.Launches(), "a replay launches no operator one by one")

	// The eager path gives the same values, launching its operators.
	require.NoError(t, ma.run(a))
	assert.Greater(t, a.Launches(), launched)
	require.NoError(t, mc.run(c))
	assert.InDeltaSlice(t, read(t, c, mc.out), read(t, a, ma.out), 1e-4)
}

// A copy between views at any offset is an operator on the stream, so a
// captured step may append a row at an unaligned position: each replay
// copies what the source holds then.
func TestCaptureUnalignedCopy(t *testing.T) {
	eachDriver(t, 4<<20, func(t *testing.T, b *Backend) {
		src, err := b.Alloc(compute.F32, 3)
		require.NoError(t, err)
		dst, err := b.Alloc(compute.F32, 5, 3) // row 1 starts 12 bytes in: not 64-byte aligned
		require.NoError(t, err)
		g, err := b.Capture(func() error { return b.Copy(dst.Rows(1, 2), src) })
		require.NoError(t, err)
		defer g.Close()
		for i := range 3 {
			v := []float32{float32(i), float32(i) + 0.5, -float32(i)}
			require.NoError(t, b.Write(src, v))
			require.NoError(t, g.Replay())
			assert.Equal(t, v, read(t, b, dst.Rows(1, 2)), "replay %d", i)
		}
	})
}
