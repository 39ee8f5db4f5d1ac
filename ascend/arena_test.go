package ascend

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type testFence struct{ waited *int }

func (f testFence) wait() error { *f.waited++; return nil }

func TestArenaReuse(t *testing.T) {
	a := newArena(4 * arenaAlign)
	s1, s2 := "s1", "s2"
	x, err := a.alloc(100, s1)
	require.NoError(t, err)
	y, err := a.alloc(arenaAlign+1, s1) // two spans
	require.NoError(t, err)
	assert.Equal(t, 0, x%arenaAlign)
	assert.Equal(t, arenaAlign, y)
	waited := 0
	a.free(x, 100, s1, testFence{&waited})

	// The same stream reuses the freed span at once, without a wait.
	z, err := a.alloc(arenaAlign, s1)
	require.NoError(t, err)
	assert.Equal(t, x, z)
	assert.Equal(t, 0, waited)
	a.free(z, arenaAlign, s1, testFence{&waited})

	// Another stream takes the idle tail first, then must wait.
	w, err := a.alloc(arenaAlign, s2)
	require.NoError(t, err)
	assert.Equal(t, 3*arenaAlign, w)
	assert.Equal(t, 0, waited)
	v, err := a.alloc(arenaAlign, s2)
	require.NoError(t, err)
	assert.Equal(t, x, v)
	assert.Equal(t, 1, waited)

	_, err = a.alloc(arenaAlign, s2)
	require.ErrorIs(t, err, ErrOutOfMemory)
	assert.Contains(t, err.Error(), "in use")
	_, err = a.alloc(0, s1)
	require.ErrorIs(t, err, ErrInvalidArgument)
}

// Random allocations and frees keep the spans disjoint, sorted and
// covering exactly the free bytes, and everything coalesces back.
func TestArenaInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	a := newArena(64 * arenaAlign)
	type live struct{ off, n int }
	var lives []live
	streams := []any{nil, "a", "b"}
	waited := 0
	for range 5000 {
		if len(lives) > 0 && rng.IntN(2) == 0 {
			i := rng.IntN(len(lives))
			l := lives[i]
			lives = append(lives[:i], lives[i+1:]...)
			a.free(l.off, l.n, streams[rng.IntN(3)], testFence{&waited})
		} else {
			n := 1 + rng.IntN(6*arenaAlign)
			off, err := a.alloc(n, streams[rng.IntN(3)])
			if err != nil {
				require.ErrorIs(t, err, ErrOutOfMemory)
				continue
			}
			for _, l := range lives {
				require.True(t, off+n <= l.off || l.off+l.n <= off, "overlap")
			}
			lives = append(lives, live{off, n})
		}
		free := 0
		for i, s := range a.spans {
			require.Positive(t, s.n)
			if i > 0 {
				require.LessOrEqual(t, a.spans[i-1].off+a.spans[i-1].n, s.off)
			}
			free += s.n
		}
		require.Equal(t, a.size, free+a.used)
	}
	for _, l := range lives {
		a.free(l.off, l.n, nil, nil)
	}
	_, err := a.alloc(a.size, nil) // waits for every fence, coalesces to one span
	require.NoError(t, err)
	assert.Positive(t, waited)
}
