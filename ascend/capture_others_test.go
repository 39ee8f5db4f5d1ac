package ascend

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"k3/compute"
)

// Work another goroutine issues while a capture runs waits for the
// capture to end and runs eagerly then: the graph does not hold it, so a
// replay leaves the other goroutine's tensor alone.
func TestCaptureHoldsOtherGoroutines(t *testing.T) {
	eachDriver(t, 8<<20, func(t *testing.T, b *Backend) {
		a, c, x, _ := fours(t, b)
		require.NoError(t, b.Fill(x, 0))
		started, filled := make(chan struct{}), make(chan error, 1)
		g, err := b.Capture(func() error {
			go func() {
				close(started)
				filled <- b.Fill(x, 7)
			}()
			<-started
			time.Sleep(50 * time.Millisecond) // room for the Fill to come in
			return b.Binary(compute.Add, c, a, a)
		})
		require.NoError(t, err)
		defer g.Close()
		require.NoError(t, <-filled)
		got := make([]float32, 4)
		require.NoError(t, b.Read(got, x))
		require.Equal(t, []float32{7, 7, 7, 7}, got, "the other goroutine's Fill ran after the capture")
		require.NoError(t, b.Fill(x, 0))
		require.NoError(t, g.Replay())
		require.NoError(t, b.Read(got, x))
		require.Equal(t, []float32{0, 0, 0, 0}, got, "the replay does not hold the other goroutine's Fill")
	})
}
