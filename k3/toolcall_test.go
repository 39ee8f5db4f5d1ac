package k3

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/internal/jsonschema"
)

var callRE = regexp.MustCompile(`^<\|tool_call_begin\|>functions\.(get_weather|get):[0-9]+<\|tool_call_argument_begin\|>`)

// TestToolCalls: the embedded model held to a tool calls section: a
// stopped generation is a whole section of calls to the given names with
// JSON object arguments (one call unless parallel), a cut one a prefix.
func TestToolCalls(t *testing.T) {
	if raceEnabled {
		t.Skip("one goroutine's grammar work, minutes of masks under the race detector; the serve tests run constrained requests under it")
	}
	ctx := context.Background()
	m, err := LoadTiny(ctx)
	require.NoError(t, err)
	defer m.Close()
	prompt := m.Encode(m.ChatPrompt([]Message{{Role: "user", Content: "func main() {"}}))
	names := []string{"get_weather", "get"}
	whole := 0
	for i, tc := range []struct {
		parallel bool
		opts     []GenerateOption
	}{
		{false, []GenerateOption{WithTemperature(0)}},
		{false, []GenerateOption{WithTemperature(1), WithSeed(1)}},
		{true, []GenerateOption{WithTemperature(1), WithSeed(2)}},
		{true, []GenerateOption{WithTemperature(1.5), WithSeed(3), WithoutDefaultStops()}},
		{false, []GenerateOption{WithTemperature(0.7), WithSeed(4)}},
	} {
		out, finish, _ := heldGeneration(t, m, prompt, append(tc.opts, WithToolCalls(names, tc.parallel), WithMaxTokens(300))...)
		t.Logf("case %d (%v): %q", i, finish, out)
		rest, ok := strings.CutPrefix(out, "<|tool_calls_section_begin|>")
		if !ok {
			require.True(t, strings.HasPrefix("<|tool_calls_section_begin|>", out), "case %d: %q", i, out)
			continue
		}
		calls := 0
		for {
			if rest == "<|tool_calls_section_end|>" {
				break
			}
			loc := callRE.FindStringIndex(rest)
			if loc == nil {
				require.Equal(t, FinishLength, finish, "case %d: %q", i, out)
				break
			}
			args, after, found := strings.Cut(rest[loc[1]:], "<|tool_call_end|>")
			if !found {
				require.Equal(t, FinishLength, finish, "case %d: %q", i, out)
				break
			}
			var v map[string]any
			require.NoError(t, json.Unmarshal([]byte(args), &v), "case %d: arguments %q", i, args)
			calls++
			rest = after
		}
		if finish == FinishStop {
			whole++
			assert.Equal(t, "<|tool_calls_section_end|>", rest, "case %d", i)
			assert.Positive(t, calls)
			if !tc.parallel {
				assert.Equal(t, 1, calls, "case %d", i)
			}
		}
	}
	assert.Positive(t, whole, "no generation closed its section within 300 tokens")

	s, err := m.NewSession()
	require.NoError(t, err)
	defer s.Close()
	for _, bad := range [][]GenerateOption{
		{WithToolCalls(nil, false)},
		{WithToolCalls([]string{"a:b"}, false)},
		{WithToolCalls([]string{"f"}, false), WithJSONObject()},
	} {
		for _, err := range s.GenerateTokens(ctx, prompt, bad...) {
			assert.ErrorIs(t, err, ErrInvalidOption)
			break
		}
	}
}

