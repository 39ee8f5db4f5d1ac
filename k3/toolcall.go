package k3

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"k3/internal/jsonschema"
)

// WithToolCalls holds the generation to a Kimi tool calls section that
// calls one of names (at least one call; more only if parallel), each
// with a JSON object of arguments:
//
//	<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|>
//
// then only the stop tokens (with none, the generation ends there). It
// is what an OpenAI tool_choice of "required" or of a named function
// asks. Special tokens are drawn only as the section's markers; the JSON
// is held as WithJSONObject holds it. max_tokens may still cut the
// section short. A generation held this way may speculate, as
// WithJSONObject's.
func WithToolCalls(names []string, parallel bool) GenerateOption {
	return func(o *genOptions) {
		if len(names) == 0 {
			o.fail("tool calls without a function name")
			return
		}
		for _, n := range names {
			if n == "" || strings.ContainsAny(n, ":<") {
				o.fail("tool call function name %q: want a non-empty name without ':' or '<'", n)
				return
			}
		}
		o.toolNames, o.parallel = slices.Clone(names), parallel
	}
}

// WithOptionalToolCalls lets the generation answer in text or call
// tools, as an OpenAI tool_choice of "auto" does, and holds the calls if
// it makes them: any token may be drawn (the section's inner markers
// aside) until the model draws <|tool_calls_section_begin|>; from there
// the section is held as WithToolCalls holds it (names, parallel,
// WithToolArguments), then only the stop tokens. A generation held this
// way may speculate, as WithJSONObject's.
func WithOptionalToolCalls(names []string, parallel bool) GenerateOption {
	return func(o *genOptions) {
		WithToolCalls(names, parallel)(o)
		o.toolText = true
	}
}

// WithToolArguments holds the arguments of a call (WithToolCalls,
// WithOptionalToolCalls) to a function named in schemas to a JSON object
// its schema admits, as WithJSONSchema holds a generation; a function
// without a schema takes any JSON object. Every name must be one those
// options list.
func WithToolArguments(schemas map[string]*JSONSchema) GenerateOption {
	return func(o *genOptions) {
		o.toolArgs = make(map[string]*jsonschema.Schema, len(schemas))
		for name, s := range schemas {
			if s == nil {
				o.fail("tool arguments of %q: nil schema", name)
				return
			}
			obj, err := s.s.Objects()
			if err != nil {
				o.fail("tool arguments of %q: %v", name, err)
				return
			}
			o.toolArgs[name] = obj
		}
	}
}

// argSchemas lines the argument schemas up with names (nil: any object).
func argSchemas(names []string, schemas map[string]*jsonschema.Schema) ([]*jsonschema.Schema, error) {
	if len(schemas) == 0 {
		return nil, nil
	}
	out := make([]*jsonschema.Schema, len(names))
	for name, s := range schemas {
		i := slices.Index(names, name)
		if i < 0 {
			return nil, fmt.Errorf("%w: WithToolArguments names %q, which WithToolCalls does not list", ErrInvalidOption, name)
		}
		out[i] = s
	}
	return out, nil
}

// maxIndexDigits bounds a call's INDEX (a count of calls, written as
// the model's template writes it).
const maxIndexDigits = 3

// The section's phases, in order.
type callPhase uint8

const (
	pText callPhase = iota // WithOptionalToolCalls: text before any section
	pSectionBegin
	pCallBegin
	pFunctions
	pName
	pIndex
	pArgBegin
	pArgs
	pCallEnd
	pNext // another call, or the section's end
	pDone
)

// sectionBegin opens a tool calls section.
const sectionBegin = "<|tool_calls_section_begin|>"

type alt struct {
	lit  string
	next callPhase
}

// alts are the literals each phase may read (pNext's second only when
// calls are parallel).
var alts = [...][]alt{
	pSectionBegin: {{sectionBegin, pCallBegin}},
	pCallBegin:    {{"<|tool_call_begin|>", pFunctions}},
	pFunctions:    {{"functions.", pName}},
	pArgBegin:     {{"<|tool_call_argument_begin|>", pArgs}},
	pCallEnd:      {{"<|tool_call_end|>", pNext}},
	pNext:         {{"<|tool_calls_section_end|>", pDone}, {"<|tool_call_begin|>", pFunctions}},
}

// callState is the section read so far.
type callState struct {
	phase  callPhase
	alive  uint8            // the phase's literals still matching (bits)
	off    int              // bytes of them matched
	ni, nl int              // pName: a name matching so far, and the bytes matched
	fn     int              // the function called (an index of names), from pIndex on
	digits int              // pIndex: digits read
	args   jsonschema.State // the arguments, read against the function's schema
}

// toolConstraint is a generation's tool calls state and the mask its
// sampler reads.
type toolConstraint struct {
	names     []string
	schemas   []*jsonschema.Schema // per name; nil: any JSON object
	parallel  bool
	st        callState
	toks      [][]byte // every token's bytes, special tokens' their names
	special   []bool
	specials  []int32 // the special tokens with bytes
	vocab     *jsonschema.Vocab
	afterArgs func([]byte) bool // the bytes after the arguments in a token (mask's)
	takes     func([]byte) bool // whether the section takes bytes from here (Vocab.Select's)
	text      []bool            // WithOptionalToolCalls: the mask in text that ends in no part of the marker
	textTrial []int32           // the tokens that mask leaves to a trial
	textEnd   []int32           // the ordinary tokens holding the marker's last byte
	stops     []int32
	mask      []bool
}

