package modelbench

import (
	"context"
	"fmt"
	"time"

	"k3/k3"
)

// Prefiller times whole prefills of one checkpoint on one backend, so that
// k3's prefill can be set beside a peer's in alternating rounds
// (tools/llamacpp/rounds): a shared host's drift then hits both alike.
type Prefiller struct {
	Backend string
	// FLOPsPerToken is the products' arithmetic a token: two for each
	// weight a decode step multiplies, as k3 bench model counts its
	// prefill's GFLOP/s (the experts a token routes to, not the others).
	FLOPsPerToken float64
	m             *k3.Model
	prompt        []int32
}

// WritePreset writes the named preset's random-weight checkpoint (bf16)
// into a new temporary directory, which the caller removes.
func WritePreset(preset string, log func(string)) (string, error) {
	return writePreset(preset, log)
}

// NewPrefiller loads the checkpoint in dir on the named backend ("go" or
// "go-fastbf16") and prefills a prompt of tokens tokens once: the first
// prefill faults the weights in and sizes the scratch, and is not timed.
func NewPrefiller(ctx context.Context, dir, backend string, tokens int) (*Prefiller, error) {
	if tokens < 1 {
		return nil, fmt.Errorf("modelbench: prefill of %d tokens: want at least 1", tokens)
	}
	opts, err := backendOptions(backend)
	if err != nil {
		return nil, err
	}
	m, err := k3.Load(ctx, dir, opts...)
	if err != nil {
		return nil, err
	}
	p := &Prefiller{Backend: backendName(backend), m: m, prompt: make([]int32, tokens)}
	for i := range p.prompt {
		p.prompt[i] = int32(3 + (i*31)%256) // k3 bench model's prompt
	}
	s, err := m.NewSession()
	if err == nil {
		if _, err = s.Forward(ctx, p.prompt); err == nil {
			state := stateKDABytes(s)
			p.FLOPsPerToken = stepBytes(m.Config, m.WeightBytes(), state, 1) - 2*float64(state)
		}
		s.Close()
	}
	if err != nil {
		m.Close()
		return nil, err
	}
	return p, nil
}

// Best returns the tokens a second of the fastest of runs prefills, each
// on a new session closed after it.
func (p *Prefiller) Best(ctx context.Context, runs int) (float64, error) {
	var best time.Duration
	for i := range max(runs, 1) {
		s, err := p.m.NewSession()
		if err != nil {
			return 0, err
		}
		start := time.Now()
		_, err = s.Forward(ctx, p.prompt)
		took := time.Since(start)
		s.Close()
		if err != nil {
			return 0, err
		}
		if i == 0 || took < best {
			best = took
		}
	}
	return float64(len(p.prompt)) / best.Seconds(), nil
}

// Close releases the model.
func (p *Prefiller) Close() error { return p.m.Close() }
