package jsonschema

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRandomSchemas compiles random schemas made of the keywords the
// package reads, nested and combined, and holds the machine to the
// oracle on each. Texts written for values built from the schema (most
// meant to be valid, some broken on purpose) are read, whole and byte by
// byte, exactly when the oracle validates them; random walks never reach
// a dead end and end only in values the oracle validates; a schema
// refused as admitting no value admits none of the values built for it;
// along a walk, Mask and MaskThen agree with Accepts and Span; Objects'
// walks end in objects of the schema, and it is refused only where no
// valid value built is an object;
// every other refusal wraps ErrUnsupported or ErrInvalid. K3_SCHEMAS=N
// runs N schemas instead of the default 300 (K3_SCHEMAS_SEED the first
// seed).
func TestRandomSchemas(t *testing.T) {
	n, first := 300, 1
	if v, err := strconv.Atoi(os.Getenv("K3_SCHEMAS")); err == nil && v > 0 {
		n = v
	}
	if v, err := strconv.Atoi(os.Getenv("K3_SCHEMAS_SEED")); err == nil {
		first = v
	}
	compiled, agreed, walked := 0, 0, 0
	for seed := first; seed < first+n; seed++ {
		ok, valid, finished := checkRandomSchema(t, seed)
		if ok {
			compiled++
		}
		agreed += valid
		walked += finished
	}
	// The test means something only if most schemas compile and many
	// built values are valid.
	require.Greater(t, compiled, n/2, "schemas compiled")
	require.Greater(t, agreed, compiled*10, "valid values read")
	t.Logf("%d of %d schemas compiled; %d valid values read; %d walks finished", compiled, n, agreed, walked)
}

// checkRandomSchema checks one random schema: whether it compiled, how
// many valid values were read and how many walks finished.
func checkRandomSchema(t *testing.T, seed int) (compiled bool, valid, walked int) {
	r := rand.New(rand.NewPCG(uint64(seed), 99))
	src := randomSchema(r)
	// A failure inside walk, or a panic, names neither.
	defer func() {
		if e := recover(); e != nil {
			fmt.Fprintf(os.Stderr, "seed %d: schema %s\n", seed, src)
			panic(e)
		}
		if t.Failed() {
			t.Logf("seed %d: schema %s", seed, src)
		}
	}()
	doc, err := decode(src)
	require.NoError(t, err, src)
	vd := validator{doc}
	s, err := Compile([]byte(src))
	if err != nil {
		require.True(t, errors.Is(err, ErrUnsupported) || errors.Is(err, ErrInvalid), "%v", err)
		if strings.Contains(err.Error(), "admits no value") {
			g := &valueMaker{r: r, doc: doc}
			for range 300 {
				text := encodeValue(g.value(doc, 0))
				v, err := decode(text)
				require.NoError(t, err, text)
				require.False(t, vd.valid(doc, v), "refused as admitting no value, yet the oracle admits %s", text)
			}
		}
		return false, 0, 0
	}
	g := &valueMaker{r: r, doc: doc}
	validObject := false // a valid value built was an object
	for range 60 {
		text := encodeValue(g.value(doc, 0))
		v, err := decode(text)
		require.NoError(t, err, text)
		want := vd.valid(doc, v)
		if want {
			valid++
			_, isObject := v.(map[string]any)
			validObject = validObject || isObject
		}
		st := s.Start()
		whole := st.Feed([]byte(text)) && st.Complete()
		require.Equal(t, want, whole, "text %s (whole)", text)
		st = s.Start()
		bytewise := true
		for i := 0; i < len(text) && bytewise; i++ {
			bytewise = st.Feed([]byte{text[i]})
		}
		require.Equal(t, want, bytewise && st.Complete(), "text %s (byte by byte)", text)
	}
	for i := range 20 {
		text, done := walk(t, s, r, 30+r.IntN(60))
		if i == 0 {
			checkMasks(t, s, text)
		}
		if !done {
			continue
		}
		walked++
		v, err := decode(text)
		require.NoError(t, err, "walk %q", text)
		require.True(t, vd.valid(doc, v), "walk %q breaks the schema", text)
	}
	// Restricted to objects (a tool call's arguments): walks end in
	// objects of the schema; refused, no valid value built was one.
	o, err := s.Objects()
	if err != nil {
		require.ErrorIs(t, err, ErrInvalid)
		require.False(t, validObject, "Objects refused, yet the schema admits an object")
		return true, valid, walked
	}
	for range 5 {
		text, done := walk(t, o, r, 30+r.IntN(60))
		if !done {
			continue
		}
		v, err := decode(text)
		require.NoError(t, err, "walk %q", text)
		_, isObject := v.(map[string]any)
		require.True(t, isObject && vd.valid(doc, v), "walk %q of Objects", text)
	}
	return true, valid, walked
}

