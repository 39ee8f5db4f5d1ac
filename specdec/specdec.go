package specdec

import "math"

// A Drafter proposes tokens that may continue a sequence.
type Drafter interface {
	// Draft appends to dst at most n tokens that may follow history and
	// returns the extended slice; it may propose none. It must not keep
	// or change history.
	Draft(history []int32, n int, dst []int32) []int32
}

// A Sampler is a Drafter that drafts from distributions of its own (a
// model's logits), so that a sampling generation can draw each draft
// from the drafter's distribution and verify it by rejection sampling
// against the target's: the output is then distributed as plain sampling,
// and a draft is kept with probability Σ min(p, q) rather than the p of a
// fixed draft.
type Sampler interface {
	Drafter
	// SampleDraft is Draft with each draft chosen by pick from the
	// drafter's logits for its position (one row of the vocabulary,
	// valid during the call); the drafts after it follow the token pick
	// returned. A negative token from pick ends the block there.
	SampleDraft(history []int32, n int, dst []int32, pick func(logits []float32) int32) []int32
}

// NGram is prompt-lookup drafting: it finds the most recent earlier
// occurrence of the sequence's last Max tokens (then Max-1, down to Min)
// and proposes the tokens that followed it. It suits outputs that copy
// their input (summaries, code edits, retrieval answers) and costs no
// model pass. The zero value uses Min 1 and Max 3.
type NGram struct {
	Min, Max int
}

// Draft implements Drafter.
func (g NGram) Draft(history []int32, n int, dst []int32) []int32 {
	lo, hi := g.Min, g.Max
	if lo <= 0 {
		lo = 1
	}
	if hi <= 0 {
		hi = 3
	}
	t := len(history)
	for k := min(hi, t-1); k >= lo; k-- {
		suffix := history[t-k:]
		// The most recent earlier start i (i+k <= t-1, so at least one
		// token follows the match).
		for i := t - k - 1; i >= 0; i-- {
			if !equal(history[i:i+k], suffix) {
				continue
			}
			end := min(t, i+k+n)
			return append(dst, history[i+k:end]...)
		}
	}
	return dst
}

func equal(a, b []int32) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Accept reports whether exact speculative sampling keeps a draft token
// drawn from the drafter's distribution with probability q of it, where
// the target gives it probability p, for a uniform u in [0, 1): it keeps
// it with probability min(1, p/q). p and q must come from the same
// processing (temperature, top-k/top-p/min-p, penalties).
func Accept(p, q float64, u float64) bool {
	return u*q < p
}

// Residual writes to dst the distribution to draw from after a draft
// token was rejected: max(0, p - q) normalised, or p itself when that is
// zero everywhere (p and q equal up to rounding). Drawing the replacement
// from it is what makes the kept-or-replaced token distributed exactly
// as p. dst, p and q have the vocabulary's length.
func Residual(dst, p, q []float64) {
	var total float64
	for i := range dst {
		d := p[i] - q[i]
		if d < 0 {
			d = 0
		}
		dst[i] = d
		total += d
	}
	if total <= 0 {
		copy(dst, p)
		return
	}
	for i := range dst {
		dst[i] /= total
	}
}

// Costs are measured costs of verify passes on the running machine, in
// units of a one-token decode step: Pass[n] is a pass of n tokens (Pass[1]
// is 1; Pass[0] is unused) and Rollback what dropping rejected drafts
// adds to a pass.
type Costs struct {
	Pass     []float64
	Rollback float64
	// Draft is what drafting one token costs, and Step the time (seconds)
	// of the one-token step the other figures are relative to, so that a
	// drafter's measured time converts to Draft.
	Draft, Step float64
	// Block is a drafting cost a pass pays whatever its depth: a drafter
	// that proposes a whole block in one pass (DSpark) pays for the block
	// however few of its drafts are verified.
	Block float64
}

// MinGain is the least expected speedup over plain decoding for which
// BestDepth speculates at all: below it, the estimates' noise could make
// speculation slower than not speculating.
const MinGain = 1.15

// BestDepth returns the draft depth in [0, max] that maximises the
// expected tokens per unit of cost when each draft is accepted with
// probability alpha given that the ones before it were: a pass of depth
// K yields 1 + α + ... + α^K tokens and costs Pass[K+1], K·Draft and
// Block, plus Rollback unless every draft is kept (probability α^K). It
// returns 0, plain decoding, unless some depth is expected to be at least
// MinGain times as fast. Depths beyond the costs measured are not
// considered.
func BestDepth(alpha float64, max int, c Costs) int {
	best, bestRate := 0, MinGain
	tokens, keepAll := 1.0, 1.0
	for k := 1; k <= max && k+1 < len(c.Pass); k++ {
		keepAll *= alpha
		tokens += keepAll
		cost := c.Pass[k+1] + float64(k)*c.Draft + c.Block + c.Rollback*(1-keepAll)
		if rate := tokens / cost; rate > bestRate {
			best, bestRate = k, rate
		}
	}
	return best
}

// BestPrefix returns how many of a drafted block to verify, from the
// drafter's per-position confidences (conf[k]: the probability that draft
// k is accepted given that the ones before it were, DSpark's confidence
// head): the prefix K that maximises the expected tokens per unit of cost,
// 1 + Σ_{k≤K} Π_{i≤k} conf[i] over Pass[K+1] plus Rollback unless every
// draft is kept. The block's drafting is already paid for. It returns 0,
// a plain step, unless some prefix is expected to be at least MinGain
// times as fast.
func BestPrefix(conf []float32, c Costs) int {
	best, bestRate := 0, MinGain
	tokens, keepAll := 1.0, 1.0
	for k := 1; k <= len(conf) && k+1 < len(c.Pass); k++ {
		keepAll *= float64(conf[k-1])
		tokens += keepAll
		cost := c.Pass[k+1] + c.Rollback*(1-keepAll)
		if rate := tokens / cost; rate > bestRate {
			best, bestRate = k, rate
		}
	}
	return best
}

// Acceptance estimates the probability that a draft is accepted given
// that the drafts before it were: an exponential moving average of the
// outcomes observed, starting from 0 so that a drafter earns speculation
// by its record.
type Acceptance struct {
	rate float64
}

// acceptanceDecay is the weight an estimate keeps per observation (DSpark's
// scheduler uses 0.9 for its survival estimates).
const acceptanceDecay = 0.9

// Observe records whether a draft whose predecessors were all accepted
// was accepted itself.
func (a *Acceptance) Observe(accepted bool) {
	v := 0.0
	if accepted {
		v = 1
	}
	a.rate = acceptanceDecay*a.rate + (1-acceptanceDecay)*v
}

// ObserveRate records the probability that a draft whose predecessors
// were all accepted would have been accepted, where it is known without
// verifying it: for a draft drawn from q against a target p, Σ min(p, q).
func (a *Acceptance) ObserveRate(r float64) {
	a.rate = acceptanceDecay*a.rate + (1-acceptanceDecay)*min(max(r, 0), 1)
}

// Rate returns the current estimate.
func (a *Acceptance) Rate() float64 { return a.rate }

// Lower returns the estimate less one standard deviation of the average
// for outcomes of that rate (r(1-r)(1-d)/(1+d) for the decay d): the rate
// to choose a depth by, so that the average's noise (about ±0.11 at 0.5)
// does not make speculation look as if it paid where it does not.
func (a *Acceptance) Lower() float64 {
	r := a.rate
	sd := math.Sqrt(r * (1 - r) * (1 - acceptanceDecay) / (1 + acceptanceDecay))
	return max(0, r-sd)
}