func newToolConstraint(m *Model, names []string, schemas []*jsonschema.Schema, parallel, text bool, stops []int32) *toolConstraint {
	g := m.grammar()
	c := &toolConstraint{names: names, schemas: schemas, parallel: parallel, stops: stops, mask: make([]bool, m.Config.VocabSize),
		toks: g.toks, special: g.special, specials: g.specials, vocab: g.vocab}
	c.afterArgs, c.takes = c.argsEnd, c.takesFromHere
	c.enter(&c.st, pSectionBegin)
	if text {
		c.enter(&c.st, pText)
		c.text, c.textTrial, c.textEnd = m.toolTextTables()
	}
	return c
}

// toolTextTables returns, made once a model, the mask of free text when
// the text ends in no part of the section's marker (every token but
// empty ones, the section's inner markers and ordinary tokens holding
// the whole marker), those last tokens, which fill tries, and the
// ordinary tokens holding the marker's last byte, which fill tries when
// the text ends in part of the marker.
func (m *Model) toolTextTables() (mask []bool, trial, end []int32) {
	m.toolTextOnce.Do(func() {
		g := m.grammar()
		m.toolText, m.toolTextTrial, m.toolTextEnd = textTables(g.toks, g.special)
	})
	return m.toolText, m.toolTextTrial, m.toolTextEnd
}

func textTables(toks [][]byte, special []bool) (mask []bool, trial, end []int32) {
	lit := []byte(sectionBegin)
	mask = make([]bool, len(toks))
	for id, b := range toks {
		switch {
		case len(b) == 0:
		case special[id]:
			mask[id] = bytes.Equal(b, lit) || !marker(b)
		case bytes.Contains(b, lit):
			trial = append(trial, int32(id))
		default:
			mask[id] = true
		}
		if !special[id] && bytes.IndexByte(b, lit[len(lit)-1]) >= 0 {
			end = append(end, int32(id))
		}
	}
	return mask, trial, end
}

// marker reports whether b is one of the section's markers.
func marker(b []byte) bool {
	for _, l := range alts {
		for _, a := range l {
			if string(b) == a.lit && a.lit[0] == '<' {
				return true
			}
		}
	}
	return false
}

// enter starts phase p; the arguments take the called function's schema
// (any JSON object without one).
func (c *toolConstraint) enter(s *callState, p callPhase) {
	s.enter(p, c.parallel)
	if p == pArgs {
		schema := jsonschema.Object()
		if c.schemas != nil && c.schemas[s.fn] != nil {
			schema = c.schemas[s.fn]
		}
		s.args = schema.Start()
	}
}

func (s *callState) enter(p callPhase, parallel bool) {
	s.phase, s.off, s.nl, s.digits = p, 0, 0, 0
	s.alive = 1
	if p == pNext && parallel {
		s.alive = 3
	}
}

// run takes b over s and reports whether the section may read it. A
// special token must be one whole marker where a marker begins. With
// commit false s.args is only read (a trial); s's other fields are
// always a value the caller may throw away.
func (c *toolConstraint) run(s *callState, b []byte, special, commit bool) bool {
	if s.phase == pText {
		const lit = sectionBegin
		switch {
		case special && string(b) == lit:
			c.enter(s, pCallBegin)
			return true
		case special:
			s.off = 0
			return !marker(b) // the section's inner markers only inside it
		}
		// The marker may also come as ordinary bytes (a tokenizer without
		// it as a special token): off is how much of it the text ends
		// with. '<' begins it and appears in it once, so a mismatch
		// restarts the match at '<' or not at all.
		for i, ch := range b {
			switch {
			case lit[s.off] == ch:
				s.off++
			case ch == '<':
				s.off = 1
			default:
				s.off = 0
			}
			if s.off == len(lit) {
				c.enter(s, pCallBegin)
				return c.run(s, b[i+1:], false, commit)
			}
		}
		return true
	}
	if special {
		if s.phase >= pDone || s.phase == pName || s.phase == pIndex && s.digits == 0 || s.phase == pArgs || s.off != 0 {
			return false
		}
		if s.phase == pIndex {
			c.enter(s, pArgBegin)
		}
		for i, a := range alts[s.phase] {
			if s.alive&(1<<i) != 0 && string(b) == a.lit {
				c.enter(s, a.next)
				return true
			}
		}
		return false
	}
	for i := 0; i < len(b); i++ {
		ch := b[i]
		switch s.phase {
		case pDone:
			return false
		case pName:
			if ch == ':' {
				fn := -1
				if s.nl > 0 {
					fn = slices.Index(c.names, c.names[s.ni][:s.nl])
				}
				if fn < 0 {
					return false
				}
				s.fn = fn
				c.enter(s, pIndex)
				continue
			}
			found := false
			for j, n := range c.names {
				if len(n) > s.nl && n[:s.nl] == c.names[s.ni][:s.nl] && n[s.nl] == ch {
					s.ni, s.nl, found = j, s.nl+1, true
					break
				}
			}
			if !found {
				return false
			}
		case pIndex:
			if ch >= '0' && ch <= '9' && s.digits < maxIndexDigits {
				s.digits++
				continue
			}
			if s.digits == 0 {
				return false
			}
			c.enter(s, pArgBegin)
			i-- // the byte begins the marker
		case pArgs:
			n, closed, ok := s.args.Span(b[i:])
			if !ok {
				return false
			}
			if commit {
				s.args.Feed(b[i : i+n])
			}
			if !closed {
				return true
			}
			c.enter(s, pCallEnd)
			i += n - 1
		default: // a literal
			var keep uint8
			for k, a := range alts[s.phase] {
				if s.alive&(1<<k) != 0 && a.lit[s.off] == ch {
					keep |= 1 << k
				}
			}
			if keep == 0 {
				return false
			}
			s.alive, s.off = keep, s.off+1
			for k, a := range alts[s.phase] {
				if keep&(1<<k) != 0 && s.off == len(a.lit) {
					c.enter(s, a.next)
					break
				}
			}
		}
	}
	return true
}