// TestToolCallGrammar: the section's grammar on written-out text, byte by
// byte through ordinary tokens and marker by marker as special tokens.
func TestToolCallGrammar(t *testing.T) {
	const (
		begin = "<|tool_calls_section_begin|>"
		call  = "<|tool_call_begin|>"
		args  = "<|tool_call_argument_begin|>"
		end   = "<|tool_call_end|>"
		close = "<|tool_calls_section_end|>"
	)
	names := []string{"get_weather", "get"}
	one := call + "functions.get:0" + args + `{"a": [1, "x"]}` + end
	two := call + "functions.get_weather:12" + args + "{}" + end
	for _, tc := range []struct {
		text     string
		parallel bool
		ok, done bool
	}{
		{begin + one + close, false, true, true},
		{begin + one + two + close, true, true, true},
		{begin + one + two, false, false, false},
		{begin + one, false, true, false},
		{begin + call + "functions.ge:0", false, false, false},
		{begin + call + "functions.get_w:0", false, false, false},
		{begin + call + "functions.set:0", false, false, false},
		{begin + call + "functions.get:1234", false, false, false},
		{begin + call + "functions.get:" + args, false, false, false},
		{begin + call + "functions.get:7" + args + "[1]", false, false, false},
		{begin + call + "functions.get:7" + args + `{"a":1` + end, false, false, false},
		{begin + one + close + " ", false, false, false},
		{"x" + begin, false, false, false},
	} {
		c := &toolConstraint{names: names, parallel: tc.parallel}
		c.st.enter(pSectionBegin, tc.parallel)
		st := c.st
		ok := c.run(&st, []byte(tc.text), false, true)
		assert.Equal(t, tc.ok, ok, "%q", tc.text)
		if ok {
			assert.Equal(t, tc.done, st.phase == pDone, "%q", tc.text)
		}
		// A trial (commit false) answers the same and leaves the state.
		trial := c.st
		assert.Equal(t, tc.ok, c.run(&trial, []byte(tc.text), false, false), "trial %q", tc.text)
	}

	// Markers as special tokens: whole, and only where a marker begins.
	c := &toolConstraint{names: names}
	c.st.enter(pSectionBegin, false)
	for _, step := range []struct {
		b       string
		special bool
		ok      bool
	}{
		{"functions.", false, false}, {begin, true, true}, {call, true, true}, {"functions.get", false, true},
		{end, true, false}, {":3", false, true}, {args, true, true}, {"{\"a\":", false, true}, {end, true, false},
		{"1}", false, true}, {begin, true, false}, {end, true, true}, {call, true, false}, {close, true, true},
	} {
		trial := c.st
		ok := c.run(&trial, []byte(step.b), step.special, false)
		require.Equal(t, step.ok, ok, "%q (special %v) at phase %d", step.b, step.special, c.st.phase)
		if ok {
			require.True(t, c.run(&c.st, []byte(step.b), step.special, true))
		}
	}
	assert.Equal(t, pDone, c.st.phase)
}

