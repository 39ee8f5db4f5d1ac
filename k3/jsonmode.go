package k3

import (
	"slices"

	"k3/internal/jsonprefix"
)

// WithJSONObject holds the generation to one JSON object (OpenAI's JSON
// mode): before each draw only the tokens whose bytes keep the text a
// prefix of a JSON object may be drawn, and once the object closes only
// the stop tokens (with none, WithoutDefaultStops, the generation ends
// there). Special tokens other than the stop tokens are never drawn.
// max_tokens may still cut the object short (FinishLength). A generation
// held this way does not speculate.
func WithJSONObject() GenerateOption { return func(o *genOptions) { o.json = true } }

// jsonConstraint is a generation's JSON state and the mask its sampler
// reads.
type jsonConstraint struct {
	state jsonprefix.State
	vocab *jsonprefix.Vocab
	toks  [][]byte
	stops []int32
	mask  []bool
}

func newJSONConstraint(m *Model, stops []int32) *jsonConstraint {
	toks, _, vocab := m.grammarTables()
	return &jsonConstraint{vocab: vocab, toks: toks, stops: stops, mask: make([]bool, m.Config.VocabSize)}
}

// grammarTables returns, made once a model, what the grammar options
// read: every token's bytes (a special token's, its name), which tokens
// are special, and the JSON view of the vocabulary, in which special
// tokens are never drawn.
func (m *Model) grammarTables() (toks [][]byte, special []bool, vocab *jsonprefix.Vocab) {
	m.grammarOnce.Do(func() {
		n := m.Config.VocabSize
		m.tokBytes, m.tokSpecial = make([][]byte, n), make([]bool, n)
		plain := make([][]byte, n)
		for id := range n {
			m.tokBytes[id] = m.tok.TokenBytes(int32(id))
			if m.tokSpecial[id] = m.tok.IsSpecial(int32(id)); !m.tokSpecial[id] {
				plain[id] = m.tokBytes[id]
			}
		}
		m.jsonVocab = jsonprefix.NewVocab(plain)
	})
	return m.tokBytes, m.tokSpecial, m.jsonVocab
}

// fill sets the mask for the next draw.
func (c *jsonConstraint) fill() {
	done := c.state.Done()
	if done {
		clear(c.mask)
	} else {
		c.state.Mask(c.mask, c.vocab)
	}
	for _, id := range c.stops {
		c.mask[id] = done
	}
}

// closed advances over the drawn token and reports whether the object is
// now whole.
func (c *jsonConstraint) closed(id int32) bool {
	if !slices.Contains(c.stops, id) {
		c.state.Feed(c.toks[id])
	}
	return c.state.Done()
}
