//go:build ascend && cgo

package ascend

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"k3/comm"
	"k3/compute"
	"k3/internal/cpu"
)

// hcclGroup makes n ranks, each with its own backend (and context, on
// the fake's two devices) and an HCCL communicator.
func hcclGroup(t *testing.T, n int) ([]*Backend, []*Comm) {
	t.Helper()
	bs := make([]*Backend, n)
	for i := range bs {
		bs[i] = fakeBackend(t, 16<<20)
	}
	root, err := NewRootInfo(bs[0])
	require.NoError(t, err)
	cs := make([]*Comm, n)
	var eg errgroup.Group
	for r := range n {
		eg.Go(func() (err error) {
			cs[r], err = NewComm(bs[r], n, r, root)
			return err
		})
	}
	require.NoError(t, eg.Wait())
	t.Cleanup(func() {
		for _, c := range cs {
			assert.NoError(t, c.Close())
		}
	})
	return bs, cs
}

// Every collective on HCCL (the fake, ranks as threads) against
// comm.Local on pure-Go backends, on the same inputs: the same values,
// the same bytes in Stats, and all-reduce bitwise the same on every rank.
func TestCommMatchesLocal(t *testing.T) {
	const n = 4
	bs, hs := hcclGroup(t, n)
	cb := make([]compute.Backend, n)
	for i := range cb {
		cb[i] = cpu.New(1)
	}
	ls, err := comm.NewLocal(cb)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(21, 22))
	ctx := context.Background()

	// run does f on every rank of both groups, each rank with its own
	// inputs; it returns rank r's output tensors' values per group.
	type rank struct {
		b compute.Backend
		c comm.Communicator
	}
	run := func(ins [][]float32, outLen int, f func(r rank, in, out compute.Tensor) error) (hccl, local [][]float32) {
		t.Helper()
		for g := range 2 {
			outs := make([][]float32, n)
			var eg errgroup.Group
			for r := range n {
				rk := rank{b: bs[r], c: hs[r]}
				if g == 1 {
					rk = rank{b: cb[r], c: ls[r]}
				}
				eg.Go(func() error {
					in, err := rk.b.Alloc(compute.F32, len(ins[r]))
					if err != nil {
						return err
					}
					if err := rk.b.Write(in, ins[r]); err != nil {
						return err
					}
					out := in
					if outLen > 0 {
						if out, err = rk.b.Alloc(compute.F32, outLen); err != nil {
							return err
						}
					}
					if err := f(rk, in, out); err != nil {
						return err
					}
					outs[r] = make([]float32, out.Len())
					return rk.b.Read(outs[r], out)
				})
			}
			require.NoError(t, eg.Wait())
			if g == 0 {
				hccl = outs
			} else {
				local = outs
			}
		}
		return hccl, local
	}
	inputs := func(k int) [][]float32 {
		ins := make([][]float32, n)
		for r := range ins {
			ins[r] = randF32(rng, k)
		}
		return ins
	}
	same := func(h, l [][]float32, tol float64, what string) {
		t.Helper()
		for r := range h {
			assert.InDeltaSlice(t, l[r], h[r], tol, "%s rank %d", what, r)
		}
	}

	h, l := run(inputs(37), 0, func(r rank, in, _ compute.Tensor) error { return r.c.AllReduce(ctx, in) })
	same(h, l, 1e-5, "all-reduce")
	for r := 1; r < n; r++ {
		assert.Equal(t, h[0], h[r], "all-reduce bits on rank %d", r)
	}
	h, l = run(inputs(9), 9*n, func(r rank, in, out compute.Tensor) error { return r.c.AllGather(ctx, out, in) })
	same(h, l, 0, "all-gather")
	h, l = run(inputs(6*n), 6, func(r rank, in, out compute.Tensor) error { return r.c.ReduceScatter(ctx, out, in) })
	same(h, l, 1e-5, "reduce-scatter")

	// all-to-all-v: rank r sends r+j+1 elements to rank j.
	counts := func(r int) (send, recv []int, ns, nr int) {
		for j := range n {
			send = append(send, r+j+1)
			recv = append(recv, j+r+1)
			ns += r + j + 1
			nr += j + r + 1
		}
		return
	}
	ins := make([][]float32, n)
	for r := range ins {
		_, _, ns, _ := counts(r)
		ins[r] = randF32(rng, ns)
	}
	h, l = run(ins, 0, func(r rank, in, _ compute.Tensor) error {
		send, recv, _, nr := counts(r.c.Rank())
		out, err := r.b.Alloc(compute.F32, nr)
		if err != nil {
			return err
		}
		if err := r.c.AllToAllV(ctx, out, recv, in, send); err != nil {
			return err
		}
		return r.b.Copy(in.Rows(0, nr), out) // nr equals ns here: the input's place holds the result
	})
	same(h, l, 0, "all-to-all-v")

	// A ring of sends.
	h, l = run(inputs(11), 11, func(r rank, in, out compute.Tensor) error {
		me := r.c.Rank()
		if me%2 == 0 {
			if err := r.c.Send(ctx, in, (me+1)%n); err != nil {
				return err
			}
			return r.c.Recv(ctx, out, (me+n-1)%n)
		}
		if err := r.c.Recv(ctx, out, (me+n-1)%n); err != nil {
			return err
		}
		return r.c.Send(ctx, in, (me+1)%n)
	})
	same(h, l, 0, "send/recv ring")
	_, _ = run(inputs(1), 0, func(r rank, _, _ compute.Tensor) error { return r.c.Barrier(ctx) })

	for r := range n {
		assert.Equal(t, ls[r].Stats(), hs[r].Stats(), "stats of rank %d", r)
	}
}

func TestCommErrors(t *testing.T) {
	bs, cs := hcclGroup(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	x, err := bs[0].Alloc(compute.F32, 4)
	require.NoError(t, err)
	require.ErrorIs(t, cs[0].AllReduce(ctx, x), context.Canceled)
	y, err := bs[0].Alloc(compute.F32, 5)
	require.NoError(t, err)
	require.ErrorIs(t, cs[0].AllGather(context.Background(), y, x), compute.ErrShape)
	require.ErrorIs(t, cs[0].Send(context.Background(), x, 0), compute.ErrShape)
	require.ErrorIs(t, cs[0].AllToAllV(context.Background(), x, []int{1, 9}, x, []int{2, 2}), compute.ErrShape)
}