// maskVocab is the vocabulary checkMasks reads: bytes, pieces, the
// edges of Mask's walks, the schemas' keys and a byte-pair one's shapes.
var maskVocab = sync.OnceValues(func() ([][]byte, *Vocab) {
	toks := append(bpeVocab(500), maskEdges...)
	for _, p := range pieces {
		toks = append(toks, []byte(p))
	}
	for _, k := range keyPool {
		toks = append(toks, []byte(`"`+k+`":`), []byte(`{"`+k+`":`), []byte(`,"`+k+`":"`))
	}
	toks = append(toks, nil)
	return toks, NewVocab(toks)
})

// checkMasks holds Mask to Accepts, and MaskThen to Span, at every
// position of text.
func checkMasks(t *testing.T, s *Schema, text string) {
	toks, v := maskVocab()
	const after = "]}<end>"
	then := func(rest []byte) bool { return strings.HasPrefix(after, string(rest)) }
	dst := make([]bool, len(toks))
	st := s.Start()
	for i := 0; i <= len(text); i++ {
		st.Mask(dst, v)
		for id, tok := range toks {
			if want := len(tok) > 0 && st.Accepts(tok); dst[id] != want {
				t.Fatalf("Mask after %q: token %q: %v, Accepts %v", text[:i], tok, dst[id], want)
			}
		}
		st.MaskThen(dst, v, then)
		for id, tok := range toks {
			n, done, ok := st.Span(tok)
			if want := len(tok) > 0 && ok && (!done || then(tok[n:])); dst[id] != want {
				t.Fatalf("MaskThen after %q: token %q: %v, Span %d %v %v", text[:i], tok, dst[id], n, done, ok)
			}
		}
		if i < len(text) {
			require.True(t, st.Feed([]byte{text[i]}))
		}
	}
}

type obj = map[string]any

// keyPool are the property names: the walks' finishers, so that walks
// spell them.
var keyPool = []string{"a", "x", "v", "r", "id", "name"}

// patternPool are the patterns schemas take. None matches a string with
// a quote or a backslash: the machine writes such strings without
// escapes, and a wild value's "c\"d" must stay invalid there.
var patternPool = []string{`^[a-c]+$`, `^a(b|cd)*e?$`, `ab`, `^[0-9]{2,3}$`, `x|y`, `^é+$`, `^$|^a+$`, `^[a-z]*[0-9]$`,
	`^[^"\\]{2,3}$`, `^[^a"\\]*$`, `^\d+$`, `^(é|€|𝄞)+$`, `^\w{1,2}\s?$`}

var formatPool = []string{"date", "time", "date-time", "uuid", "ipv4", "ipv6", "hostname", "duration", "email"}

// formatSamples are instances of each format, valid ones and invalid
// ones. The machine holds a subset of some formats (an email's domain has
// a dot, a host name at most 8 labels of 30): the valid ones are in it.
var formatSamples = map[string][]string{
	"date":      {"2024-02-29", "1999-12-31", "2023-02-29", "2023-13-01", "20230101"},
	"time":      {"23:59:59Z", "00:00:00.5+05:30", "24:00:00Z", "12:00:00"},
	"date-time": {"2024-02-29T12:30:00Z", "1985-04-12T23:20:50.52+01:00", "2024-02-29 12:30:00Z"},
	"uuid":      {"123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000"},
	"ipv4":      {"0.0.0.0", "192.168.1.10", "256.1.1.1", "1.2.3"},
	"ipv6":      {"::1", "2001:db8::8a2e:370:7334", "1::2::3", "12345::"},
	"hostname":  {"localhost", "a-b.example.org", "-a.b", "a..b"},
	"duration":  {"P1Y2M3D", "PT1H30M", "P2W", "P1Y2D", "PT"},
	"email":     {"a@b.co", "first.last+tag@sub.example.org", "a..b@c.d", ".a@b.c"},
}

