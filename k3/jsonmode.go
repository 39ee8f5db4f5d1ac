package k3

import (
	"k3/internal/jsonschema"
)

// WithJSONObject holds the generation to one JSON object (OpenAI's JSON
// mode): before each draw only the tokens whose bytes keep the text a
// prefix of a JSON object may be drawn, and once the object closes only
// the stop tokens (with none, WithoutDefaultStops, the generation ends
// there). Special tokens other than the stop tokens are never drawn, and
// numbers stay below 10^308 in magnitude (float64's range).
// max_tokens may still cut the object short (FinishLength). A generation
// held this way speculates as any other (WithSpeculation): each draw, a
// draft's confirmation included, reads its own position's mask. It is
// WithJSONSchema with the schema {"type": "object"}.
func WithJSONObject() GenerateOption { return func(o *genOptions) { o.json = true } }

// grammarTables is what the grammar options read, made once a model.
type grammarTables struct {
	toks     [][]byte          // every token's bytes (a special token's, its name)
	special  []bool            // which tokens are special
	jsonToks [][]byte          // the JSON view: special tokens empty (never drawn)
	vocab    *jsonschema.Vocab // jsonToks arranged for jsonschema.State.Mask
	specials []int32           // the special tokens with bytes
}

// grammar returns the model's grammarTables, made on first use.
func (m *Model) grammar() *grammarTables {
	m.grammarOnce.Do(func() {
		n := m.Config.VocabSize
		toks, special := make([][]byte, n), make([]bool, n)
		for id := range n {
			toks[id] = m.tok.TokenBytes(int32(id))
			special[id] = m.tok.IsSpecial(int32(id))
		}
		m.grammarT = newGrammarTables(toks, special)
	})
	return m.grammarT
}

func newGrammarTables(toks [][]byte, special []bool) *grammarTables {
	g := &grammarTables{toks: toks, special: special, jsonToks: make([][]byte, len(toks))}
	for id, b := range toks {
		switch {
		case !special[id]:
			g.jsonToks[id] = b
		case len(b) > 0:
			g.specials = append(g.specials, int32(id))
		}
	}
	g.vocab = jsonschema.NewVocab(g.jsonToks)
	return g
}
