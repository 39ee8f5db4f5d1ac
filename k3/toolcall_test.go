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
	for _, at := range []string{
		"<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Par",
		"<|tool_calls_section_begin|><|tool_call_begin|>functions.",
	} {
		c := &toolConstraint{names: []string{"get_weather", "get_time"}, toks: toks, special: make([]bool, len(toks)),
			plain: jsonschema.Plain(toks), mask: make([]bool, len(toks))}
		c.st.enter(pSectionBegin, false)
		if !c.run(&c.st, []byte(at), false, true) {
			b.Fatal(at)
		}
		name := "name"
		if strings.HasSuffix(at, "Par") {
			name = "arguments"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				c.fill()
			}
		})
	}
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
	for _, parallel := range []bool{false, true} {
		for cut := 0; cut <= len(prefix); cut++ {
			c := &toolConstraint{names: []string{"get_weather", "get_time", "get"}, parallel: parallel, toks: toks, special: special,
				plain: jsonschema.Plain(toks), stops: []int32{int32(len(toks) - 1)}, mask: make([]bool, len(toks))}
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
	weather, err := CompileJSONSchema([]byte(`{"type":"object","additionalProperties":false,"required":["city"],
		"properties":{"city":{"type":"string","maxLength":10},"days":{"type":"integer"}}}`))
	require.NoError(t, err)
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
