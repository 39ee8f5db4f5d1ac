package ascend

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/compute"
)

// Side streams: Fork orders a side's work after the backend's, Join the
// backend's after the side's; on the host driver and the fake, where
// queued work runs only when waited for, reading on the side first would
// see the inputs unwritten without the Fork, and reading on the backend
// would miss the side's results without the Join.
func TestSideStreams(t *testing.T) {
	eachDriver(t, 8<<20, func(t *testing.T, b *Backend) {
		_, err := b.Side(0)
		require.ErrorIs(t, err, ErrInvalidArgument)
		_, err = b.Side(maxSides + 1)
		require.ErrorIs(t, err, ErrInvalidArgument)
		side, err := b.Side(1)
		require.NoError(t, err)
		again, err := b.Side(1)
		require.NoError(t, err)
		require.Same(t, side, again, "one side stream per index")
		require.ErrorIs(t, b.Fork(b), ErrInvalidArgument, "the backend is not its own side stream")

		a, c, d, e := fours(t, b)
		require.NoError(t, b.Fill(a, 3))
		require.NoError(t, compute.Fork(b, side))
		require.NoError(t, side.Binary(compute.Mul, c, a, a)) // 9
		require.NoError(t, side.Binary(compute.Add, d, c, a)) // 12
		got := make([]float32, 4)
		require.NoError(t, side.Read(got, c), "a read on the side waits for the side only")
		assert.Equal(t, []float32{9, 9, 9, 9}, got, "the side ran after the backend's fill")

		require.NoError(t, side.Binary(compute.Mul, d, d, a)) // 36, queued after the read
		require.NoError(t, compute.Join(b, side))
		require.NoError(t, b.Binary(compute.Add, e, d, a)) // 39
		require.NoError(t, b.Read(got, e))
		assert.Equal(t, []float32{39, 39, 39, 39}, got, "the backend ran after the side")

		// Scratch freed on the side is reused safely by the backend.
		for range 3 {
			x, err := side.Alloc(compute.F32, 1000)
			require.NoError(t, err)
			require.NoError(t, side.Fill(x, 1))
			side.Free(x)
			y, err := b.Alloc(compute.F32, 1000)
			require.NoError(t, err)
			require.NoError(t, b.Fill(y, 2))
			b.Free(y)
		}
		require.NoError(t, side.Close(), "a side stream closes with its backend")
		require.NoError(t, side.Binary(compute.Add, e, e, a), "still usable")

		side2, err := b.Side(2)
		require.NoError(t, err)
		// A capture records the backend's stream: a side stream that has
		// not joined it by Fork is refused (TestCaptureSideStreams).
		_, err = b.Capture(func() error {
			if err := side.Binary(compute.Add, e, e, a); err == nil {
				return assert.AnError
			} else if !assert.ErrorIs(t, err, ErrCapturing) {
				return err
			}
			require.ErrorIs(t, side.(*Backend).Fork(side2), ErrCapturing, "Fork from a side stream")
			return b.Binary(compute.Add, e, e, a)
		})
		require.NoError(t, err)
	})
}

// The pure-Go backend has no side streams: compute.Side gives the backend
// itself and Fork and Join do nothing.
func TestSideFallsBack(t *testing.T) {
	c := hostBackend(t, 1<<20)
	var plain compute.Backend = c.host
	side, err := compute.Side(plain, 1)
	require.NoError(t, err)
	require.Equal(t, plain, side)
	require.NoError(t, compute.Fork(plain, side))
	require.NoError(t, compute.Join(plain, side))
}