// decimal writes a number of up to frac fraction digits (the last one
// nonzero, so that an integral value is always written as an integer)
// with an integer part in [-span, span].
func decimal(r *rand.Rand, span, frac int) json.Number {
	s := strconv.Itoa(r.IntN(2*span+1) - span)
	if f := r.IntN(frac + 1); f > 0 {
		d := make([]byte, f)
		for i := range d {
			d[i] = byte('0' + r.IntN(10))
		}
		d[f-1] = byte('1' + r.IntN(9))
		if s == "0" && r.IntN(2) == 0 {
			s = "-0"
		}
		s += "." + string(d)
	}
	return json.Number(s)
}

// literal is a small JSON value for enum and const.
func literal(r *rand.Rand, depth int) any {
	switch k := r.IntN(9); {
	case k == 0:
		return nil
	case k == 1:
		return r.IntN(2) == 0
	case k <= 3:
		if r.IntN(8) == 0 {
			return json.Number([]string{"1e2", "-2.5E-1", "0.0", "10.50"}[r.IntN(4)])
		}
		return decimal(r, 20, 2*(r.IntN(3)/2))
	case k <= 6 || depth > 1:
		return []string{"", "a", "ab", "c\"d", "é", "x y", "id"}[r.IntN(7)]
	case k == 7:
		return []any{literal(r, depth+1), literal(r, depth+1)}[:r.IntN(3)]
	default:
		return obj{keyPool[r.IntN(len(keyPool))]: literal(r, depth+1)}
	}
}

// schemaMaker writes random schemas; refs are the $defs names a schema
// may refer to.
type schemaMaker struct {
	r    *rand.Rand
	refs []string
}

