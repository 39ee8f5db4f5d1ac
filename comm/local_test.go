package comm_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"k3/comm"
	"k3/compute"
	"k3/internal/cpu"
)

func group(t *testing.T, n int) []*comm.Local {
	t.Helper()
	bs := make([]compute.Backend, n)
	for i := range bs {
		bs[i] = cpu.New(1)
	}
	g, err := comm.NewLocal(bs)
	require.NoError(t, err)
	return g
}

func upload(t *testing.T, b compute.Backend, v []float32) compute.Tensor {
	t.Helper()
	x, err := b.Alloc(compute.F32, len(v))
	require.NoError(t, err)
	require.NoError(t, b.Write(x, v))
	return x
}

func read(t *testing.T, b compute.Backend, x compute.Tensor) []float32 {
	t.Helper()
	v := make([]float32, x.Len())
	require.NoError(t, b.Read(v, x))
	return v
}

// onRanks runs f on every rank concurrently.
func onRanks(g []*comm.Local, f func(r *comm.Local) error) error {
	var eg errgroup.Group
	for _, r := range g {
		eg.Go(func() error { return f(r) })
	}
	return eg.Wait()
}

func randVec(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

func TestCollectives(t *testing.T) {
	ctx := context.Background()
	for _, n := range []int{1, 2, 3, 4} {
		g := group(t, n)
		rng := rand.New(rand.NewPCG(uint64(n), 7))
		const m = 6
		in := make([][]float32, n)
		for r := range in {
			in[r] = randVec(rng, n*m)
		}
		// The sums a rank must see, added in rank order.
		sum := make([]float32, n*m)
		for _, v := range in {
			for i := range v {
				sum[i] += v[i]
			}
		}
		// All-to-all-v counts: rank i sends (i+j)%3 elements to rank j.
		cnt := func(i, j int) int { return (i + j) % 3 }
		reduced := make([][]float32, n)
		gathered := make([][]float32, n)
		scattered := make([][]float32, n)
		exchanged := make([][]float32, n)
		err := onRanks(g, func(r *comm.Local) error {
			i := r.Rank()
			b := cpu.New(1)
			x := upload(t, b, in[i])
			if err := r.AllReduce(ctx, x); err != nil {
				return err
			}
			reduced[i] = read(t, b, x)
			part := upload(t, b, in[i][:m])
			all, _ := b.Alloc(compute.F32, n*m)
			if err := r.AllGather(ctx, all, part); err != nil {
				return err
			}
			gathered[i] = read(t, b, all)
			mine, _ := b.Alloc(compute.F32, m)
			if err := r.ReduceScatter(ctx, mine, upload(t, b, in[i])); err != nil {
				return err
			}
			scattered[i] = read(t, b, mine)
			send, recv := make([]int, n), make([]int, n)
			for j := range n {
				send[j], recv[j] = cnt(i, j), cnt(j, i)
			}
			dst, _ := b.Alloc(compute.F32, n*m) // larger than needed: a prefix receives
			if err := r.AllToAllV(ctx, dst, recv, upload(t, b, in[i]), send); err != nil {
				return err
			}
			exchanged[i] = read(t, b, dst)
			return r.Barrier(ctx)
		})
		require.NoError(t, err, "n=%d", n)
		for i := range n {
			assert.Equal(t, sum, reduced[i], "all-reduce, n=%d rank %d", n, i)
			for j := range n {
				assert.Equal(t, in[j][:m], gathered[i][j*m:(j+1)*m], "all-gather, n=%d rank %d block %d", n, i, j)
			}
			assert.Equal(t, sum[i*m:(i+1)*m], scattered[i], "reduce-scatter, n=%d rank %d", n, i)
			// What rank i receives from each j: j's block for i.
			want := []float32{}
			for j := range n {
				off := 0
				for k := range i {
					off += cnt(j, k)
				}
				want = append(want, in[j][off:off+cnt(j, i)]...)
			}
			assert.Equal(t, want, exchanged[i][:len(want):len(want)], "all-to-all-v, n=%d rank %d", n, i)
		}
		// Bytes by the ring algorithms, per rank.
		st := g[0].Stats()
		assert.EqualValues(t, 1, st.Calls[comm.OpAllReduce])
		assert.EqualValues(t, 4*2*(n-1)*n*m/n, st.Bytes[comm.OpAllReduce])
		assert.EqualValues(t, 4*(n-1)*m, st.Bytes[comm.OpAllGather])
		assert.EqualValues(t, 4*(n-1)*m, st.Bytes[comm.OpReduceScatter])
		var out int
		for j := 1; j < n; j++ {
			out += cnt(0, j)
		}
		assert.EqualValues(t, 4*out, st.Bytes[comm.OpAllToAllV])
		assert.EqualValues(t, 1, st.Calls[comm.OpBarrier])
	}
}

func TestSendRecvRing(t *testing.T) {
	ctx := context.Background()
	const n, m = 4, 5
	g := group(t, n)
	got := make([][]float32, n)
	err := onRanks(g, func(r *comm.Local) error {
		b := cpu.New(1)
		i := r.Rank()
		v := make([]float32, m)
		for k := range v {
			v[k] = float32(10*i + k)
		}
		for range 3 { // reuse of the pair buffers
			if err := r.Send(ctx, upload(t, b, v), (i+1)%n); err != nil {
				return err
			}
			x, _ := b.Alloc(compute.F32, m)
			if err := r.Recv(ctx, x, (i+n-1)%n); err != nil {
				return err
			}
			got[i] = read(t, b, x)
		}
		return nil
	})
	require.NoError(t, err)
	for i := range n {
		from := (i + n - 1) % n
		for k := range m {
			assert.Equal(t, float32(10*from+k), got[i][k])
		}
	}
	assert.EqualValues(t, 3*4*m, g[1].Stats().Bytes[comm.OpSend])
}

// A rank whose context ends inside a collective aborts the group; the
// other ranks' calls fail instead of waiting forever for the rank that
// never came.
func TestCancelAborts(t *testing.T) {
	g := group(t, 3)
	b := cpu.New(1)
	ctx, cancel := context.WithCancel(context.Background())
	errs := make([]error, 3)
	done := make(chan struct{})
	go func() {
		errs[2] = g[2].AllReduce(context.Background(), upload(t, b, []float32{1}))
		close(done)
	}()
	go func() {
		time.Sleep(10 * time.Millisecond)
		cancel()
	}()
	errs[1] = g[1].AllReduce(ctx, upload(t, b, []float32{1}))
	<-done
	require.ErrorIs(t, errs[1], context.Canceled)
	require.ErrorIs(t, errs[2], comm.ErrAborted)
	require.ErrorIs(t, errs[2], context.Canceled)
	// Later calls fail at once.
	require.ErrorIs(t, g[0].Barrier(context.Background()), comm.ErrAborted)
}

func TestMismatch(t *testing.T) {
	ctx := context.Background()
	b := cpu.New(1)
	t.Run("op", func(t *testing.T) {
		g := group(t, 2)
		errs := make([]error, 2)
		_ = onRanks(g, func(r *comm.Local) error {
			if r.Rank() == 0 {
				errs[0] = r.Barrier(ctx)
			} else {
				errs[1] = r.AllReduce(ctx, upload(t, b, []float32{1, 2}))
			}
			return nil
		})
		for _, err := range errs {
			require.ErrorIs(t, err, comm.ErrMismatch)
		}
	})
	t.Run("size", func(t *testing.T) {
		g := group(t, 2)
		errs := make([]error, 2)
		_ = onRanks(g, func(r *comm.Local) error {
			errs[r.Rank()] = r.AllReduce(ctx, upload(t, b, make([]float32, 2+r.Rank())))
			return nil
		})
		for _, err := range errs {
			require.ErrorIs(t, err, comm.ErrMismatch)
		}
	})
	t.Run("counts", func(t *testing.T) {
		g := group(t, 2)
		errs := make([]error, 2)
		_ = onRanks(g, func(r *comm.Local) error {
			x, _ := b.Alloc(compute.F32, 4)
			errs[r.Rank()] = r.AllToAllV(ctx, x, []int{1, 1}, upload(t, b, []float32{1, 2, 3}), []int{1, 1 + r.Rank()})
			return nil
		})
		for _, err := range errs {
			require.ErrorIs(t, err, comm.ErrMismatch)
		}
	})
	t.Run("dtype", func(t *testing.T) {
		g := group(t, 1)
		x, _ := b.Alloc(compute.I32, 2)
		require.ErrorIs(t, g[0].AllReduce(ctx, x), compute.ErrUnsupported)
	})
	t.Run("no ranks", func(t *testing.T) {
		_, err := comm.NewLocal(nil)
		require.Error(t, err)
	})
}

// Steady collectives allocate nothing once the buffers have grown.
func TestAllReduceAllocations(t *testing.T) {
	ctx := context.Background()
	g := group(t, 2)
	b := cpu.New(1)
	xs := []compute.Tensor{upload(t, b, make([]float32, 64)), upload(t, b, make([]float32, 64))}
	start, stop := make(chan struct{}), make(chan struct{})
	go func() {
		for {
			select {
			case <-start:
				_ = g[1].AllReduce(ctx, xs[1])
				stop <- struct{}{}
			case <-ctx.Done():
				return
			}
		}
	}()
	run := func() {
		start <- struct{}{}
		_ = g[0].AllReduce(ctx, xs[0])
		<-stop
	}
	run()
	allocs := testing.AllocsPerRun(50, run)
	assert.Zero(t, allocs)
}
