package cpu

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/kernel"
)

// TestReadsHost checks compute.HostReader: tensors made over the caller's
// bytes count as reading them while they are reachable, whatever part of
// the bytes a query names, and stop counting once collected; copies and
// weights laid out anew do not read them.
func TestReadsHost(t *testing.T) {
	b := New(1)
	defer b.Close()
	const n = 64 // tensors of 1,024 bytes side by side in one buffer
	data := make([]byte, n*1024)
	ts := make([]compute.Tensor, n)
	for i := range ts {
		var err error
		ts[i], err = b.FromHost(compute.BF16, compute.BF16, data[i*1024:(i+1)*1024], 512)
		require.NoError(t, err)
	}
	span := func(i int) []byte { return data[i*1024 : (i+1)*1024] }
	for i := range n {
		require.True(t, b.ReadsHost(span(i)), "tensor %d alive", i)
	}
	require.True(t, b.ReadsHost(data[1023:1025]), "a query across two tensors")
	require.False(t, b.ReadsHost(make([]byte, 1024)), "other bytes")
	require.False(t, b.ReadsHost(nil))

	// Drop every other tensor: the odd ones stay alive.
	for i := 0; i < n; i += 2 {
		ts[i] = compute.Tensor{}
	}
	runtime.GC()
	for i := range n {
		require.Equal(t, i%2 == 1, b.ReadsHost(span(i)), "tensor %d after a collection", i)
	}
	require.True(t, b.ReadsHost(data[1000:1030]), "a query reaching into a live tensor")
	require.False(t, b.ReadsHost(data[2048:3072]), "the span of a collected tensor")
	// A later tensor over a collected one's bytes counts again.
	again, err := b.FromHost(compute.BF16, compute.BF16, span(2), 512)
	require.NoError(t, err)
	require.True(t, b.ReadsHost(span(2)))
	runtime.KeepAlive(ts)
	runtime.KeepAlive(again)

	// Overlapping tensors: a query inside a long one, past a later-starting
	// short one that ends before it.
	big := make([]byte, 8192)
	long, err := b.FromHost(compute.BF16, compute.BF16, big, 4096)
	require.NoError(t, err)
	short, err := b.FromHost(compute.BF16, compute.BF16, big[4096:5120], 512)
	require.NoError(t, err)
	require.True(t, b.ReadsHost(big[6000:6010]))
	runtime.KeepAlive(long)
	runtime.GC()
	require.False(t, b.ReadsHost(big[6000:6010]), "after the long tensor is collected")
	require.True(t, b.ReadsHost(big[5000:6000]), "the short one is still alive")
	runtime.KeepAlive(short)

	// Records of collected tensors do not pile up while tensors keep
	// being made.
	for i := range 5000 {
		_, err := b.FromHost(compute.BF16, compute.BF16, big[:64], 32)
		require.NoError(t, err)
		if i%500 == 0 {
			runtime.GC()
		}
	}
	require.Less(t, len(b.host.refs), 3000, "records kept")

	// A converted tensor is a copy.
	other := make([]byte, 2048)
	conv, err := b.FromHost(compute.F32, compute.BF16, other, 1024)
	require.NoError(t, err)
	require.False(t, b.ReadsHost(other), "a bf16→f32 conversion copies")
	runtime.KeepAlive(conv)

	// A weight PrepareMatMul packs no longer reads its stored bytes once
	// the stored-layout tensor is gone; one it keeps still does.
	wide, narrow := make([]byte, 2*kernel.KMajorMinN*64), make([]byte, 2*64*64)
	ww, err := b.FromHost(compute.BF16, compute.BF16, wide, kernel.KMajorMinN, 64)
	require.NoError(t, err)
	wn, err := b.FromHost(compute.BF16, compute.BF16, narrow, 64, 64)
	require.NoError(t, err)
	pw, err := b.PrepareMatMul(ww)
	require.NoError(t, err)
	pn, err := b.PrepareMatMul(wn)
	require.NoError(t, err)
	packed := pw.Mem != ww.Mem
	require.Equal(t, kernel.KMajorFast() || b.packing() == amxTiles, packed, "the wide weight is packed where the CPU runs packed products")
	require.Equal(t, wn.Mem, pn.Mem, "a narrow weight keeps its stored layout")
	ww, wn = compute.Tensor{}, compute.Tensor{}
	runtime.GC()
	require.Equal(t, !packed, b.ReadsHost(wide), "the wide weight's stored bytes")
	require.True(t, b.ReadsHost(narrow), "the narrow weight's stored bytes")
	runtime.KeepAlive(pw)
	runtime.KeepAlive(pn)
}