// takesFromHere reports whether the section takes ordinary bytes b from
// its state, without moving it.
func (c *toolConstraint) takesFromHere(b []byte) bool {
	trial := c.st
	return c.run(&trial, b, false, false)
}

// argsEnd reports whether b may follow a call's arguments in a token.
func (c *toolConstraint) argsEnd(b []byte) bool {
	var s callState
	c.enter(&s, pCallEnd)
	return c.run(&s, b, false, false)
}

// fill sets the mask for the next draw. Inside the arguments an ordinary
// token is in where the JSON machine takes it, the bytes after the object
// read as the call's end (jsonschema.State.MaskThen); a special token
// cannot follow. In free text the tables made once a model give the mask
// but for the tokens that may complete the marker. Elsewhere in the
// section the vocabulary's trie selects the ordinary tokens
// (jsonschema.Vocab.Select).
func (c *toolConstraint) fill() {
	if c.st.phase == pArgs {
		c.st.args.MaskThen(c.mask, c.vocab, c.afterArgs) // special tokens are empty there: out
		for _, id := range c.stops {
			c.mask[id] = false
		}
		return
	}
	if c.st.phase == pText && c.text != nil {
		// An ordinary token in text is in unless it completes the marker
		// and what follows it in the token cannot begin the section:
		// with no part of the marker read only a token holding all of it
		// can complete it, with part of it only one holding its last byte.
		copy(c.mask, c.text)
		try := c.textTrial
		if c.st.off > 0 {
			try = c.textEnd
		}
		for _, id := range try {
			trial := c.st
			c.mask[id] = c.run(&trial, c.toks[id], false, false)
		}
		for _, id := range c.stops {
			c.mask[id] = true
		}
		return
	}
	text := c.st.phase == pText
	done := c.st.phase == pDone
	if !text {
		// Past the text few tokens may follow (a literal, a name from the
		// list, an index): the vocabulary's trie runs the section on the
		// tokens' prefixes and skips every token under a refused one,
		// since the section never takes what extends bytes it refused.
		if done {
			clear(c.mask)
		} else {
			c.vocab.Select(c.mask, c.takes)
		}
		for _, id := range c.specials {
			trial := c.st
			c.mask[id] = !done && c.run(&trial, c.toks[id], true, false)
		}
		for _, id := range c.stops {
			c.mask[id] = done
		}
		return
	}
	var first [256]bool
	for ch := range first {
		trial := c.st
		first[ch] = !done && c.run(&trial, []byte{byte(ch)}, false, false)
	}
	for id, b := range c.toks {
		switch {
		case done || len(b) == 0:
			c.mask[id] = false
		case c.special[id]:
			trial := c.st
			c.mask[id] = c.run(&trial, b, true, false)
		case text && c.st.off == 0 && bytes.IndexByte(b, '<') < 0:
			c.mask[id] = true // cannot begin the section
		case !first[b[0]]:
			c.mask[id] = false
		default:
			trial := c.st
			c.mask[id] = c.run(&trial, b, false, false)
		}
	}
	for _, id := range c.stops {
		c.mask[id] = done || text
	}
}

// admits reports how many of drafts the grammar takes in a row from
// here; a stop token ends the count.
func (c *toolConstraint) admits(drafts []int32) int {
	trial := c.st
	trial.args = c.st.args.Clone()
	for i, d := range drafts {
		if len(c.toks[d]) == 0 || slices.Contains(c.stops, d) || !c.run(&trial, c.toks[d], c.special[d], true) {
			return i
		}
	}
	return len(drafts)
}

// closed advances over the drawn token and reports whether the section
// is now whole.
func (c *toolConstraint) closed(id int32) bool {
	if !slices.Contains(c.stops, id) {
		c.run(&c.st, c.toks[id], c.special[id], true)
	}
	return c.st.phase == pDone
}
