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

// grammarTables returns, made once a model, what the grammar options
// read: every token's bytes (a special token's, its name), which tokens
// are special, and the JSON view of the vocabulary: the bytes with
// special tokens empty (never drawn) and which tokens stay inside a JSON
// string (jsonschema.Plain).
func (m *Model) grammarTables() (toks [][]byte, special []bool, jsonToks [][]byte, plain []bool) {
	m.grammarOnce.Do(func() {
		n := m.Config.VocabSize
		m.tokBytes, m.tokSpecial, m.jsonToks = make([][]byte, n), make([]bool, n), make([][]byte, n)
		for id := range n {
			m.tokBytes[id] = m.tok.TokenBytes(int32(id))
			if m.tokSpecial[id] = m.tok.IsSpecial(int32(id)); !m.tokSpecial[id] {
				m.jsonToks[id] = m.tokBytes[id]
			}
		}
		m.jsonPlain = jsonschema.Plain(m.jsonToks)
	})
	return m.tokBytes, m.tokSpecial, m.jsonToks, m.jsonPlain
}