// randomSchema returns a random schema document.
func randomSchema(r *rand.Rand) string {
	g := &schemaMaker{r: r}
	defs := obj{}
	if r.IntN(3) == 0 {
		g.refs = []string{"A", "B"}[:1+r.IntN(2)]
		for _, name := range g.refs {
			defs[name] = g.schema(1)
		}
	}
	root := g.schema(0)
	if m, ok := root.(obj); ok && len(defs) > 0 {
		m["$defs"] = defs
	}
	b, err := json.Marshal(root)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func (g *schemaMaker) schema(depth int) any {
	r := g.r
	if depth > 0 && r.IntN(16) == 0 {
		return r.IntN(3) != 0
	}
	if depth > 0 && len(g.refs) > 0 && r.IntN(5) == 0 {
		return obj{"$ref": "#/$defs/" + g.refs[r.IntN(len(g.refs))]}
	}
	if depth > 1 && r.IntN(20) == 0 {
		return obj{"$ref": "#"} // the whole document
	}
	var s obj
	switch k := r.IntN(15); {
	case k == 0:
		s = obj{"type": "null"}
	case k == 1:
		s = obj{"type": "boolean"}
	case k <= 3:
		s = g.number()
	case k <= 5:
		s = g.str()
	case k == 6:
		l := make([]any, 1+r.IntN(4))
		for i := range l {
			l[i] = literal(r, 0)
		}
		s = obj{"enum": l}
	case k == 7:
		s = obj{"const": literal(r, 0)}
	case k <= 9 && depth < 3:
		s = g.array(depth)
	case k <= 11 && depth < 3:
		s = g.object(depth)
	case k == 12 && depth < 3:
		s = g.union(depth)
	case k == 13:
		s = g.typeList()
	default:
		s = obj{"type": "string"}
	}
	if r.IntN(8) == 0 {
		s["description"] = "d"
	}
	if depth > 0 && r.IntN(12) == 0 {
		return obj{"allOf": []any{s}}
	}
	return s
}

func (g *schemaMaker) number() obj {
	r := g.r
	s := obj{}
	switch r.IntN(6) {
	case 0: // bounds alone: other kinds pass
	case 1, 2:
		s["type"] = "integer"
	default:
		s["type"] = "number"
	}
	for _, k := range []string{"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} {
		if r.IntN(3) != 0 {
			continue
		}
		switch r.IntN(8) {
		case 0: // as many fraction digits as a bound may have
			s[k] = decimal(r, 3, 9)
		case 1: // near the largest bound
			s[k] = json.Number(strconv.FormatInt((1<<62-1)-int64(r.IntN(3)), 10))
		default:
			s[k] = decimal(r, 60, 2*(r.IntN(3)/2))
		}
	}
	return s
}

func (g *schemaMaker) str() obj {
	r := g.r
	s := obj{"type": "string"}
	switch r.IntN(5) {
	case 0:
		s["pattern"] = patternPool[r.IntN(len(patternPool))]
	case 1:
		s["format"] = formatPool[r.IntN(len(formatPool))]
		if r.IntN(2) == 0 {
			return s
		}
	}
	g.counts(s, "minLength", "maxLength", 4, 6)
	return s
}

// counts sets a lower count below lo (a third of the time) and an upper
// one up to span past it (half of the time).
func (g *schemaMaker) counts(s obj, minKey, maxKey string, lo, span int) {
	if g.r.IntN(3) == 0 {
		lo = g.r.IntN(lo)
		s[minKey] = lo
	} else {
		lo = 0
	}
	if g.r.IntN(2) == 0 {
		s[maxKey] = lo + g.r.IntN(span)
	}
}

func (g *schemaMaker) array(depth int) obj {
	r := g.r
	s := obj{"type": "array"}
	switch k := r.IntN(12); {
	case k == 0:
		s["items"] = false
	case k == 1: // draft-07's list of items
		s["items"] = []any{g.schema(depth + 1), g.schema(depth + 1)}[:1+r.IntN(2)]
		if r.IntN(2) == 0 {
			s["additionalItems"] = g.schema(depth + 1)
		}
	case k <= 3:
		l := make([]any, 1+r.IntN(4))
		for i := range l {
			l[i] = literal(r, 1)
		}
		s["items"] = obj{"enum": l}
		s["uniqueItems"] = r.IntN(3) != 0
	case k <= 9:
		s["items"] = g.schema(depth + 1)
	}
	if r.IntN(4) == 0 && s["uniqueItems"] == nil {
		s["prefixItems"] = []any{g.schema(depth + 1), g.schema(depth + 1)}[:1+r.IntN(2)]
	}
	g.counts(s, "minItems", "maxItems", 3, 4)
	return s
}

func (g *schemaMaker) object(depth int) obj {
	r := g.r
	s := obj{"type": "object"}
	props := obj{}
	var required []any
	for _, k := range keyPool {
		if r.IntN(3) == 0 {
			props[k] = g.schema(depth + 1)
			if r.IntN(2) == 0 {
				required = append(required, k)
			}
		}
	}
	if r.IntN(12) == 0 {
		required = append(required, "zz") // not a property
	}
	if len(props) > 0 || r.IntN(2) == 0 {
		s["properties"] = props
	}
	if len(required) > 0 {
		s["required"] = required
	}
	switch r.IntN(6) {
	case 0, 1:
	case 2, 3:
		s["additionalProperties"] = false
		if r.IntN(2) == 0 {
			s["minProperties"] = r.IntN(4)
		}
		if r.IntN(2) == 0 {
			s["maxProperties"] = 1 + r.IntN(3)
		}
	case 4:
		s["additionalProperties"] = true
	default:
		s["additionalProperties"] = g.schema(depth + 1)
	}
	return s
}

// union is anyOf or oneOf; its branches mostly admit different kinds.
func (g *schemaMaker) union(depth int) obj {
	r := g.r
	makers := []func() any{
		func() any { return obj{"type": "null"} },
		func() any { return obj{"type": "boolean"} },
		func() any { return g.number() },
		func() any { return g.str() },
		func() any { return g.array(depth + 1) },
		func() any { return g.object(depth + 1) },
	}
	r.Shuffle(len(makers), func(i, j int) { makers[i], makers[j] = makers[j], makers[i] })
	l := make([]any, 2+r.IntN(2))
	for i := range l {
		if r.IntN(5) == 0 {
			l[i] = g.schema(depth + 1)
		} else {
			l[i] = makers[i]()
		}
	}
	return obj{[]string{"anyOf", "oneOf"}[r.IntN(2)]: l}
}

func (g *schemaMaker) typeList() obj {
	r := g.r
	types := []string{"null", "boolean", "integer", "number", "string", "array", "object"}
	r.Shuffle(len(types), func(i, j int) { types[i], types[j] = types[j], types[i] })
	l := make([]any, 2+r.IntN(2))
	for i := range l {
		l[i] = types[i]
	}
	s := obj{"type": l}
	if r.IntN(2) == 0 {
		s["maxLength"] = r.IntN(4)
	}
	if r.IntN(2) == 0 {
		s["minimum"] = decimal(r, 10, 0)
	}
	return s
}

// valueMaker builds values for a schema, most of them meant to be valid
// and some broken; the oracle decides which are.
type valueMaker struct {
	r   *rand.Rand
	doc any
}

// wild is a random value, whatever the schema.
func (g *valueMaker) wild(depth int) any {
	r := g.r
	switch r.IntN(6) {
	case 0:
		return literal(r, 0)
	case 1:
		return decimal(r, 100, 3)
	case 2:
		return g.text(0, 6, false) // no escapes: the value may land under a pattern
	case 3:
		if depth < 3 {
			l := make([]any, r.IntN(3))
			for i := range l {
				l[i] = g.wild(depth + 1)
			}
			return l
		}
	case 4:
		if depth < 3 {
			o := obj{}
			for range r.IntN(3) {
				o[keyPool[r.IntN(len(keyPool))]] = g.wild(depth + 1)
			}
			return o
		}
	}
	return []any{nil, true, false}[r.IntN(3)]
}

// text is a random string of lo to hi characters, with escapes some
// of them written escaped.
func (g *valueMaker) text(lo, hi int, escapes bool) string {
	alphabet := []string{"a", "b", "c", "x", "é", "€", "𝄞", " ", "0", "1", ".", "-"}
	if escapes && g.r.IntN(4) == 0 {
		alphabet = append(alphabet, `"`, `\`)
	}
	var b strings.Builder
	for range lo + g.r.IntN(max(hi-lo, 0)+1) {
		b.WriteString(alphabet[g.r.IntN(len(alphabet))])
	}
	return b.String()
}

func (g *valueMaker) value(s any, depth int) any {
	r := g.r
	m, ok := s.(obj)
	if depth > 8 || !ok || r.IntN(12) == 0 {
		return g.wild(0)
	}
	if ref, ok := m["$ref"].(string); ok {
		t := g.doc
		if ref != "#" {
			for _, tok := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
				t = t.(obj)[tok]
			}
		}
		return g.value(t, depth+1)
	}
	if l, ok := m["allOf"].([]any); ok {
		return g.value(l[0], depth+1)
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if l, ok := m[k].([]any); ok {
			return g.value(l[r.IntN(len(l))], depth+1)
		}
	}
	if c, ok := m["const"]; ok {
		return c
	}
	if l, ok := m["enum"].([]any); ok {
		return l[r.IntN(len(l))]
	}
	var kind string
	switch t := m["type"].(type) {
	case string:
		kind = t
	case []any:
		kind = t[r.IntN(len(t))].(string)
	default:
		// The kind of a keyword there (sorted: the seed decides).
		for _, k := range slices.Sorted(maps.Keys(keywords)) {
			if _, ok := m[k]; ok && keywords[k] != "" {
				kind = keywords[k]
			}
		}
	}
	switch kind {
	case "null":
		return nil
	case "boolean":
		return r.IntN(2) == 0
	case "integer", "number":
		return g.number(m, kind == "integer")
	case "string":
		return g.str(m)
	case "array":
		return g.array(m, depth)
	case "object":
		return g.object(m, depth)
	}
	return g.wild(0)
}

// number is near the schema's bounds: a bound itself, one step to
// either side, or a value between them.
func (g *valueMaker) number(m obj, integer bool) any {
	r := g.r
	var bounds []*big.Rat
	for _, k := range []string{"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} {
		if b, ok := m[k].(json.Number); ok {
			x, _ := new(big.Rat).SetString(string(b))
			bounds = append(bounds, x)
		}
	}
	frac := 3
	if integer {
		frac = 0
	}
	if len(bounds) == 0 || r.IntN(4) == 0 {
		return decimal(r, 100, frac)
	}
	x := new(big.Rat).Set(bounds[r.IntN(len(bounds))])
	if integer || r.IntN(2) == 0 {
		// The integer at or next to the bound.
		q := new(big.Int).Quo(x.Num(), x.Denom())
		x.SetInt(q)
		x.Add(x, big.NewRat(int64(r.IntN(5)-2), 1))
	} else {
		// A step of 10^-k to either side: past the bound's own fraction
		// digits too.
		step := new(big.Rat).SetFrac(big.NewInt(int64(r.IntN(19)-9)), new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(1+r.IntN(12))), nil))
		x.Add(x, step)
	}
	return formatRat(x)
}

// formatRat writes x without exponent, in the fewest fraction digits.
func formatRat(x *big.Rat) json.Number {
	for digits := 0; ; digits++ {
		if s := x.FloatString(digits); digits == 12 || mustRat(s).Cmp(x) == 0 {
			return json.Number(s)
		}
	}
}

func mustRat(s string) *big.Rat {
	x, _ := new(big.Rat).SetString(s)
	return x
}

func (g *valueMaker) str(m obj) any {
	r := g.r
	_, pattern := m["pattern"]
	_, format := m["format"]
	if pattern && r.IntN(4) != 0 {
		alphabet := []string{"a", "b", "c", "d", "e", "x", "y", "é", "€", "𝄞", " ", "0", "1", "9"}
		var b strings.Builder
		for range r.IntN(6) {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	if format && r.IntN(6) != 0 {
		l := formatSamples[m["format"].(string)]
		v := l[r.IntN(len(l))]
		if r.IntN(3) == 0 { // near a length bound
			v = v[:len(v)-r.IntN(min(len(v), 3))]
		}
		return v
	}
	lo := max(countOf(m, "minLength", 0)-1, 0)
	hi := countOf(m, "maxLength", 5) + 1
	// Under a pattern or a format the machine writes no escapes.
	return g.text(lo, max(hi, lo), !pattern && !format)
}

func countOf(m obj, k string, or int) int {
	if v, ok := m[k].(json.Number); ok {
		n, _ := v.Int64()
		return int(n)
	}
	return or
}

func (g *valueMaker) array(m obj, depth int) any {
	r := g.r
	lo, hi := countOf(m, "minItems", 0), countOf(m, "maxItems", 4)
	n := max(lo-1+r.IntN(hi-lo+3), 0)
	n = min(n, 5)
	prefix, _ := m["prefixItems"].([]any)
	rest, hasRest := m["items"]
	if l, ok := rest.([]any); ok {
		prefix = l
		rest, hasRest = m["additionalItems"]
	}
	a := make([]any, n)
	for i := range a {
		switch {
		case i < len(prefix):
			a[i] = g.value(prefix[i], depth+1)
		case hasRest:
			a[i] = g.value(rest, depth+1)
		default:
			a[i] = g.wild(1)
		}
	}
	return a
}

func (g *valueMaker) object(m obj, depth int) any {
	r := g.r
	props, _ := m["properties"].(obj)
	o := obj{}
	required := map[string]bool{}
	if l, ok := m["required"].([]any); ok {
		for _, k := range l {
			required[k.(string)] = true
		}
	}
	for _, k := range slices.Sorted(maps.Keys(props)) {
		if required[k] && r.IntN(12) != 0 || r.IntN(2) == 0 {
			o[k] = g.value(props[k], depth+1)
		}
	}
	if required["zz"] && r.IntN(2) == 0 {
		o["zz"] = g.wild(1)
	}
	for range r.IntN(3) {
		if r.IntN(2) == 0 {
			continue
		}
		k := []string{"q", "ab", "é", "a b", "zz"}[r.IntN(5)]
		if a, ok := m["additionalProperties"]; ok && r.IntN(4) != 0 {
			o[k] = g.value(a, depth+1)
		} else {
			o[k] = g.wild(1)
		}
	}
	return o
}

// encodeValue writes v compactly, keys sorted (as encoding/json writes
// an enum's values), numbers in their shortest form without exponent
// (as the machine writes an enum's, 1e2 as 100).
func encodeValue(v any) string {
	var b strings.Builder
	var write func(v any)
	write = func(v any) {
		switch v := v.(type) {
		case obj:
			b.WriteByte('{')
			for i, k := range slices.Sorted(maps.Keys(v)) {
				if i > 0 {
					b.WriteByte(',')
				}
				write(k)
				b.WriteByte(':')
				write(v[k])
			}
			b.WriteByte('}')
		case []any:
			b.WriteByte('[')
			for i, e := range v {
				if i > 0 {
					b.WriteByte(',')
				}
				write(e)
			}
			b.WriteByte(']')
		case json.Number:
			b.WriteString(string(formatRat(mustRat(string(v)))))
		default:
			e, err := json.Marshal(v)
			if err != nil {
				panic(fmt.Sprint(v, err))
			}
			b.Write(e)
		}
	}
	write(v)
	return b.String()
}
