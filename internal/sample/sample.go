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
	"k3/specdec"
)

// ErrInvalid is wrapped by errors about invalid sampling parameters (k3
// wraps it for its other options too, as k3.ErrInvalidOption).
var ErrInvalid = errors.New("invalid option")

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
	// Speculative sampling: the drafts' random stream (made at the first
	// Draft), and Verify's distributions.
	draft              *rand.Rand
	probs, res, onehot []float64
	mask               []bool // SetMask: the tokens that may be drawn next
}

// SetMask limits the next draws to the tokens whose entry in allowed is
// true (a constrained generation sets it before each draw); nil lifts the
// limit. The sampler reads allowed, which the caller keeps.
func (s *Sampler) SetMask(allowed []bool) { s.mask = allowed }

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
	x, best, err := s.adjust(logits)
	if err != nil {
		return 0, err
	}
	tok := int32(best)
	if s.p.Temperature != 0 {
		cand, kept := s.filter(x, best)
		tok = pick(cand, x, s.rng.Float64()*kept)
	}
	s.Observe(tok)
	return tok, nil
}

// adjust applies the penalties and the logit bias to a copy of logits (in
// s.buf) and returns it with its argmax.
func (s *Sampler) adjust(logits []float32) ([]float32, int, error) {
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
	if s.mask != nil {
		inf := float32(math.Inf(-1))
		for i, ok := range s.mask[:len(x)] {
			if !ok {
				x[i] = inf
			}
		}
	}
	best := Argmax(x)
	if !finite(x[best]) {
		return nil, 0, ErrNoToken
	}
	return x, best, nil
}

// Argmax returns the index of the largest value, the first of equals: the
// greedy choice, as the Sampler makes it. NaNs are passed over, except a
// NaN at index 0, which is returned (there is no larger value to find
// against it); the caller rejects non-finite picks.
func Argmax(x []float32) int {
	if len(x) < 64 || x[0] != x[0] {
		return argmaxScalar(x)
	}
	// Eight running maxima over interleaved lanes, then the first index
	// holding the largest: independent compares instead of one chain
	// through x[best] (2x at a 163,840-token vocabulary).
	inf := float32(math.Inf(-1))
	m := [8]float32{inf, inf, inf, inf, inf, inf, inf, inf}
	i := 0
	for ; i+8 <= len(x); i += 8 {
		c := x[i : i+8 : i+8]
		for j, v := range c {
			if v > m[j] {
				m[j] = v
			}
		}
	}
	top := m[0]
	for _, v := range m[1:] {
		if v > top {
			top = v
		}
	}
	for _, v := range x[i:] {
		if v > top {
			top = v
		}
	}
	for j, v := range x {
		if v == top {
			return j
		}
	}
	return 0 // not reached: top is an element's value (-Inf only if x[0] is)
}

