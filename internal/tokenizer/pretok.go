package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// KimiPattern is the pre-tokenizer pattern of the Kimi tiktoken models, as
// tokenization_kimi.py defines it. Go's regexp has neither the class
// intersections nor the lookahead it uses, so SplitKimi implements it by
// hand; this string documents what it implements.
const KimiPattern = `[\p{Han}]+` +
	`|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?` +
	`|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?` +
	`|\p{N}{1,3}` +
	`| ?[^\s\p{L}\p{N}]+[\r\n]*` +
	`|\s*[\r\n]+` +
	`|\s+(?!\S)` +
	`|\s+`

func isHan(r rune) bool { return unicode.Is(unicode.Han, r) }

// upperish is [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] minus Han.
func upperish(r rune) bool {
	return !isHan(r) && (unicode.In(r, unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo, unicode.M))
}

// lowerish is [\p{Ll}\p{Lm}\p{Lo}\p{M}] minus Han.
func lowerish(r rune) bool {
	return !isHan(r) && (unicode.In(r, unicode.Ll, unicode.Lm, unicode.Lo, unicode.M))
}

// prefixRune is [^\r\n\p{L}\p{N}].
func prefixRune(r rune) bool {
	return r != '\r' && r != '\n' && !unicode.IsLetter(r) && !unicode.IsNumber(r)
}

func isSpace(r rune) bool { return unicode.IsSpace(r) }

// symbol is [^\s\p{L}\p{N}].
func symbol(r rune) bool { return !isSpace(r) && !unicode.IsLetter(r) && !unicode.IsNumber(r) }

// SplitKimi splits text into pre-tokens by KimiPattern: at each position
// the first alternative that matches wins, each with the backtracking the
// regular expression would do. Bytes that are not valid UTF-8 stand alone
// as symbols, so every byte of text lands in exactly one piece.
func SplitKimi(text string, yield func(piece string)) {
	// Decode once; rs[i] is the rune starting at byte offset off[i].
	var rs []rune
	var off []int
	for i := 0; i < len(text); {
		r, n := utf8.DecodeRuneInString(text[i:])
		if r == utf8.RuneError && n <= 1 {
			r = -1 // an invalid byte: matches only the symbol class
		}
		rs, off = append(rs, r), append(off, i)
		i += n
	}
	off = append(off, len(text))
	for i := 0; i < len(rs); {
		n := matchAt(rs, i)
		if n <= 0 {
			n = 1
		}
		yield(text[off[i]:off[i+n]])
		i += n
	}
}

func runWhile(rs []rune, i int, f func(rune) bool) int {
	j := i
	for j < len(rs) && rs[j] >= 0 && f(rs[j]) {
		j++
	}
	return j - i
}

// contraction matches (?i:'s|'t|'re|'ve|'m|'ll|'d) at i.
func contraction(rs []rune, i int) int {
	if i >= len(rs) || rs[i] != '\'' {
		return 0
	}
	low := func(k int) rune {
		if i+k >= len(rs) || rs[i+k] < 0 {
			return 0
		}
		return unicode.ToLower(rs[i+k])
	}
	switch c := low(1); c {
	case 's', 't', 'm', 'd':
		return 2
	case 'r':
		if low(2) == 'e' {
			return 3
		}
	case 'v':
		if low(2) == 'e' {
			return 3
		}
	case 'l':
		if low(2) == 'l' {
			return 3
		}
	}
	return 0
}

// matchAt returns the length in runes of the pre-token starting at i.
func matchAt(rs []rune, i int) int {
	r := rs[i]
	if r >= 0 && isHan(r) {
		return runWhile(rs, i, isHan)
	}
	// Alternatives 2 and 3: optional prefix rune, then letters.
	for _, pre := range []int{1, 0} {
		if pre == 1 && (r < 0 || !prefixRune(r)) {
			continue
		}
		j := i + pre
		u := runWhile(rs, j, upperish)
		// upper* lower+: give back upper runes until a lower one follows.
		for k := u; k >= 0; k-- {
			if m := runWhile(rs, j+k, lowerish); m > 0 {
				end := j + k + m
				return end + contraction(rs, end) - i
			}
		}
	}
	for _, pre := range []int{1, 0} {
		if pre == 1 && (r < 0 || !prefixRune(r)) {
			continue
		}
		j := i + pre
		if u := runWhile(rs, j, upperish); u > 0 {
			end := j + u
			end += runWhile(rs, end, lowerish)
			return end + contraction(rs, end) - i
		}
	}
	// "\p{N}{1,3}": at most three, looking no further (a long run of
	// digits is many pieces; scanning the whole run for each made it
	// quadratic).
	n := 0
	for n < 3 && i+n < len(rs) && rs[i+n] >= 0 && unicode.IsNumber(rs[i+n]) {
		n++
	}
	if n > 0 {
		return n
	}
	// " ?[^\s\p{L}\p{N}]+[\r\n]*"
	for _, sp := range []int{1, 0} {
		if sp == 1 && r != ' ' {
			continue
		}
		j := i + sp
		s := 0
		for j+s < len(rs) && (rs[j+s] < 0 || symbol(rs[j+s])) {
			s++
		}
		if s > 0 {
			end := j + s
			return end + runWhile(rs, end, func(c rune) bool { return c == '\r' || c == '\n' }) - i
		}
	}
	w := runWhile(rs, i, isSpace)
	if w == 0 {
		return 1
	}
	// "\s*[\r\n]+": up to and including the last newline of the run.
	for k := w - 1; k >= 0; k-- {
		if c := rs[i+k]; c == '\r' || c == '\n' {
			return k + 1
		}
	}
	// "\s+(?!\S)": the run, less its last rune when a non-space follows.
	if i+w == len(rs) {
		return w
	}
	if w >= 2 {
		return w - 1
	}
	return w // "\s+"
}
