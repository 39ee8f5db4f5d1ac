package specdec

// A Drafter proposes tokens that may continue a sequence.
type Drafter interface {
	// Draft appends to dst at most n tokens that may follow history and
	// returns the extended slice; it may propose none. It must not keep
	// or change history.
	Draft(history []int32, n int, dst []int32) []int32
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
