package k3

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClosedModel: every operation on a closed model fails at once with
// ErrClosed (before the fix they spun forever in the closed worker pool).
func TestClosedModel(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, tinyDir)
	require.NoError(t, err)
	s, err := m.NewSession()
	require.NoError(t, err)
	_, err = s.Forward(ctx, []int32{1, 2, 3}, nil)
	require.NoError(t, err)
	bt, err := m.NewBatch(2)
	require.NoError(t, err)

	require.NoError(t, m.Close())
	require.NoError(t, m.Close(), "Close is idempotent")

	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := m.NewSession()
		assert.ErrorIs(t, err, ErrClosed, "NewSession")
		_, err = s.Forward(ctx, []int32{4}, nil)
		assert.ErrorIs(t, err, ErrClosed, "Forward")
		_, err = s.Clone()
		assert.ErrorIs(t, err, ErrClosed, "Clone")
		assert.ErrorIs(t, s.Reset(), ErrClosed, "Reset")
		assert.ErrorIs(t, s.Truncate(ctx, 1), ErrClosed, "Truncate")
		_, err = m.NewBatch(2)
		assert.ErrorIs(t, err, ErrClosed, "NewBatch")
		_, err = m.NewBatcher(2)
		assert.ErrorIs(t, err, ErrClosed, "NewBatcher")
		assert.ErrorIs(t, bt.Step(ctx, []*Session{s}, []int32{5}), ErrClosed, "Batch.Step")
		for _, err := range s.Generate(ctx, "x") {
			assert.ErrorIs(t, err, ErrClosed, "Session.Generate")
		}
		for _, err := range m.Generate(ctx, "x") {
			assert.ErrorIs(t, err, ErrClosed, "Model.Generate")
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("operations on a closed model did not return")
	}
}

// TestCloseWhileGenerating: goroutines generating when Close is called end
// with ErrClosed, and Close returns only after they stopped using the
// backend.
func TestCloseWhileGenerating(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, tinyDir)
	require.NoError(t, err)
	const n = 4
	var started, wg sync.WaitGroup
	started.Add(n)
	errs := make([]error, n)
	counts := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := m.NewSession()
			if err != nil {
				errs[i] = err
				started.Done()
				return
			}
			first := true
			for _, err := range s.Generate(ctx, "abc", WithMaxTokens(1<<20), WithoutDefaultStops()) {
				if first {
					started.Done()
					first = false
				}
				if err != nil {
					errs[i] = err
					return
				}
				counts[i]++
			}
		}()
	}
	// A Batcher serving at the same time returns ErrClosed too.
	br, err := m.NewBatcher(2)
	require.NoError(t, err)
	runErr := make(chan error, 1)
	go func() { runErr <- br.Run(ctx) }()

	started.Wait()
	require.NoError(t, m.Close())
	wg.Wait()
	for i := range n {
		assert.ErrorIs(t, errs[i], ErrClosed, "generation %d after %d tokens", i, counts[i])
	}
	select {
	case err := <-runErr:
		assert.ErrorIs(t, err, ErrClosed)
	case <-time.After(10 * time.Second):
		t.Fatal("Batcher.Run did not return after Close")
	}
	for _, err := range br.Generate(ctx, nil, "x") {
		assert.Error(t, err)
	}
}

func TestTruncateOutOfRange(t *testing.T) {
	m := load(t)
	s, err := m.NewSession()
	require.NoError(t, err)
	_, err = s.Forward(context.Background(), []int32{5, 6, 7}, nil)
	require.NoError(t, err)
	for _, n := range []int{-1, 4} {
		err := s.Truncate(context.Background(), n)
		assert.ErrorIs(t, err, ErrOutOfRange, "Truncate(%d)", n)
		assert.ErrorContains(t, err, "out of range")
	}
	assert.Equal(t, 3, s.Len(), "a rejected Truncate changes nothing")
}
