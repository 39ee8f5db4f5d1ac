package k3

import (
	"fmt"

	"k3/internal/jsonschema"
)

// JSONSchema is a compiled JSON Schema for WithJSONSchema. It is
// immutable and may be shared by any number of generations.
type JSONSchema struct {
	s *jsonschema.Schema
}

// CompileJSONSchema reads a JSON Schema document. A keyword k3 cannot
// hold exactly is an error naming it and its place ("#/properties/age:
// keyword \"minimum\""), as is a schema that admits no value; the error
// wraps ErrInvalidOption. k3 reads type (one or a list), properties,
// required, additionalProperties, items, minItems, maxItems, minLength,
// maxLength, minimum, maximum, exclusiveMinimum and exclusiveMaximum (on
// integers only), enum, const, anyOf, oneOf, a one-element allOf, references
// inside the document ($ref "#", "#/$defs/...", "#/definitions/...") and
// the annotations (title, description, default, ...). The branches of
// anyOf and oneOf must differ in their first byte's kind (an object and
// null, a string and an array), since the generation is read byte by
// byte without going back.
func CompileJSONSchema(doc []byte) (*JSONSchema, error) {
	s, err := jsonschema.Compile(doc)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	return &JSONSchema{s: s}, nil
}

// Objects returns the schema restricted to JSON objects at the top level
// (what WithToolArguments holds a call's arguments to), or an error
// wrapping ErrInvalidOption if it admits none.
func (s *JSONSchema) Objects() (*JSONSchema, error) {
	o, err := s.s.Objects()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	return &JSONSchema{s: o}, nil
}

// WithJSONSchema holds the generation to one JSON value that s admits
// (OpenAI's structured output): before each draw only the tokens whose
// bytes keep the text a prefix of such a value may be drawn, and once it
// is whole only the stop tokens (with none, WithoutDefaultStops, the
// generation ends there). Keys, enum and const values are written
// compactly, integers without fraction or exponent, numbers below 10^308
// in magnitude (float64's range); white space outside
// strings is allowed, at most 32 bytes in a row. Special tokens other
// than the stop tokens are never drawn. max_tokens may still cut the
// value short (FinishLength). A generation held this way may speculate,
// as WithJSONObject's.
func WithJSONSchema(s *JSONSchema) GenerateOption {
	return func(o *genOptions) {
		if s == nil {
			o.fail("WithJSONSchema(nil)")
			return
		}
		o.schema = s.s
	}
}

// schemaConstraint is a generation's schema state and the mask its
// sampler reads.
type schemaConstraint struct {
	state jsonschema.State
	toks  [][]byte // special tokens empty: never drawn
	vocab *jsonschema.Vocab
	stops []int32
	mask  []bool
	draft [][]byte // admits' scratch
}

func newSchemaConstraint(m *Model, s *jsonschema.Schema, stops []int32) *schemaConstraint {
	g := m.grammar()
	return &schemaConstraint{state: s.Start(), toks: g.jsonToks, vocab: g.vocab, stops: stops,
		mask: make([]bool, m.Config.VocabSize)}
}

// fill sets the mask for the next draw: the stop tokens once the value
// is whole (a number at the top level may also go on).
func (c *schemaConstraint) fill() {
	if c.state.Done() {
		clear(c.mask)
	} else {
		c.state.Mask(c.mask, c.vocab)
	}
	complete := c.state.Complete()
	for _, id := range c.stops {
		c.mask[id] = complete
	}
}

// admits reports how many of drafts the grammar takes in a row from
// here; a special token (a stop token too) ends the count.
func (c *schemaConstraint) admits(drafts []int32) int {
	c.draft = c.draft[:0]
	for _, d := range drafts {
		c.draft = append(c.draft, c.toks[d])
	}
	return c.state.Admits(c.draft)
}

// closed advances over the drawn token and reports whether the value is
// whole with nothing more to read.
func (c *schemaConstraint) closed(id int32) bool {
	c.state.Feed(c.toks[id])
	return c.state.Done()
}
