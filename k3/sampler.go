package k3

import (
	"errors"
	"fmt"

	"k3/internal/sample"
)

// Sampler draws tokens with the sampling options of Generate (temperature,
// top-k, top-p, min-p, penalties, logit bias, seed), for programs that
// drive Batch or Session.Forward themselves. One Sampler serves one
// sequence: the penalties count the tokens it has seen. It is not safe for
// concurrent use.
type Sampler struct {
	s     *sample.Sampler
	vocab int
}

// NewSampler returns a sampler for the model's vocabulary. Options that
// are not about sampling (max tokens, stops) are accepted and ignored;
// WithJSONObject, WithJSONSchema and WithToolCalls, which follow a
// generation's text, are refused.
func (m *Model) NewSampler(opts ...GenerateOption) (*Sampler, error) {
	o, err := m.genOptions(opts)
	if err != nil {
		return nil, err
	}
	if o.json || o.schema != nil || o.toolNames != nil {
		return nil, fmt.Errorf("%w: WithJSONObject, WithJSONSchema and WithToolCalls follow a generation's text; use Session.Generate", ErrInvalidOption)
	}
	s, err := sample.New(o.Params, m.Config.VocabSize)
	if err != nil {
		return nil, err
	}
	return &Sampler{s: s, vocab: m.Config.VocabSize}, nil
}

// Observe records tokens (a prompt, or tokens chosen elsewhere) for the
// repetition, presence and frequency penalties.
func (sm *Sampler) Observe(ids ...int32) { sm.s.Observe(ids...) }

// Reset forgets the observed tokens.
func (sm *Sampler) Reset() { sm.s.Reset() }

// Sample draws a token from logits ([vocab]; left unchanged) and observes it.
func (sm *Sampler) Sample(logits []float32) (int32, error) {
	if len(logits) != sm.vocab {
		return 0, errors.New("k3: sampler: logits are not one row of the vocabulary")
	}
	return sm.s.Sample(logits)
}

// Next draws a token from the session's next-token logits (those left by
// its last Forward or Batch.Step) without copying them.
func (sm *Sampler) Next(s *Session) (int32, error) {
	if s.last == nil {
		return 0, ErrEmptyPrompt
	}
	return sm.Sample(s.last)
}