// argmaxScalar is Argmax as one loop: the specification Argmax is tested
// against.
func argmaxScalar(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// filter turns the adjusted logits x into the weights of softmax(x/T)
// restricted by top-k, min-p and top-p: it returns the candidates kept,
// with their unnormalised weights in place in x, and the weights' sum.
// Without top-k or top-p the candidates are the whole vocabulary in id
// order (min-p zeroes the weights below its floor), so no token order is
// needed; otherwise they are in descending logit order (ties to the lower
// id), and for top-p over the whole vocabulary only as long a prefix of
// that order is ranked as the nucleus needs. Either way no sort of the
// vocabulary runs per token.
func (s *Sampler) filter(x []float32, best int) ([]int32, float64) {
	p := &s.p
	k := len(x)
	if p.TopK > 0 {
		k = min(k, p.TopK)
	}
	topP := p.TopP > 0 && p.TopP < 1
	inv := 1 / p.Temperature
	top := x[best]
	if k == len(x) && !topP {
		// The whole vocabulary at once, with the vector exponential.
		cand := s.idx[:len(x)]
		for i, v := range x {
			cand[i] = int32(i)
			x[i] = (v - top) * inv
		}
		kernel.ExpSlice(x)
		var kept float64
		for i, w := range x {
			if w < p.MinP { // the top's weight, e^0 = 1, is never below it
				x[i], w = 0, 0
			}
			kept += float64(w)
		}
		return cand, kept
	}
	var total float64
	var cand []int32
	if k < len(x) {
		if k > len(x)/8 {
			cand = rankAll(s.idx[:len(x)], x)[:k]
		} else {
			cand = s.idx[:k]
			kernel.TopK(cand, nil, x, k)
		}
		for _, id := range cand {
			total += weight(x[id], top, inv)
		}
	} else {
		// Top-p over the whole vocabulary: rank the best m tokens, more
		// as needed, until the prefix holds where min-p or top-p cuts.
		for _, v := range x {
			total += weight(v, top, inv)
		}
		// Past an eighth of the vocabulary a sort beats the heap.
		for m := min(64, len(x)); ; m *= 4 {
			if m > len(x)/8 {
				cand = rankAll(s.idx[:len(x)], x)
				break
			}
			cand = s.idx[:m]
			kernel.TopK(cand, nil, x, m)
			if nucleusWithin(cand, x, top, inv, float32(p.MinP), float64(p.TopP)*total) {
				break
			}
		}
	}
	for _, id := range cand {
		x[id] = float32(weight(x[id], top, inv))
	}
	n := len(cand)
	if p.MinP > 0 {
		floor := p.MinP * x[cand[0]] // p_max relative; the top has e^0 = 1
		for n > 1 && x[cand[n-1]] < floor {
			n--
		}
	}
	if topP {
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
	return cand[:n], kept
}

// rankAll writes every token id to cand in descending order of x, ties
// to the lower id, and returns it.
func rankAll(cand []int32, x []float32) []int32 {
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
	return cand
}

// weight is a logit's unnormalised probability at temperature 1/inv,
// relative to the top logit.
func weight(v, top, inv float32) float64 { return math.Exp(float64((v - top) * inv)) }

// nucleusWithin reports whether the ranked prefix cand of the logits x
// reaches where min-p (a weight below floor) or top-p (a running weight
// of mass) cuts the candidates.
func nucleusWithin(cand []int32, x []float32, top, inv, floor float32, mass float64) bool {
	var acc float64
	for _, id := range cand {
		w := float32(weight(x[id], top, inv))
		if w < floor {
			return true
		}
		if acc += float64(w); acc >= mass {
			return true
		}
	}
	return false
}

// pick returns the candidate at which u, uniform in [0, the weights' sum),
// falls in the weights' running sum; rounding past the end gives the last
// candidate of non-zero weight.
func pick(cand []int32, w []float32, u float64) int32 {
	last := cand[0]
	for _, id := range cand {
		if w[id] <= 0 {
			continue
		}
		last = id
		if u -= float64(w[id]); u < 0 {
			return id
		}
	}
	return last
}

// Probs writes to dst ([vocab]) the distribution Sample draws from after
// logits, given the tokens observed: the penalties and bias, then
// softmax(x/T) restricted by top-k, min-p and top-p, with zeros for every
// token filtered out (greedy: all on the argmax).
func (s *Sampler) Probs(logits []float32, dst []float64) error {
	x, best, err := s.adjust(logits)
	if err != nil {
		return err
	}
	clear(dst)
	if s.p.Temperature == 0 {
		dst[best] = 1
		return nil
	}
	cand, kept := s.filter(x, best)
	for _, id := range cand {
		dst[id] = float64(x[id]) / kept
	}
	return nil
}

// Draft draws a draft token for speculative sampling from the drafter's
// logits under the same processing as Sample (penalties counting the
// tokens observed, including the drafts drawn before it), writes its
// distribution q to dst and observes the token, so the next draft's
// penalties count it. Its draws come from a random stream of their own,
// seeded alike. Forget the drafts once the block is drafted.
func (s *Sampler) Draft(logits []float32, dst []float64) (int32, error) {
	if err := s.Probs(logits, dst); err != nil {
		return 0, err
	}
	if s.draft == nil {
		s.draft = rand.New(rand.NewPCG(s.p.Seed, 0x6b33d))
	}
	tok := drawProbs(dst, s.draft.Float64())
	s.Observe(tok)
	return tok, nil
}

// Forget undoes Observe for ids.
func (s *Sampler) Forget(ids ...int32) {
	for _, id := range ids {
		if id < 0 || int(id) >= len(s.counts) || s.counts[id] == 0 {
			continue
		}
		if s.counts[id]--; s.counts[id] == 0 {
			i := slices.Index(s.seen, id)
			s.seen = slices.Delete(s.seen, i, i+1)
		}
	}
}

// Verify is Sample for a position holding a draft token d drawn from q
// (Draft's distribution; nil: a drafter without one, which always
// proposes d): exact speculative sampling keeps d with probability
// min(1, p(d)/q(d)), p the distribution Sample would draw from, and
// otherwise draws from the normalised max(0, p - q). The token returned
// is distributed as Sample's; it is d exactly when d was kept.
func (s *Sampler) Verify(logits []float32, q []float64, d int32) (int32, error) {
	if s.p.Temperature == 0 {
		return s.Sample(logits)
	}
	if d < 0 || int(d) >= len(logits) {
		return 0, fmt.Errorf("%w: draft token %d outside the vocabulary (%d)", ErrInvalid, d, len(logits))
	}
	if len(s.probs) < len(logits) {
		s.probs = make([]float64, len(logits))
		s.res = make([]float64, len(logits))
	}
	p, res := s.probs[:len(logits)], s.res[:len(logits)]
	if err := s.Probs(logits, p); err != nil {
		return 0, err
	}
	if q == nil {
		// A drafter without a distribution: q is one-hot on d.
		if len(s.onehot) < len(logits) {
			s.onehot = make([]float64, len(logits))
		}
		q = s.onehot[:len(logits)]
		q[d] = 1
		defer func() { q[d] = 0 }()
	}
	var tok int32
	if specdec.Accept(p[d], q[d], s.rng.Float64()) {
		tok = d
	} else {
		specdec.Residual(res, p, q)
		tok = drawProbs(res, s.rng.Float64())
	}
	s.Observe(tok)
	return tok, nil
}

// drawProbs returns the token at which u falls in the running sum of
// probs, skipping zeros (so a token of zero probability never comes out).
func drawProbs(probs []float64, u float64) int32 {
	last := int32(-1)
	for i, v := range probs {
		if v <= 0 {
			continue
		}
		last = int32(i)
		if u -= v; u < 0 {
			return last
		}
	}
	return last
}
