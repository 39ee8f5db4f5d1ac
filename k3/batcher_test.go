package k3

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBatcherNotRunning: Generate fails at once before the batcher starts
// and after it stops; it starts once.
func TestBatcherNotRunning(t *testing.T) {
	m := load(t)
	br, err := m.NewBatcher(2)
	require.NoError(t, err)
	s, err := m.NewSession()
	require.NoError(t, err)
	// No deadline: a Generate that waited for a loop would hang the test.
	for _, err := range br.Generate(context.Background(), s, "x") {
		require.ErrorIs(t, err, ErrBatcherNotRunning)
	}
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, br.Start(ctx))
	assert.Error(t, br.Start(ctx), "a second Start")
	assert.Error(t, br.Run(ctx), "Run after Start")
	assert.Len(t, collect(t, br.Generate(ctx, s, "x", WithMaxTokens(2), WithoutDefaultStops())), 2)
	cancel()
	assert.ErrorIs(t, br.Wait(), context.Canceled)
	for _, err := range br.Generate(context.Background(), s, "x") {
		require.ErrorIs(t, err, ErrBatcherClosed)
	}
}

// TestBatcherSlowConsumer: a consumer that stops reading (without
// abandoning its stream) holds up only its own sequence. The other
// generation runs to its end meanwhile; when the first consumer reads
// again it gets every token, and both equal their generations alone.
func TestBatcherSlowConsumer(t *testing.T) {
	m := load(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	br, err := m.NewBatcher(2)
	require.NoError(t, err)
	require.NoError(t, br.Start(ctx))
	const slowN, fastN = 3 * streamBuffer, 2 * streamBuffer
	wantSlow := collect(t, m.Generate(ctx, "slow", WithMaxTokens(slowN), WithoutDefaultStops()))
	wantFast := collect(t, m.Generate(ctx, "fast", WithMaxTokens(fastN), WithoutDefaultStops()))

	hold := make(chan struct{})
	first := make(chan struct{})
	slowDone := make(chan []int32, 1)
	go func() {
		s, _ := m.NewSession()
		var got []int32
		for tok, err := range br.Generate(ctx, s, "slow", WithMaxTokens(slowN), WithoutDefaultStops()) {
			if err != nil {
				break
			}
			got = append(got, tok.ID)
			if len(got) == 1 {
				close(first)
				<-hold // stop reading, keep the stream
			}
		}
		slowDone <- got
	}()
	<-first
	s, err := m.NewSession()
	require.NoError(t, err)
	fastDone := make(chan []int32, 1)
	go func() {
		fastDone <- collect(t, br.Generate(ctx, s, "fast", WithMaxTokens(fastN), WithoutDefaultStops()))
	}()
	select {
	case got := <-fastDone:
		assert.Equal(t, wantFast, got, "the other generation")
	case <-time.After(60 * time.Second):
		t.Fatal("a stalled consumer blocked the other generation")
	}
	close(hold)
	assert.Equal(t, wantSlow, <-slowDone, "the paused generation, once read again")

	// Abandoning a paused stream frees its sequence: the batcher goes on.
	before := runtime.NumGoroutine()
	func() {
		s, _ := m.NewSession()
		for range br.Generate(ctx, s, "gone", WithMaxTokens(slowN), WithoutDefaultStops()) {
			time.Sleep(20 * time.Millisecond) // let the stream fill
			break
		}
	}()
	s2, _ := m.NewSession()
	assert.Len(t, collect(t, br.Generate(ctx, s2, "x", WithMaxTokens(3), WithoutDefaultStops())), 3)
	// Polled here rather than with assert.Eventually, whose checks run in
	// goroutines of their own.
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines left, %d before an abandoned stream:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}
