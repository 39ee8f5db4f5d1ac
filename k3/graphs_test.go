package k3

import (
	"container/list"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
)

func TestGraphBucket(t *testing.T) {
	for _, c := range []struct{ rows, room, want int }{
		{1, 8, 1}, {2, 8, 2}, {3, 8, 4}, {4, 4, 4}, {3, 3, 3}, {5, 8, 8}, {5, 7, 5}, {9, 16, 16}, {16, 100, 16},
	} {
		if got := graphBucket(c.rows, c.room); got != c.want {
			t.Errorf("graphBucket(%d, %d) = %d, want %d", c.rows, c.room, got, c.want)
		}
	}
}

// fakeCapturer records captures without a device: each graph keeps 100
// bytes and counts its replays and closes.
type fakeCapturer struct {
	fail             bool
	replays, closed  int
	captures, called int
}

type fakeGraph struct{ c *fakeCapturer }

func (g fakeGraph) Replay() error { g.c.replays++; return nil }
func (g fakeGraph) Close() error  { g.c.closed++; return nil }
func (g fakeGraph) Bytes() int64  { return 100 }

func (c *fakeCapturer) Capture(fn func() error) (compute.Graph, error) {
	c.captures++
	if err := fn(); err != nil {
		return nil, err
	}
	if c.fail {
		return nil, errors.New("reads the device")
	}
	return fakeGraph{c}, nil
}

// The cache runs a key's first call eagerly, captures and replays its
// second, replays the rest; a piece whose capture fails runs eagerly from
// then on; signatures that differ in a tensor or an integer are other
// keys; at most graphCapacity graphs are kept, their bytes counted.
func TestGraphsCache(t *testing.T) {
	c := &fakeCapturer{}
	g := &graphs{c: c, byKey: map[graphKey]*list.Element{}}
	buf := make([]float32, 64)
	x := compute.NewTensor(&buf, 0, compute.F32, 4, 16)
	call := func(part graphPart, l int, x compute.Tensor, ints ...int32) {
		t.Helper()
		g.begin()
		g.dep(x)
		g.num(ints...)
		require.NoError(t, g.run(part, l, x.Dim(0), func() error { c.called++; return nil }))
	}
	for range 4 {
		call(graphKDA, 3, x, 0, 4)
	}
	require.Equal(t, 2, c.called, "eager, then captured (fn runs once inside the capture)")
	require.Equal(t, 1, c.captures)
	require.Equal(t, 3, c.replays, "the capture replays at once")
	call(graphKDA, 3, x, 0, 3, 4)      // other row offsets
	call(graphKDA, 3, x.Rows(1, 4))    // another view
	call(graphKDA, 4, x, 0, 4)         // another layer
	call(graphFeedForward, 3, x, 0, 4) // another part
	require.Equal(t, 6, c.called)
	require.Equal(t, 1, c.captures)
	st := g.stats
	require.Equal(t, GraphStats{Captured: 1, Replayed: 2, Eager: 5, MixersCaptured: 1, MixersReplayed: 2, MixersEager: 4, Bytes: 100}, st)

	c.fail = true
	for range 3 {
		call(graphAttnRes, 0, x)
	}
	require.Equal(t, 2, c.captures, "a failed capture is not tried again")
	require.Equal(t, 10, c.called, "eager, recorded by the failed capture and run, eager")

	c.fail = false
	for l := range graphCapacity + 1 {
		call(graphFeedForward, 100+l, x)
		call(graphFeedForward, 100+l, x)
	}
	require.Equal(t, graphCapacity, g.lru.Len())
	require.Equal(t, int64(graphCapacity)*100, g.stats.Bytes, "the closed graphs' bytes are given back")
	require.Equal(t, 2, c.closed, "the least recently used entries went first: the KDA graph, then the loop's first")
	g.close()
	require.Equal(t, graphCapacity+2, c.closed)
	require.Zero(t, g.stats.Bytes)
}