// BenchmarkToolCallMask: one forced-call mask over a vocabulary the size
// of Kimi's (163,840 tokens of 1-8 printable bytes), inside the
// arguments' strings and at the function's name.
func BenchmarkToolCallMask(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	toks := make([][]byte, 163840)
	for i := range toks {
		t := make([]byte, 1+r.IntN(8))
		for j := range t {
			t[j] = byte(' ' + r.IntN(95))
		}
		toks[i] = t
	}
	for _, at := range []struct{ name, text string }{
		{"arguments", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Par"},
		{"name", "<|tool_calls_section_begin|><|tool_call_begin|>functions."},
		{"text", "x := 1"},                         // WithOptionalToolCalls before the section
		{"marker", "x := 1 <|tool_calls_section_"}, // and inside its marker
	} {
		c := maskedToolConstraint([]string{"get_weather", "get_time"}, false, newGrammarTables(toks, make([]bool, len(toks))))
		c.st.enter(pSectionBegin, false)
		if !strings.HasPrefix(at.text, "<|") {
			c.st.enter(pText, false)
			c.text, c.textTrial, c.textEnd = textTables(c.toks, c.special)
		}
		if !c.run(&c.st, []byte(at.text), false, true) {
			b.Fatal(at)
		}
		b.Run(at.name, func(b *testing.B) {
			for b.Loop() {
				c.fill()
			}
		})
	}
}

// maskedToolConstraint is a tool calls constraint over g's vocabulary,
// made without a model.
func maskedToolConstraint(names []string, parallel bool, g *grammarTables) *toolConstraint {
	c := &toolConstraint{names: names, parallel: parallel, toks: g.toks, special: g.special, specials: g.specials, vocab: g.vocab,
		mask: make([]bool, len(g.toks))}
	c.afterArgs, c.takes = c.argsEnd, c.takesFromHere
	return c
}

// TestToolCallMask: the mask's shortcuts give what running the grammar on
// every token gives, at every phase of a section.
func TestToolCallMask(t *testing.T) {
	if raceEnabled {
		t.Skip("one goroutine's grammar work, minutes of masks under the race detector; the serve tests run constrained requests under it")
	}
	r := rand.New(rand.NewPCG(7, 8))
	const alphabet = "{}[]:,\" \\nu0123456789abcdeftrulsn.-_<|>getwhrfio\t\n\x01\xc3\xa9"
	toks := [][]byte{nil}
	special := []bool{false}
	for _, marker := range []string{"<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|tool_calls_section_end|>", "<|im_end|>"} {
		toks, special = append(toks, []byte(marker)), append(special, true)
		toks, special = append(toks, []byte(marker)), append(special, false) // spelled as text
	}
	for _, w := range []string{"functions.", "get", "_weather", "get_time", ":0", "0<|", "}<|tool_call_end|>", "\"}", "functions.get:1"} {
		toks, special = append(toks, []byte(w)), append(special, false)
	}
	for range 2000 {
		b := make([]byte, 1+r.IntN(5))
		for j := range b {
			b[j] = alphabet[r.IntN(len(alphabet))]
		}
		toks, special = append(toks, b), append(special, false)
	}
	prefix := "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:12<|tool_call_argument_begin|>{\"a\": [1, \"x\\u00e9y\"], \"b\": {}}<|tool_call_end|><|tool_calls_section_end|>"
	args, err := CompileJSONSchema([]byte(`{"type":"object","properties":{"a":{"type":"array","items":{"type":["integer","string"]}},"b":{"type":"object"}},"additionalProperties":false}`))
	require.NoError(t, err)
	g := newGrammarTables(toks, special)
	for _, parallel := range []bool{false, true} {
		for cut := 0; cut <= len(prefix); cut++ {
			c := maskedToolConstraint([]string{"get_weather", "get_time", "get"}, parallel, g)
			c.stops = []int32{int32(len(toks) - 1)}
			if parallel { // the arguments held to a schema
				c.schemas = []*jsonschema.Schema{args.s, nil, nil}
			}
			c.enter(&c.st, pSectionBegin)
			require.True(t, c.run(&c.st, []byte(prefix[:cut]), false, true), "%q", prefix[:cut])
			c.fill()
			done := c.st.phase == pDone
			for id, b := range toks {
				want := false
				if slices.Contains(c.stops, int32(id)) {
					want = done
				} else if !done && len(b) > 0 {
					trial := c.st
					want = c.run(&trial, b, special[id], false)
				}
				require.Equal(t, want, c.mask[id], "after %q, token %q (special %v)", prefix[:cut], b, special[id])
			}
			if cut == len(prefix)/2 {
				assert.Zero(t, testing.AllocsPerRun(5, c.fill), "a mask allocates")
			}
		}
	}
}

// weatherSchema is get_weather's parameters: a city of at most 10
// characters and an optional integer of days, nothing else.
func weatherSchema(t *testing.T) *JSONSchema {
	t.Helper()
	s, err := CompileJSONSchema([]byte(`{"type":"object","additionalProperties":false,"required":["city"],
		"properties":{"city":{"type":"string","maxLength":10},"days":{"type":"integer"}}}`))
	require.NoError(t, err)
	return s
}

// TestToolArguments: with WithToolArguments each call's arguments are an
// object of its function's schema (read back by Go types with unknown
// fields refused), each its own.
func TestToolArguments(t *testing.T) {
	if raceEnabled {
		t.Skip("one goroutine's grammar work, minutes of masks under the race detector; the serve tests run constrained requests under it")
	}
	ctx := context.Background()
	m, err := LoadTiny(ctx)
	require.NoError(t, err)
	defer m.Close()
	weather := weatherSchema(t)
	get, err := CompileJSONSchema([]byte(`{"type":"object","properties":{"q":{"const":1}},"required":["q"],"additionalProperties":false}`))
	require.NoError(t, err)
	prompt := m.Encode(m.ChatPrompt([]Message{{Role: "user", Content: "func main() {"}}))
	names := []string{"get_weather", "get"}
	checked := map[string]int{}
	for seed := range uint64(8) {
		out, _, _ := heldGeneration(t, m, prompt, WithTemperature(1), WithSeed(seed), WithMaxTokens(300),
			WithToolCalls(names, true), WithToolArguments(map[string]*JSONSchema{"get_weather": weather, "get": get}))
		rest := strings.TrimPrefix(out, "<|tool_calls_section_begin|>")
		for {
			loc := callRE.FindStringSubmatchIndex(rest)
			if loc == nil {
				break
			}
			name := rest[loc[2]:loc[3]]
			args, after, found := strings.Cut(rest[loc[1]:], "<|tool_call_end|>")
			if !found {
				break
			}
			rest = after
			checked[name]++
			if name == "get" {
				assert.JSONEq(t, `{"q":1}`, args, "seed %d", seed)
				continue
			}
			d := json.NewDecoder(strings.NewReader(args))
			d.DisallowUnknownFields()
			var v struct {
				City *string
				Days *int64
			}
			require.NoError(t, d.Decode(&v), "seed %d: %q", seed, args)
			require.NotNil(t, v.City, args)
			assert.LessOrEqual(t, len([]rune(*v.City)), 10, args)
		}
	}
	assert.Positive(t, checked["get_weather"], "no whole call to get_weather in 8 generations")
	assert.Positive(t, checked["get"], "no whole call to get in 8 generations")

	s, err := m.NewSession()
	require.NoError(t, err)
	defer s.Close()
	str, err := CompileJSONSchema([]byte(`{"type":"string"}`))
	require.NoError(t, err)
	for _, opts := range [][]GenerateOption{
		{WithToolArguments(map[string]*JSONSchema{"get": weather})},
		{WithToolCalls(names, false), WithToolArguments(map[string]*JSONSchema{"other": weather})},
		{WithToolCalls(names, false), WithToolArguments(map[string]*JSONSchema{"get": str})},
		{WithToolCalls(names, false), WithToolArguments(map[string]*JSONSchema{"get": nil})},
	} {
		_, err := genText(ctx, s, prompt, opts...)
		assert.ErrorIs(t, err, ErrInvalidOption)
	}
}

// TestOptionalToolCalls: with tool_choice auto's option any text may
// come (stop tokens too, the section's inner markers never as special
// tokens) until the text spells the section's marker, as a special token
// or in ordinary ones; from there the mask is bitwise that of a forced
// section read to the same point, along random walks. Until then a
// generation is bitwise the unheld one.
func TestOptionalToolCalls(t *testing.T) {
	if raceEnabled {
		t.Skip("one goroutine's grammar work (as TestToolCalls)")
	}
	ctx := context.Background()
	m, err := LoadTiny(ctx)
	require.NoError(t, err)
	defer m.Close()
	weather := weatherSchema(t)
	obj, err := weather.s.Objects()
	require.NoError(t, err)
	names := []string{"get_weather", "get"}
	schemas, err := argSchemas(names, map[string]*jsonschema.Schema{"get_weather": obj})
	require.NoError(t, err)
	o, err := m.genOptions(nil)
	require.NoError(t, err)
	const marker = "<|tool_calls_section_begin|>"
	enter := m.Encode(marker) // ordinary tokens in the tiny model's vocabulary
	require.Greater(t, len(enter), 1)
	r := rand.New(rand.NewPCG(9, 9))
	for walk := range 6 {
		opt := newToolConstraint(m, names, schemas, walk%2 == 0, true, o.stopTokens)
		forced := newToolConstraint(m, names, schemas, walk%2 == 0, false, o.stopTokens)
		// Text first, partial markers among it.
		for _, text := range []string{"x := 1", "<|tool_calls", " a <", "|tool_calls_section_begin|", "b", "<"} {
			opt.fill()
			for _, id := range o.stopTokens {
				require.True(t, opt.mask[id])
			}
			for id, b := range opt.toks {
				if len(b) > 0 && !opt.special[id] && !strings.Contains(string(b), "<") && opt.st.off == 0 {
					require.True(t, opt.mask[id], "token %q", b)
				}
			}
			for _, id := range m.Encode(text) {
				require.True(t, opt.mask[id], "%q after %q", opt.toks[id], text)
				require.False(t, opt.closed(id))
			}
			require.Equal(t, pText, opt.st.phase, "after %q", text)
		}
		for _, id := range enter {
			opt.fill()
			forced.fill()
			require.True(t, opt.mask[id])
			require.False(t, opt.closed(id))
			require.False(t, forced.closed(id))
		}
		require.Equal(t, pCallBegin, opt.st.phase)
		for step := 0; step < 200 && forced.st.phase != pDone; step++ {
			opt.fill()
			forced.fill()
			require.Equal(t, forced.mask, opt.mask, "walk %d step %d", walk, step)
			var allowed []int32
			for id, ok := range forced.mask {
				if ok {
					allowed = append(allowed, int32(id))
				}
			}
			require.NotEmpty(t, allowed)
			id := allowed[r.IntN(len(allowed))]
			require.Equal(t, forced.closed(id), opt.closed(id))
		}
	}
	// A token that completes the marker must go on as the section does:
	// the mask says so token by token.
	opt := newToolConstraint(m, names, schemas, true, true, o.stopTokens)
	for _, ch := range marker[:len(marker)-1] {
		require.False(t, opt.closed(m.Encode(string(ch))[0]))
	}
	// The tiny vocabulary has no token that completes the marker and goes
	// on; three are written in.
	opt.toks = slices.Clone(opt.toks)
	opt.toks[200], opt.toks[201], opt.toks[202] = []byte(">x"), []byte("><|tool_call_begin|>"), []byte("x")
	opt.text, opt.textTrial, opt.textEnd = textTables(opt.toks, opt.special)
	opt.fill()
	for id, b := range opt.toks {
		if len(b) == 0 || opt.special[id] {
			continue
		}
		trial := opt.st
		require.Equal(t, opt.run(&trial, b, false, false), opt.mask[id], "token %q", b)
	}
	require.Equal(t, []bool{false, true, true}, opt.mask[200:203])
	trial := opt.st
	assert.True(t, opt.run(&trial, []byte(">"), false, false))
	trial = opt.st
	assert.False(t, opt.run(&trial, []byte(">x"), false, false))
	trial = opt.st
	assert.True(t, opt.run(&trial, []byte("><|tool_call_begin|>functions.get"), false, false))
	// Where the markers are special tokens, the section's begins it and
	// its inner ones are not drawn in text.
	sp := newToolConstraint(m, names, schemas, true, true, o.stopTokens)
	sp.toks, sp.special = slices.Clone(sp.toks), slices.Clone(sp.special)
	sp.toks[200], sp.toks[201] = []byte(marker), []byte("<|tool_call_begin|>")
	sp.special[200], sp.special[201] = true, true
	sp.toks[202] = []byte("x" + marker + "<|tool_call_begin|>") // ordinary, the whole marker inside
	sp.toks[203] = []byte("x" + marker + "zz")                  // and a section that cannot go on
	sp.text, sp.textTrial, sp.textEnd = textTables(sp.toks, sp.special)
	g := newGrammarTables(sp.toks, sp.special) // the edited vocabulary's trie and special tokens
	sp.vocab, sp.specials = g.vocab, g.specials
	// The text mask's shortcut (copied, the marker's holders tried) is
	// the mask without it.
	sp.fill()
	fast := slices.Clone(sp.mask)
	sp.text = nil
	sp.fill()
	require.Equal(t, sp.mask, fast)
	require.Equal(t, []bool{true, false}, fast[202:204])
	sp.fill()
	require.Equal(t, []bool{true, false}, sp.mask[200:202])
	require.False(t, sp.closed(200))
	require.Equal(t, pCallBegin, sp.st.phase)
	sp.fill()
	require.Equal(t, []bool{false, true}, sp.mask[200:202])

	prompt := m.Encode(m.ChatPrompt([]Message{{Role: "user", Content: "func main() {"}}))
	for seed := range uint64(4) {
		opts := []GenerateOption{WithTemperature(1), WithSeed(seed), WithMaxTokens(60)}
		free, _, _ := heldGeneration(t, m, prompt, opts...)
		require.NotContains(t, free, marker)
		held, _, _ := heldGeneration(t, m, prompt, append(opts, WithOptionalToolCalls(names, true),
			WithToolArguments(map[string]*JSONSchema{"get_weather": weather}))...)
		assert.Equal(t, free, held, "seed %d", seed)
	}
}
