package ascend

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/compute"
)

// Queued small uploads go through the ring's pinned slots without a wait;
// more of them than there are slots reuse slots only after the stream ran
// the uploads that read them: on the host driver and the fake, whose
// queued work runs when waited for, a slot overwritten too early shows as
// wrong values in the tensors read at the end.
func TestPutAsync(t *testing.T) {
	eachDriver(t, 8<<20, func(t *testing.T, b *Backend) {
		const n = 3*ringSlots + 5
		var ts []compute.Tensor
		b.lock()
		for i := range n {
			x, err := b.allocTensor(compute.F32, 4)
			require.NoError(t, err)
			require.NoError(t, b.putAsync(x, []float32{float32(i), 1, 2, float32(-i)}))
			ts = append(ts, x)
		}
		big, err := b.allocTensor(compute.F32, ringSlotBytes/4+1) // past a slot: put
		require.NoError(t, err)
		require.NoError(t, b.putAsync(big, make([]float32, ringSlotBytes/4+1)))
		b.mu.Unlock()
		for i, x := range ts {
			assert.Equal(t, []float32{float32(i), 1, 2, float32(-i)}, read(t, b, x), "upload %d", i)
		}
		_, err = b.Capture(func() error {
			b.lock()
			defer b.mu.Unlock()
			return b.putAsync(ts[0], []float32{9, 9, 9, 9})
		})
		require.ErrorIs(t, err, ErrCapturing, "an upload inside a capture")
	})
}
