package jsonschema

// Bounds on numbers. A node's lo and hi are counted in units of
// 10^-digits (digits: the most fraction digits its bounds have; 0 on an
// integer, whose bounds are the integers they admit), each closed or
// open. The number read so far is a sign, integer digits (val, saturating
// at maxBound), the first digits fraction digits (frac) and whether a
// nonzero digit came after them (extra); in those units what it may
// still become is an interval, and a digit is taken only while that
// interval meets the bounds. A bounded number is written without
// exponent.

// pow10 are the powers of ten an int64 holds.
var pow10 = func() (p [19]int64) {
	p[0] = 1
	for i := 1; i < len(p); i++ {
		p[i] = p[i-1] * 10
	}
	return p
}()

// maxDigits is the most fraction digits a bound may have.
const maxDigits = 9

// satMul is a*b for a, b in [0, maxBound], saturating at maxBound.
func satMul(a, b int64) int64 {
	if a != 0 && b > maxBound/a {
		return maxBound
	}
	return min(a*b, maxBound)
}

// satAdd is a+b for a, b in [0, maxBound], saturating at maxBound.
func satAdd(a, b int64) int64 {
	if a > maxBound-b {
		return maxBound
	}
	return a + b
}

// appendDigit is v*10 + c's digit, saturating at maxBound.
func appendDigit(v int64, c byte) int64 {
	return satAdd(satMul(v, 10), int64(c-'0'))
}

// neg negates a bound, a missing one staying missing on the other side.
func neg(b int64) int64 {
	switch b {
	case noLo:
		return noHi
	case noHi:
		return noLo
	}
	return -b
}

// span is a set of bounds: lo and hi, each closed or open.
type span struct {
	lo, hi         int64
	loOpen, hiOpen bool
}

// has reports whether x is within s.
func (s span) has(x int64) bool {
	return (x > s.lo || x == s.lo && !s.loOpen) && (x < s.hi || x == s.hi && !s.hiOpen)
}

// meets reports whether some x with a <= x < b (a < x if aOpen) is
// within s. An a saturated at maxBound stands for magnitudes from
// maxBound on, past every bound: they meet s only if it has no upper
// bound.
func (s span) meets(a, b int64, aOpen bool) bool {
	if a >= maxBound {
		return s.hi == noHi
	}
	lower, open := a, aOpen
	switch {
	case s.lo > a:
		lower, open = s.lo, s.loOpen
	case s.lo == a:
		open = aOpen || s.loOpen
	}
	if lower >= b {
		return false
	}
	if open || s.hiOpen {
		return lower < s.hi
	}
	return lower <= s.hi
}

// ranged reports whether the number read has bounds.
func (cur *cursor) ranged() bool { return cur.n.lo != noLo || cur.n.hi != noHi }

// magnitude is the bounds on the number's magnitude: its own, mirrored
// after a minus (-v in [lo, hi] iff v in [-hi, -lo]).
func (cur *cursor) magnitude() span {
	n := cur.n
	if !cur.neg {
		return span{n.lo, n.hi, n.loOpen, n.hiOpen}
	}
	return span{neg(n.hi), neg(n.lo), n.hiOpen, n.loOpen}
}

// fracDigit takes a fraction digit.
func (cur *cursor) fracDigit(c byte) {
	switch d := cur.n.digits; {
	case cur.fd < d:
		cur.frac = cur.frac*10 + int64(c-'0')
		cur.fd++
	default:
		cur.extra = cur.extra || c != '0'
		cur.fd = d + 1
	}
}

// fraction is where the fraction read so far starts the magnitude's
// interval, past the integer part, and how wide the interval is (open at
// its start after a nonzero digit past the bounds' digits).
func (cur *cursor) fraction() (off, width int64, open bool) {
	d := cur.n.digits
	if cur.fd <= d {
		w := pow10[d-cur.fd]
		return cur.frac * w, w, false
	}
	return cur.frac, 1, cur.extra
}

// fits reports whether the number read so far can still end within its
// bounds: "-" may become any magnitude; integer digits p may become p
// with k more digits and any fraction, [p*10^k, (p+1)*10^k); after '.'
// the digits read fix the interval to their last place (a leading 0
// takes no more integer digits).
func (cur *cursor) fits() bool {
	if !cur.ranged() {
		return true
	}
	s, unit := cur.magnitude(), pow10[cur.n.digits]
	switch cur.mode {
	case mMinus:
		return s.meets(0, maxBound, false)
	case mZero:
		return s.meets(0, unit, false)
	case mInt:
		for a, w := satMul(cur.val, unit), unit; ; a, w = satMul(a, 10), satMul(w, 10) {
			if s.meets(a, satAdd(a, w), false) {
				return true
			}
			if a >= s.hi || a == maxBound {
				return false
			}
		}
	case mFracStart:
		a := satMul(cur.val, unit)
		return s.meets(a, satAdd(a, unit), false)
	case mFrac:
		off, w, open := cur.fraction()
		a := satAdd(satMul(cur.val, unit), off)
		return s.meets(a, satAdd(a, w), open)
	}
	return true
}

// within reports whether the number read so far, as it stands, is within
// its bounds. Past the bounds' digits with a nonzero digit the value
// lies strictly between two neighbouring units, which no bound splits.
func (cur *cursor) within() bool {
	if !cur.ranged() {
		return true
	}
	s, unit := cur.magnitude(), pow10[cur.n.digits]
	switch cur.mode {
	case mZero:
		return s.has(0)
	case mInt:
		return s.has(satMul(cur.val, unit))
	case mFrac:
		off, _, open := cur.fraction()
		a := satAdd(satMul(cur.val, unit), off)
		if open {
			return s.meets(a, satAdd(a, 1), true)
		}
		return s.has(a)
	}
	return true
}
