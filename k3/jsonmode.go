package k3

import (
	"k3/internal/jsonschema"
)

// WithJSONObject holds the generation to one JSON object (OpenAI's JSON
// mode): before each draw only the tokens whose bytes keep the text a
// prefix of a JSON object may be drawn, and once the object closes only
// the stop tokens (with none, WithoutDefaultStops, the generation ends
// there). Special tokens other than the stop tokens are never drawn.
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
	plain    []bool            // which tokens stay inside a JSON string (jsonschema.Plain)
	vocab    *jsonschema.Vocab // jsonToks arranged for jsonschema.State.Mask
}

// grammar returns the model's grammarTables, made on first use.
func (m *Model) grammar() *grammarTables {
	m.grammarOnce.Do(func() {
		n := m.Config.VocabSize
		g := &grammarTables{toks: make([][]byte, n), special: make([]bool, n), jsonToks: make([][]byte, n)}
		for id := range n {
			g.toks[id] = m.tok.TokenBytes(int32(id))
			if g.special[id] = m.tok.IsSpecial(int32(id)); !g.special[id] {
				g.jsonToks[id] = g.toks[id]
			}
		}
		g.plain = jsonschema.Plain(g.jsonToks)
		g.vocab = jsonschema.NewVocab(g.jsonToks)
		m.grammarT = g
	})
	return m.grammarT
}
