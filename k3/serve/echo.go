package serve

import (
	"context"
	"unicode/utf8"

	"k3/internal/kernel"
	"k3/k3"
)

// echoChunk is how many prompt tokens a scoring pass feeds at once: their
// logits (chunk x vocabulary floats) are all held at once.
const echoChunk = 64

// echoed is a prompt as an echoing completion repeats it: its text and,
// with logprobs, each token's entry (the first without a log-probability,
// nothing coming before it).
type echoed struct {
	text   string
	legacy legacyLogprobs
	// chars is the prompt tokens' length in text_offset's unit (see
	// tokenChars): where the generated tokens' offsets start.
	chars int
}

// tokenChars is a token's length in text_offset's unit: the characters
// (code points) of its string as the JSON answer renders it, each byte
// that is not part of a whole UTF-8 character being one U+FFFD. So a
// token's offset is the length of the tokens before it, joined, as vLLM
// counts it, and for text of whole characters its character offset in
// the text, as OpenAI documents it.
func tokenChars(b []byte) int { return utf8.RuneCount(b) }

// scorePrompt feeds prompt to ss, a new session, a chunk at a time, and
// returns the prompt's echo: each token's log-probability under the
// model's logits before it (log-softmax of the raw logits, as generated
// tokens' are), with the top alternatives.
func (s *Server) scorePrompt(ctx context.Context, ss seq, prompt []int32, logprobs bool, top int) (*echoed, error) {
	e := &echoed{text: s.m.Decode(prompt)}
	tk := s.m.Tokenizer()
	v := s.m.Config.VocabSize
	prev := make([]float32, v) // the row before the chunk's first token
	scratch := make([]float32, v)
	idx := make([]int32, max(top, 1))
	for start := 0; start < len(prompt); start += echoChunk {
		chunk := prompt[start:min(start+echoChunk, len(prompt))]
		logits, err := ss.Forward(ctx, chunk)
		if err != nil {
			return nil, err
		}
		if !logprobs {
			continue
		}
		for i, id := range chunk {
			b := tk.TokenBytes(id)
			l := &e.legacy
			l.Tokens = append(l.Tokens, string(b))
			l.TextOffset = append(l.TextOffset, e.chars)
			e.chars += tokenChars(b)
			if start+i == 0 {
				l.TokenLogprobs = append(l.TokenLogprobs, nil)
				l.TopLogprobs = append(l.TopLogprobs, nil)
				continue
			}
			row := prev
			if i > 0 {
				row = logits[(i-1)*v : i*v]
			}
			lse := kernel.LogSumExp(row, scratch)
			lp := float32(float64(row[id]) - lse)
			l.TokenLogprobs = append(l.TokenLogprobs, &lp)
			alts := map[string]float32{}
			n := kernel.TopK(idx[:top], nil, row, top)
			for _, a := range idx[:n] {
				alts[string(tk.TokenBytes(a))] = float32(float64(row[a]) - lse)
			}
			l.TopLogprobs = append(l.TopLogprobs, alts)
		}
		copy(prev, logits[(len(chunk)-1)*v:])
	}
	return e, nil
}

// then is the entries of l followed by those of m.
func (l *legacyLogprobs) then(m *legacyLogprobs) *legacyLogprobs {
	return &legacyLogprobs{Tokens: append(l.Tokens[:len(l.Tokens):len(l.Tokens)], m.Tokens...),
		TokenLogprobs: append(l.TokenLogprobs[:len(l.TokenLogprobs):len(l.TokenLogprobs)], m.TokenLogprobs...),
		TopLogprobs:   append(l.TopLogprobs[:len(l.TopLogprobs):len(l.TopLogprobs)], m.TopLogprobs...),
		TextOffset:    append(l.TextOffset[:len(l.TextOffset):len(l.TextOffset)], m.TextOffset...)}
}

// finished is a generation of no tokens: an echoing completion with
// max_tokens 0 scores its prompt only.
func finished(prompt int) func(func(k3.Token, error) bool) {
	return func(yield func(k3.Token, error) bool) {
		yield(k3.Token{ID: -1, Finish: k3.FinishLength, Usage: &k3.Usage{PromptTokens: prompt}}, nil)
	}
}
