package jsonschema

import (
	"bytes"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// TestUTF8Ranges: the byte ranges of a rune range cover exactly the
// encodings of its runes: every rune of the range (surrogates aside) is
// matched once, and the ranges' products add up to no more sequences
// than there are such runes. Random ranges check their ends and a sample
// of runes inside and around them.
func TestUTF8Ranges(t *testing.T) {
	cases := [][2]rune{{0, 0x10FFFF}, {0x20, 0x7F}, {0x7F, 0x80}, {0x7FF, 0x800}, {0x100, 0x2FF},
		{0xD7FF, 0xE000}, {0xD800, 0xDFFF}, {0xFFFF, 0x10000}, {0x1234, 0x1234}, {0x10FFFF, 0x10FFFF}}
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 40 {
		a, b := r.Int32N(0x110000), r.Int32N(0x110000)
		if i%2 == 0 { // short ranges cross fewer boundaries
			b = min(a+r.Int32N(5000), 0x10FFFF)
		}
		cases = append(cases, [2]rune{min(a, b), max(a, b)})
	}
	for ci, c := range cases {
		lo, hi := c[0], c[1]
		var seqs [][2][]byte
		total := 0
		utf8Ranges(lo, hi, func(a, z []byte) {
			size := 1
			for i := range a {
				require.LessOrEqual(t, a[i], z[i])
				size *= int(z[i]-a[i]) + 1
			}
			total += size
			seqs = append(seqs, [2][]byte{append([]byte(nil), a...), append([]byte(nil), z...)})
		})
		matched := func(x rune) int {
			e := []byte(string(x))
			n := 0
			for _, s := range seqs {
				if len(s[0]) != len(e) {
					continue
				}
				in := true
				for i := range e {
					in = in && s[0][i] <= e[i] && e[i] <= s[1][i]
				}
				if in {
					n++
				}
			}
			return n
		}
		surrogate := func(x rune) bool { return x >= 0xD800 && x <= 0xDFFF }
		check := func(x rune) {
			if x < 0 || x > 0x10FFFF || surrogate(x) {
				return
			}
			want := 0
			if lo <= x && x <= hi {
				want = 1
			}
			require.Equal(t, want, matched(x), "%#x..%#x: rune %#x", lo, hi, x)
		}
		want := int(hi - lo + 1)
		if s, e := max(lo, 0xD800), min(hi, 0xDFFF); s <= e {
			want -= int(e - s + 1)
		}
		require.Equal(t, want, total, "%#x..%#x", lo, hi)
		if ci < 10 {
			for x := lo - 1; x <= hi+1; x++ {
				check(x)
			}
			continue
		}
		for _, x := range []rune{lo - 1, lo, lo + 1, hi - 1, hi, hi + 1} {
			check(x)
		}
		for range 3000 {
			check(lo + r.Int32N(hi-lo+1))
			check(r.Int32N(0x110000))
		}
	}
}

func stringSchema(t *testing.T, kw string) *Schema {
	t.Helper()
	s, err := Compile([]byte(`{"type":"string",` + kw + `}`))
	require.NoError(t, err, kw)
	return s
}

// reads reports whether the machine reads the JSON string of v whole
// (written raw: v holds no quote, backslash or control character).
func reads(s *Schema, v string) bool {
	st := s.Start()
	return st.Feed([]byte(`"`+v+`"`)) && st.Done()
}

// TestPatterns: a pattern is a search, anchored where it says so, with
// ECMA-262's classes; strings written raw.
func TestPatterns(t *testing.T) {
	cases := []struct {
		pattern string
		yes, no []string
	}{
		{`^[a-z]{2,4}$`, []string{"ab", "abcd"}, []string{"a", "abcde", "aB", ""}},
		{`[0-9]`, []string{"7", "a7b", "xx9"}, []string{"", "abc"}},
		{`^ab`, []string{"ab", "abz"}, []string{"zab", "a"}},
		{`c$`, []string{"c", "abc"}, []string{"ca", ""}},
		{`^$`, []string{""}, []string{"a"}},
		{``, []string{"", "anything"}, nil},
		{`^(?:cat|dog)s?$`, []string{"cat", "dogs"}, []string{"cats!", "cow"}},
		{`^\d{3}-\d{4}$`, []string{"555-1234"}, []string{"5551234", "555-123"}},
		{`^\w+$`, []string{"a_1"}, []string{"a-1", "é"}},
		{`^\p{Lu}\p{Ll}+$`, []string{"Émile", "Zoë"}, []string{"émile", "E"}},
		{`^[^a-z]+$`, []string{"ABC", "€1"}, []string{"aB"}},
		{`^.$`, []string{"a", "€", "😀", "\u0085"}, []string{"\u2028", "\u2029", "ab"}},
		{`^\s$`, []string{" ", "\u00a0", "\u3000", "\ufeff"}, []string{"a"}},
		{`^\S+$`, []string{"abc"}, []string{"a b", "a\u00a0b", "a\u2003b"}},
		{`^[\s.]+$`, []string{" . \u2000"}, []string{"a"}},
		{`^\u00e9+$`, []string{"éé"}, []string{"e"}},
		{`^(?i)ab$`, []string{"AB", "aB"}, []string{"abc"}},
		{`^a{0,3}b?$`, []string{"", "aaa", "aab"}, []string{"aaaa", "ba"}},
		{`^["\\]?x$`, []string{"x"}, nil}, // a quote or backslash is never written raw
		{`^\u4e00-\u9fa5$`, []string{"一-龥"}, []string{"一"}},
		{`^[\u4e00-\u9fa5]+$`, []string{"中文"}, []string{"abc"}},
	}
	for _, c := range cases {
		s := stringSchema(t, `"pattern":`+strconv.Quote(c.pattern))
		for _, v := range c.yes {
			require.True(t, reads(s, v), "%s: %q", c.pattern, v)
		}
		for _, v := range c.no {
			require.False(t, reads(s, v), "%s: %q", c.pattern, v)
		}
	}
}

// TestPatternsAgainstRegexp: over random strings of a small alphabet,
// the machine admits a string iff package regexp finds the pattern in it
// (patterns whose meaning is the same in RE2 and ECMA-262).
func TestPatternsAgainstRegexp(t *testing.T) {
	patterns := []string{`^a(b|cd)*e?$`, `ab+c`, `^[a-c]{2}x|y$`, `(ab|ba){2,3}`, `^(a|b)*c(a|b){3}$`,
		`^x?(?:[^b]c)+$`, `^é+[aé]?$`, `b$`, `^$|^a+$`, `(?:a|^b)c`, `a(?:$|b)`}
	alphabet := []string{"a", "b", "c", "d", "e", "x", "y", "é", "€"}
	r := rand.New(rand.NewPCG(1, 2))
	for _, p := range patterns {
		s := stringSchema(t, `"pattern":`+strconv.Quote(p))
		re := regexp.MustCompile(p)
		for range 2000 {
			var v string
			for range r.IntN(8) {
				v += alphabet[r.IntN(len(alphabet))]
			}
			require.Equal(t, re.MatchString(v), reads(s, v), "%s: %q", p, v)
		}
	}
}

// TestFormats: known instances, and random walks through each format
// that the standard library's parsers accept.
func TestFormats(t *testing.T) {
	cases := map[string]struct{ yes, no []string }{
		"date": {[]string{"2024-02-29", "2000-02-29", "0000-02-29", "1999-12-31", "2023-04-30"},
			[]string{"2023-02-29", "1900-02-29", "2023-04-31", "2023-13-01", "2023-00-10", "2023-1-01", "20230101"}},
		"time":      {[]string{"23:59:59Z", "00:00:00.123456789+05:30", "12:00:00-23:59"}, []string{"24:00:00Z", "12:00:00", "12:60:00Z", "12:00:00.Z", "12:00:00.1234567890Z", "12:00:00z"}},
		"date-time": {[]string{"2024-02-29T12:30:00Z", "1985-04-12T23:20:50.52+01:00"}, []string{"2024-02-29 12:30:00Z", "2024-02-29t12:30:00Z", "2023-02-29T00:00:00Z"}},
		"uuid":      {[]string{"123e4567-e89b-12d3-a456-426614174000", "123E4567-E89B-12D3-A456-426614174000"}, []string{"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"}},
		"ipv4":      {[]string{"0.0.0.0", "255.255.255.255", "192.168.1.10"}, []string{"256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4.5"}},
		"hostname": {[]string{"localhost", "a-b.example.org", "x1.y2.z3", strings.Repeat("a", 30) + ".b"},
			[]string{"-a.b", "a-.b", "a..b", "a.b.", "a_b.c", strings.Repeat("a", 31), "a.b.c.d.e.f.g.h.i", ""}},
		"ipv6": {[]string{"::", "::1", "1::", "2001:db8::8a2e:370:7334", "2001:0db8:0000:0000:0000:ff00:0042:8329", "fe80::1:2:3:4:5:6", "1:2:3:4:5:6:7::"},
			[]string{"1:2:3:4:5:6:7:8:9", "1::2::3", "12345::", "::ffff:1.2.3.4", "fe80::1%eth0", ":1", "1:"}},
		"duration": {[]string{"P1Y", "P1Y2M3D", "P3DT4H5M6S", "PT1H", "PT5M", "PT10S", "P2W", "P1M2D", "PT1H30M"},
			[]string{"P", "PT", "P1Y2D", "P1H", "PT1D", "P1W2D", "1Y", "P1.5Y", "PT1S2M"}},
		"email": {[]string{"a@b.co", "first.last+tag@sub.example.org", "x!#$%&'*+/=?^_`{|}~-@a-b.c"}, []string{"a@b", "a..b@c.d", ".a@b.c", "a@-b.c", "a@b-.c", "@b.c", "a b@c.d"}},
	}
	r := rand.New(rand.NewPCG(7, 8))
	for f, c := range cases {
		s := stringSchema(t, `"format":"`+f+`"`)
		for _, v := range c.yes {
			require.True(t, validFormat(f, v), "the oracle: %s %q", f, v)
			require.True(t, reads(s, v), "%s: %q", f, v)
		}
		for _, v := range c.no {
			require.False(t, reads(s, v), "%s: %q", f, v)
		}
		for range 300 {
			text := shortWalk(t, s, r, 40)
			v, err := decode(text)
			require.NoError(t, err, text)
			require.True(t, validFormat(f, v.(string)), "%s: %q", f, v)
		}
	}
}

// shortWalk draws random bytes the machine accepts until the value is
// whole; past budget bytes it prefers those that end a string sooner:
// the close, an email's '@' and '.', then any byte but a digit (a
// duration's designator, a host's letter), then '0'.
func shortWalk(t *testing.T, s *Schema, r *rand.Rand, budget int) string {
	st := s.Start()
	var text []byte
	for !st.Done() {
		var ok, other []byte
		for c := range 256 {
			if st.Accepts([]byte{byte(c)}) {
				ok = append(ok, byte(c))
				if !digit(byte(c)) {
					other = append(other, byte(c))
				}
			}
		}
		require.NotEmpty(t, ok, "dead end after %q", text)
		c := ok[r.IntN(len(ok))]
		if len(text) > budget {
			switch {
			case bytes.IndexByte(ok, '"') >= 0:
				c = '"'
			case bytes.IndexByte(ok, '@') >= 0:
				c = '@'
			case bytes.IndexByte(ok, '.') >= 0:
				c = '.'
			case len(other) > 0:
				c = other[r.IntN(len(other))]
			case bytes.IndexByte(ok, '0') >= 0:
				c = '0'
			}
		}
		require.Less(t, len(text), 4*budget, "%q runs on", text)
		require.True(t, st.Feed([]byte{c}))
		text = append(text, c)
	}
	return string(text)
}

// TestLengthAndPattern: length bounds beside a pattern count code points
// in the same automaton, and nothing the machine takes is a dead end.
func TestLengthAndPattern(t *testing.T) {
	s := stringSchema(t, `"pattern":"^[aé]*b?$","minLength":2,"maxLength":3`)
	for v, ok := range map[string]bool{"aé": true, "ééb": true, "a": false, "b": false, "aéaé": false, "ab": true, "aééb": false} {
		require.Equal(t, ok, reads(s, v), "%q", v)
	}
	// "ab" then nothing but the close; "é" (two bytes) counts once.
	st := s.Start()
	require.True(t, st.Feed([]byte(`"ab`)))
	require.False(t, st.Accepts([]byte("a")))
	require.True(t, st.Accepts([]byte(`"`)))
	st = s.Start()
	require.True(t, st.Feed([]byte(`"éé`)))
	require.True(t, st.Accepts([]byte(`b"`)))
	require.False(t, st.Accepts([]byte(`ab`)))
	// A pattern that admits only strings longer than the bound admits
	// nothing.
	_, err := Compile([]byte(`{"type":"string","pattern":"^a{4}$","maxLength":3}`))
	require.ErrorIs(t, err, ErrInvalid)
	// The same pattern with null beside it: the string kind is gone.
	n, err := Compile([]byte(`{"type":["string","null"],"pattern":"^a{4}$","maxLength":3}`))
	require.NoError(t, err)
	st = n.Start()
	require.False(t, st.Accepts([]byte(`"`)))
	require.True(t, st.Accepts([]byte(`null`)))
}

// TestSpecialBytes: a pattern's automaton takes no backslash or control
// byte (it admits unescaped text, so Mask skips those tokens inside a
// patterned string), alone or with a length bound; a length counter's
// alone does.
func TestSpecialBytes(t *testing.T) {
	for _, p := range []string{"^.*$", "ab", `^[^a]+$`, `\s`, "^[ -~]*$", formatDate} {
		d, err := compilePattern(p)
		require.NoError(t, err, p)
		require.False(t, d.special, "%q", p)
		c, err := counter(1, 5)
		require.NoError(t, err)
		both, err := intersect(d, c)
		require.NoError(t, err)
		require.False(t, both.special, "%q with a length bound", p)
	}
	for _, b := range [][2]int{{0, 3}, {0, -1}, {2, -1}} {
		c, err := counter(b[0], b[1])
		require.NoError(t, err)
		require.True(t, c.special, "%d..%d code points", b[0], b[1])
	}
	// Automata of one state that take one byte (and nothing else).
	for _, c := range []byte{'\\', 0, 0x1f, 'a'} {
		d := &dfa{width: 2, next: []int32{-1, 0}, accept: []bool{true}}
		d.class[c] = 1
		d.prune()
		require.Equal(t, c != 'a', d.special, "an automaton that takes %q", c)
	}
}

// TestPatternUnions: patterned strings merge like other string schemas.
func TestPatternUnions(t *testing.T) {
	s, _ := compile(t, `{"anyOf":[{"type":"string","format":"date"},{"type":"null"}]}`)
	require.True(t, reads(s, "2020-01-31"))
	for _, src := range []string{
		`{"anyOf":[{"type":"string","format":"date"},{"type":"string","format":"uuid"}]}`,
		`{"anyOf":[{"type":"string","pattern":"^a"},{"const":"b"}]}`,
	} {
		_, err := Compile([]byte(src))
		require.ErrorIs(t, err, ErrUnsupported, src)
	}
	// A literal the pattern admits is absorbed.
	s, _ = compile(t, `{"anyOf":[{"type":"string","pattern":"^a"},{"const":"abc"}]}`)
	require.True(t, reads(s, "abc"))
	require.True(t, reads(s, "ax"))
}

// FuzzPattern: a pattern compiles or is refused without a panic; a
// compiled one never leaves a dead end, writes only valid UTF-8 without
// quotes, backslashes or control bytes, and admits a string iff package
// regexp finds the (ECMA-spelled) pattern in it.
func FuzzPattern(f *testing.F) {
	for _, p := range []string{`^[a-z]{2,4}$`, `a(b|c)*d`, `^\S+@\S+$`, `^.{3}$`, `\p{Greek}+`, `^(?:x|y)?z$`, `[^\s]`, `^\u00e9?$`} {
		f.Add(p, uint64(1))
	}
	f.Fuzz(func(t *testing.T, p string, seed uint64) {
		d, err := compilePattern(p)
		if err != nil {
			return
		}
		src, err := ecma(p)
		require.NoError(t, err)
		re := regexp.MustCompile(src)
		r := rand.New(rand.NewPCG(seed, 3))
		var runes []rune // the pattern's own runes, and a few others
		for _, c := range p + "aZ0 é€😀" {
			runes = append(runes, c)
		}
		for range 20 {
			if d.none {
				break
			}
			st, text := int32(0), []byte{}
			for len(text) < 64 && !(d.accept[st] && r.IntN(4) == 0) {
				var next []byte
				for c := range 256 {
					if d.step(st, byte(c)) >= 0 {
						next = append(next, byte(c))
					}
				}
				if len(next) == 0 {
					require.True(t, d.accept[st], "%q: dead end after %q", p, text)
					break
				}
				c := next[r.IntN(len(next))]
				st = d.step(st, c)
				text = append(text, c)
			}
			if !d.accept[st] {
				continue
			}
			require.True(t, utf8.Valid(text), "%q: %q", p, text)
			for _, c := range text {
				require.False(t, c < 0x20 || c == '"' || c == '\\', "%q: %q", p, text)
			}
			require.True(t, re.Match(text), "%q admits %q", p, text)
		}
		for range 50 {
			var b []rune
			for range r.IntN(6) {
				b = append(b, runes[r.IntN(len(runes))])
			}
			s := string(b)
			writable := !strings.ContainsFunc(s, func(c rune) bool { return c < 0x20 || c == '"' || c == '\\' })
			require.Equal(t, writable && re.MatchString(s), d.matches(s), "%q on %q", p, s)
		}
	})
}