// A capture takes in a side stream's work between Fork and Join (ACL's
// cross-stream capture): the replay runs the backend's and the side's
// work in order, on new inputs. A side stream used without Fork, after
// Join, or forked and never joined fails the capture.
func TestCaptureSideStreams(t *testing.T) {
	eachDriver(t, 8<<20, func(t *testing.T, b *Backend) {
		side, err := b.Side(1)
		require.NoError(t, err)
		a, c, d, e := fours(t, b)
		require.NoError(t, b.Write(a, []float32{1, 2, 3, 4}))
		g, err := b.Capture(func() error {
			if err := b.Binary(compute.Add, c, a, a); err != nil { // 2a
				return err
			}
			if err := compute.Fork(b, side); err != nil {
				return err
			}
			if err := side.Binary(compute.Mul, d, c, a); err != nil { // 2a²
				return err
			}
			if err := side.Binary(compute.Add, d, d, c); err != nil { // 2a² + 2a
				return err
			}
			if err := compute.Join(b, side); err != nil {
				return err
			}
			return b.Binary(compute.Add, e, d, a) // 2a² + 3a
		})
		require.NoError(t, err)
		defer g.Close()
		got := make([]float32, 4)
		for _, in := range [][]float32{{1, 2, 3, 4}, {-1, 0.5, 10, 2}} {
			require.NoError(t, b.Write(a, in))
			require.NoError(t, g.Replay())
			require.NoError(t, b.Read(got, e))
			for i, x := range in {
				assert.Equal(t, 2*x*x+3*x, got[i], "input %v", in)
			}
		}

		// Forked and joined twice in one capture (two layers' side work).
		g2, err := b.Capture(func() error {
			for range 2 {
				if err := compute.Fork(b, side); err != nil {
					return err
				}
				if err := side.Binary(compute.Add, d, a, a); err != nil { // 2a
					return err
				}
				if err := compute.Join(b, side); err != nil {
					return err
				}
				if err := b.Binary(compute.Add, a, d, a); err != nil { // a ← 3a
					return err
				}
			}
			return nil
		})
		require.NoError(t, err, "a side stream forked again after it returned")
		defer g2.Close()
		require.NoError(t, b.Write(a, []float32{1, 2, 3, 4}))
		require.NoError(t, g2.Replay())
		require.NoError(t, b.Read(got, a))
		assert.Equal(t, []float32{9, 18, 27, 36}, got)

		_, err = b.Capture(func() error { return side.Fill(d, 1) })
		require.ErrorIs(t, err, ErrCapturing, "a side stream that did not join")
		_, err = b.Capture(func() error {
			if err := compute.Fork(b, side); err != nil {
				return err
			}
			if err := compute.Join(b, side); err != nil {
				return err
			}
			return side.Fill(d, 1)
		})
		require.ErrorIs(t, err, ErrCapturing, "a side stream after it returned")
		_, err = b.Capture(func() error {
			if err := compute.Fork(b, side); err != nil {
				return err
			}
			return side.Fill(d, 1)
		})
		require.Error(t, err, "a side stream forked and never joined")
		// The backend and the side stream still work eagerly afterwards.
		require.NoError(t, b.Fill(a, 2))
		require.NoError(t, compute.Fork(b, side))
		require.NoError(t, side.Binary(compute.Mul, d, a, a))
		require.NoError(t, compute.Join(b, side))
		require.NoError(t, b.Read(got, d))
		assert.Equal(t, []float32{4, 4, 4, 4}, got)
	})
}

// A side stream forked and joined twice with nothing waiting in between
// (consecutive layers' shared experts): each Join waits for its own
// record of the join event, and each Fork for its own record of the fork
// event, even though the other records of the same events are queued
// around them.
func TestSideStreamsReuseEvents(t *testing.T) {
	eachDriver(t, 8<<20, func(t *testing.T, b *Backend) {
		side, err := b.Side(1)
		require.NoError(t, err)
		a, c, d, e := fours(t, b)
		require.NoError(t, b.Fill(a, 1))
		require.NoError(t, compute.Fork(b, side))
		require.NoError(t, side.Binary(compute.Mul, c, a, a)) // 1
		require.NoError(t, compute.Join(b, side))
		require.NoError(t, b.Binary(compute.Add, a, a, a)) // a = 2
		require.NoError(t, compute.Fork(b, side))
		require.NoError(t, side.Binary(compute.Mul, d, a, a)) // 4
		require.NoError(t, compute.Join(b, side))
		require.NoError(t, b.Binary(compute.Add, e, d, c)) // 5
		got := make([]float32, 4)
		require.NoError(t, b.Read(got, e))
		assert.Equal(t, []float32{5, 5, 5, 5}, got)
	})
}

// fours allocates four f32 tensors of four elements on b.
func fours(t *testing.T, b *Backend) (w, x, y, z compute.Tensor) {
	t.Helper()
	var ts [4]compute.Tensor
	for i := range ts {
		var err error
		ts[i], err = b.Alloc(compute.F32, 4)
		require.NoError(t, err)
	}
	return ts[0], ts[1], ts[2], ts[3]
}
