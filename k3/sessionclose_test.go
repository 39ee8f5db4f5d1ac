package k3

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// countingBackend is the Go backend with a ledger of the bytes that Alloc
// handed out and Free has not taken back.
type countingBackend struct {
	compute.Backend
	mu   sync.Mutex
	live map[any]int64
}

func (c *countingBackend) Alloc(dt compute.DType, dims ...int) (compute.Tensor, error) {
	t, err := c.Backend.Alloc(dt, dims...)
	if err == nil {
		c.mu.Lock()
		c.live[t.Mem] = int64(t.Len()) * int64(dt.Size())
		c.mu.Unlock()
	}
	return t, err
}

func (c *countingBackend) Free(t compute.Tensor) {
	c.mu.Lock()
	delete(c.live, t.Mem)
	c.mu.Unlock()
	c.Backend.Free(t)
}

func (c *countingBackend) bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, b := range c.live {
		n += b
	}
	return n
}

// TestSessionClose: 1,000 sessions opened, run, forked and closed give back
// every byte of state they took from the backend, with and without replay
// logs; a closed session refuses work.
func TestSessionClose(t *testing.T) {
	ctx := context.Background()
	for _, depth := range []int{0, ExactTokens} {
		be := &countingBackend{Backend: cpu.New(2), live: map[any]int64{}}
		m, err := Load(ctx, tinyDir, WithComputeBackend(be), WithRollback(depth))
		require.NoError(t, err)
		warm, err := m.NewSession() // the model's own scratch comes into being here
		require.NoError(t, err)
		_, err = warm.Forward(ctx, make([]int32, 300))
		require.NoError(t, err)
		require.NoError(t, warm.Close())
		// Closed sessions' KDA states kept for new ones (up to
		// maxFreeStates sets) are the model's, not leaks.
		owned := func() int64 { return be.bytes() - m.MemoryUsage().FreeStates }
		base := owned()
		for i := range 1000 {
			s, err := m.NewSession()
			require.NoError(t, err)
			n := 1 + i%3
			if i%50 == 0 {
				n = 70 // past the caches' first capacity
			}
			_, err = s.Forward(ctx, make([]int32, n))
			require.NoError(t, err)
			if i%10 == 0 {
				c, err := s.Clone()
				require.NoError(t, err)
				require.NoError(t, c.Close())
			}
			require.NoError(t, s.Close())
			require.NoError(t, s.Close(), "Close is idempotent")
		}
		assert.Equal(t, base, owned(), "depth %d: backend bytes after 1,000 sessions", depth)
		assert.LessOrEqual(t, m.MemoryUsage().FreeStates, int64(maxFreeStates)*m.free.bytes)

		s, err := m.NewSession()
		require.NoError(t, err)
		require.NoError(t, s.Close())
		_, err = s.Forward(ctx, []int32{1})
		assert.ErrorIs(t, err, ErrSessionClosed)
		assert.ErrorIs(t, s.Reset(), ErrSessionClosed)
		assert.ErrorIs(t, s.Truncate(ctx, 0), ErrSessionClosed)
		_, err = s.Clone()
		assert.ErrorIs(t, err, ErrSessionClosed)
		for _, err := range s.Generate(ctx, "x") {
			assert.ErrorIs(t, err, ErrSessionClosed)
		}
		bt, err := m.NewBatch(1)
		require.NoError(t, err)
		assert.ErrorIs(t, bt.Step(ctx, []*Session{s}, []int32{1}), ErrSessionClosed)
		m.Close()
		be.Backend.Close()
	}
}
