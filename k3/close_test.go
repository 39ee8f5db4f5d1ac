package k3

import (
	"context"
	"math"
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
	_, err = s.Forward(ctx, []int32{1, 2, 3})
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
		_, err = s.Forward(ctx, []int32{4})
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
	require.NoError(t, br.Start(ctx))
	go func() { runErr <- br.Wait() }()

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
	_, err = s.Forward(context.Background(), []int32{5, 6, 7})
	require.NoError(t, err)
	for _, n := range []int{-1, 4} {
		err := s.Truncate(context.Background(), n)
		assert.ErrorIs(t, err, ErrOutOfRange, "Truncate(%d)", n)
		assert.ErrorContains(t, err, "out of range")
	}
	assert.Equal(t, 3, s.Len(), "a rejected Truncate changes nothing")
}

func TestBadSamplingAndBatchInput(t *testing.T) {
	m := load(t)
	ctx := context.Background()
	s, err := m.NewSession()
	require.NoError(t, err)
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for name, opt := range map[string]GenerateOption{
		"presence NaN": WithPresencePenalty(nan), "presence Inf": WithPresencePenalty(inf),
		"frequency NaN": WithFrequencyPenalty(nan), "frequency -Inf": WithFrequencyPenalty(-inf),
		"bias NaN": WithLogitBias(map[int32]float32{5: nan}), "bias -Inf": WithLogitBias(map[int32]float32{5: -inf}),
	} {
		for _, err := range s.Generate(ctx, "x", opt) {
			assert.ErrorIs(t, err, ErrInvalidOption, name)
			break
		}
	}
	// Every token seen, so the presence penalty and the bias together push
	// every logit past float32's range: an error, not a silent id.
	all := map[int32]float32{}
	var every []int32
	for id := range int32(m.Config.VocabSize) {
		all[id] = -math.MaxFloat32
		every = append(every, id)
	}
	for tok, err := range s.GenerateTokens(ctx, every, WithLogitBias(all), WithPresencePenalty(math.MaxFloat32)) {
		if err != nil {
			assert.ErrorIs(t, err, ErrInvalidOption)
			assert.ErrorContains(t, err, "no token with a finite logit")
			break
		}
		t.Errorf("token %d sampled with every token masked", tok.ID)
	}

	bt, err := m.NewBatch(2)
	require.NoError(t, err)
	s2, err := m.NewSession()
	require.NoError(t, err)
	assert.ErrorContains(t, bt.Step(ctx, []*Session{s, nil}, []int32{1, 2}), "session 1 is nil")
	assert.ErrorContains(t, bt.Step(ctx, []*Session{s, s2, s2}, []int32{1, 2, 3}), "limit of 2")
	assert.ErrorContains(t, bt.Step(ctx, []*Session{s}, []int32{1, 2}), "1 sessions but 2 tokens")
	assert.Error(t, bt.Step(ctx, nil, nil))
}

func TestBatcherBadSession(t *testing.T) {
	m := load(t)
	other := load(t)
	br, err := m.NewBatcher(2)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, br.Start(ctx))
	for _, err := range br.Generate(ctx, nil, "x") {
		assert.ErrorContains(t, err, "nil session")
	}
	s, err := other.NewSession()
	require.NoError(t, err)
	for _, err := range br.Generate(ctx, s, "x") {
		assert.ErrorContains(t, err, "another model")
	}
	// The batcher still serves.
	good, err := m.NewSession()
	require.NoError(t, err)
	assert.Len(t, collect(t, br.Generate(ctx, good, "x", WithMaxTokens(3), WithoutDefaultStops())), 3)
}

func TestOpenBackend(t *testing.T) {
	b, err := OpenBackend("go")
	require.NoError(t, err)
	defer b.Close()
	m, err := Load(context.Background(), tinyDir, WithComputeBackend(b))
	require.NoError(t, err)
	require.NoError(t, m.Close())
	assert.Equal(t, "go", b.Name(), "the model does not close a backend it was given")
	_, err = OpenBackend("nope")
	assert.ErrorContains(t, err, "nope")
}
