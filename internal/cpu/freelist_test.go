package cpu

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFreeList: an object put back is the next one taken, one whose
// buffers outgrew maxScratchBytes (or the list's own limit) is dropped,
// and at most maxFree are kept.
func TestFreeList(t *testing.T) {
	var l freeList[[]float32]
	a := l.get()
	*a = make([]float32, 16)
	l.put(a, capBytes(*a))
	require.Same(t, a, l.get(), "a returned object is reused")
	big := l.get()
	*big = make([]float32, maxScratchBytes/4+1)
	l.put(big, capBytes(*big))
	require.NotSame(t, big, l.get(), "an object past maxScratchBytes is dropped")
	for range maxFree + 10 {
		l.put(new([]float32), 0)
	}
	require.Len(t, l.free, maxFree)
	allocs := testing.AllocsPerRun(100, func() { l.put(l.get(), 0) })
	require.Zero(t, allocs)

	// A list with its own limit keeps objects up to it.
	wide := freeList[[]float32]{limit: 2 * maxScratchBytes}
	big = wide.get()
	*big = make([]float32, maxScratchBytes/4+1)
	wide.put(big, capBytes(*big))
	require.Same(t, big, wide.get(), "an object within the list's limit is kept")
	*big = make([]float32, 2*maxScratchBytes/4+1)
	wide.put(big, capBytes(*big))
	require.NotSame(t, big, wide.get(), "an object past the list's limit is dropped")
	require.Equal(t, indexerScratchBytes, indexerScratches.limit)
	require.GreaterOrEqual(t, indexerScratchBytes, 2*4*indexerWave, "the indexer keeps a whole wave's scratch")
}
