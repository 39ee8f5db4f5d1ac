// Package sample turns logits into tokens: penalties, logit bias,
// temperature, top-k, top-p and min-p filtering, and a seeded draw. A
// Sampler reuses its buffers, so sampling allocates nothing per token.
package sample

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"k3/internal/kernel"
)

// ErrInvalid is wrapped by errors about invalid sampling parameters.
var ErrInvalid = errors.New("invalid sampling parameter")

// Params configure a Sampler. The zero value is greedy decoding.
type Params struct {
	// Temperature 0 picks the most likely token (ties to the lowest id).
	Temperature float32
	TopK        int     // 0: no limit
	TopP        float32 // 0 or 1: no limit; else in (0, 1]
	MinP        float32 // 0: off; else in [0, 1]: drop tokens below MinP·p_max
	// RepetitionPenalty divides positive logits (multiplies negative ones)
	// of tokens already seen; 0 or 1: off.
	RepetitionPenalty float32
	// PresencePenalty is subtracted once from every seen token's logit,
	// FrequencyPenalty once per occurrence.
	PresencePenalty, FrequencyPenalty float32
	LogitBias                         map[int32]float32
	Seed                              uint64
}

// Validate reports the first invalid field.
func (p *Params) Validate(vocab int) error {
	bad := func(field string, v any, want string) error {
		return fmt.Errorf("%w: %s = %v, want %s", ErrInvalid, field, v, want)
	}
	switch {
	case p.Temperature < 0 || math.IsNaN(float64(p.Temperature)) || math.IsInf(float64(p.Temperature), 0):
		return bad("temperature", p.Temperature, ">= 0")
	case p.TopK < 0:
		return bad("top_k", p.TopK, ">= 0")
	case p.TopP < 0 || p.TopP > 1 || p.TopP != p.TopP:
		return bad("top_p", p.TopP, "in (0, 1]")
	case p.MinP < 0 || p.MinP > 1 || p.MinP != p.MinP:
		return bad("min_p", p.MinP, "in [0, 1]")
	case p.RepetitionPenalty < 0 || !finite(p.RepetitionPenalty):
		return bad("repetition_penalty", p.RepetitionPenalty, "> 0")
	case !finite(p.PresencePenalty):
		return bad("presence_penalty", p.PresencePenalty, "a finite number")
	case !finite(p.FrequencyPenalty):
		return bad("frequency_penalty", p.FrequencyPenalty, "a finite number")
	}
	for id, b := range p.LogitBias {
		if id < 0 || int(id) >= vocab {
			return bad("logit_bias token", id, fmt.Sprintf("in 0..%d", vocab-1))
		}
		if !finite(b) {
			return bad(fmt.Sprintf("logit_bias[%d]", id), b, "a finite number")
		}
	}
	return nil
}

func finite(v float32) bool { return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) }

// ErrNoToken is wrapped when penalties and biases leave no token with a
// finite logit, so there is nothing to sample from.
var ErrNoToken = fmt.Errorf("%w: penalties and logit bias leave no token with a finite logit", ErrInvalid)

// Sampler draws tokens for one sequence.
type Sampler struct {
	p      Params
	rng    *rand.Rand
	counts []int32 // occurrences of every token, for the penalties
	seen   []int32 // the tokens with a non-zero count
	buf    []float32
	idx    []int32
}

// New returns a sampler for a vocabulary of the given size.
func New(p Params, vocab int) (*Sampler, error) {
	if err := p.Validate(vocab); err != nil {
		return nil, err
	}
	return &Sampler{p: p, rng: rand.New(rand.NewPCG(p.Seed, 0x6b33)), counts: make([]int32, vocab),
		buf: make([]float32, vocab), idx: make([]int32, vocab)}, nil
}

// Observe records tokens (prompt or generated) for the penalties.
func (s *Sampler) Observe(ids ...int32) {
	for _, id := range ids {
		if id < 0 || int(id) >= len(s.counts) {
			continue
		}
		if s.counts[id] == 0 {
			s.seen = append(s.seen, id)
		}
		s.counts[id]++
	}
}

// Reset forgets the observed tokens.
func (s *Sampler) Reset() {
	for _, id := range s.seen {
		s.counts[id] = 0
	}
	s.seen = s.seen[:0]
}

// Sample picks the next token from logits (left unchanged) and observes it.
// It fails with ErrNoToken when the adjusted logits are all -Inf or NaN
// (finite biases and penalties can overflow float32).
func (s *Sampler) Sample(logits []float32) (int32, error) {
	p := &s.p
	x := s.buf[:len(logits)]
	copy(x, logits)
	for _, id := range s.seen {
		n := s.counts[id]
		if int(id) >= len(x) {
			continue
		}
		v := x[id]
		if rp := p.RepetitionPenalty; rp != 0 && rp != 1 {
			if v > 0 {
				v /= rp
			} else {
				v *= rp
			}
		}
		v -= p.PresencePenalty + p.FrequencyPenalty*float32(n)
		x[id] = v
	}
	for id, b := range p.LogitBias {
		x[id] += b
	}
	best := Argmax(x)
	if !finite(x[best]) {
		return 0, ErrNoToken
	}
	tok := int32(best)
	if p.Temperature != 0 {
		tok = s.draw(x)
	}
	s.Observe(tok)
	return tok, nil
}

// Argmax returns the index of the largest value, the first of equals: the
// greedy choice, as the Sampler makes it.
func Argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// draw samples from softmax(x/T) restricted by top-k, min-p and top-p.
func (s *Sampler) draw(x []float32) int32 {
	p := &s.p
	k := len(x)
	if p.TopK > 0 {
		k = min(k, p.TopK)
	}
	// Candidates in descending logit order (ties to the lower id).
	cand := s.idx[:k]
	if k < len(x) {
		kernel.TopK(cand, nil, x, k)
	} else {
		for i := range cand {
			cand[i] = int32(i)
		}
		slices.SortFunc(cand, func(a, b int32) int {
			switch {
			case x[a] > x[b]:
				return -1
			case x[a] < x[b]:
				return 1
			}
			return int(a - b)
		})
	}
	inv := 1 / p.Temperature
	top := x[cand[0]]
	// Probabilities (unnormalised) of the candidates, in place in x.
	var total float64
	for _, id := range cand {
		e := math.Exp(float64((x[id] - top) * inv))
		x[id] = float32(e)
		total += e
	}
	n := len(cand)
	if p.MinP > 0 {
		floor := p.MinP * x[cand[0]] // p_max relative; the top has e^0 = 1
		for n > 1 && x[cand[n-1]] < floor {
			n--
		}
	}
	if p.TopP > 0 && p.TopP < 1 {
		var acc float64
		for i := 0; i < n; i++ {
			acc += float64(x[cand[i]])
			if acc >= float64(p.TopP)*total {
				n = i + 1
				break
			}
		}
	}
	var kept float64
	for _, id := range cand[:n] {
		kept += float64(x[id])
	}
	u := s.rng.Float64() * kept
	for _, id := range cand[:n] {
		u -= float64(x[id])
		if u < 0 {
			return id
		}
	}
	return cand[n-1]
}
