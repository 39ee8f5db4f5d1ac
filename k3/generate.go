package k3

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"

	"k3/internal/sample"
	"k3/internal/tokenizer"
)

// ErrInvalidOption is wrapped by errors about generation options.
var ErrInvalidOption = sample.ErrInvalid

// ErrEmptyPrompt is returned when generation has no prompt and no history.
var ErrEmptyPrompt = errors.New("k3: empty prompt")

// Token is one generated token. The last Token of a generation may have
// ID -1: it carries text held back until the end (the bytes of an
// unfinished character, shown as U+FFFD, or the start of a stop string that
// never completed).
type Token struct {
	ID int32
	// Text is the text this token completes. It is empty while a character
	// spans several tokens, and never holds part of a UTF-8 sequence or of
	// a stop string still being matched.
	Text string
}

// GenerateOption configures Generate.
type GenerateOption func(*genOptions)

type genOptions struct {
	sample.Params
	maxTokens   int
	stopTokens  []int32
	stopStrings []string
	noDefault   bool
	err         error // the first invalid option
}

func (o *genOptions) fail(format string, args ...any) {
	if o.err == nil {
		o.err = fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
	}
}

// WithTemperature sets the sampling temperature; 0 (the default) decodes
// greedily.
func WithTemperature(t float32) GenerateOption { return func(o *genOptions) { o.Temperature = t } }

// WithTopK keeps only the k most likely tokens (0: all).
func WithTopK(k int) GenerateOption { return func(o *genOptions) { o.TopK = k } }

// WithTopP keeps the smallest set of tokens whose probability reaches p, in (0, 1].
func WithTopP(p float32) GenerateOption {
	return func(o *genOptions) {
		if !(p > 0 && p <= 1) {
			o.fail("top_p = %v, want in (0, 1]", p)
		}
		o.TopP = p
	}
}

// WithMinP drops tokens less likely than p times the most likely one.
func WithMinP(p float32) GenerateOption { return func(o *genOptions) { o.MinP = p } }

// WithRepetitionPenalty divides the logits of tokens already seen (> 1 penalises).
func WithRepetitionPenalty(p float32) GenerateOption {
	return func(o *genOptions) { o.RepetitionPenalty = p }
}

// WithPresencePenalty subtracts p from the logit of every token already seen.
func WithPresencePenalty(p float32) GenerateOption {
	return func(o *genOptions) { o.PresencePenalty = p }
}

// WithFrequencyPenalty subtracts p per earlier occurrence of a token.
func WithFrequencyPenalty(p float32) GenerateOption {
	return func(o *genOptions) { o.FrequencyPenalty = p }
}

// WithLogitBias adds a bias to chosen tokens' logits.
func WithLogitBias(bias map[int32]float32) GenerateOption {
	return func(o *genOptions) { o.LogitBias = bias }
}

// WithSeed makes sampling reproducible.
func WithSeed(seed uint64) GenerateOption { return func(o *genOptions) { o.Seed = seed } }

// WithMaxTokens bounds the number of generated tokens (default 256).
func WithMaxTokens(n int) GenerateOption { return func(o *genOptions) { o.maxTokens = n } }

// WithStopTokens ends generation at any of these ids (in addition to the
// model's end-of-sequence tokens); the stop token itself is not yielded.
func WithStopTokens(ids ...int32) GenerateOption {
	return func(o *genOptions) { o.stopTokens = append(o.stopTokens, ids...) }
}

// WithStopStrings ends generation when the text contains any of these; the
// text yielded stops before it.
func WithStopStrings(s ...string) GenerateOption {
	return func(o *genOptions) { o.stopStrings = append(o.stopStrings, s...) }
}

// WithoutDefaultStops disables stopping at the model's end-of-sequence tokens.
func WithoutDefaultStops() GenerateOption { return func(o *genOptions) { o.noDefault = true } }

func (m *Model) genOptions(opts []GenerateOption) (*genOptions, error) {
	o := &genOptions{maxTokens: 256}
	for _, f := range opts {
		f(o)
	}
	if o.err != nil {
		return nil, o.err
	}
	if o.maxTokens <= 0 {
		return nil, fmt.Errorf("%w: max_tokens = %d, want > 0", ErrInvalidOption, o.maxTokens)
	}
	if err := o.Validate(m.Config.VocabSize); err != nil {
		return nil, err
	}
	if !o.noDefault {
		for _, id := range m.Config.EOSTokenIDs {
			o.stopTokens = append(o.stopTokens, int32(id))
		}
		if id, ok := m.tok.Special("<|im_end|>"); ok {
			o.stopTokens = append(o.stopTokens, id)
		}
	}
	for _, id := range o.stopTokens {
		if id < 0 || int(id) >= m.Config.VocabSize {
			return nil, fmt.Errorf("%w: stop token %d outside the vocabulary", ErrInvalidOption, id)
		}
	}
	for _, s := range o.stopStrings {
		if s == "" {
			return nil, fmt.Errorf("%w: empty stop string", ErrInvalidOption)
		}
	}
	return o, nil
}

// Generate appends prompt to the session (it may be empty to continue from
// the session's history) and yields generated tokens until a stop token or
// string, the token limit, the context limit or cancellation. Cancelling ctx
// stops within one decode step, or between prefill chunks; the error is then
// ctx's. Special-token strings in the prompt are honoured.
func (s *Session) Generate(ctx context.Context, prompt string, opts ...GenerateOption) iter.Seq2[Token, error] {
	return s.GenerateTokens(ctx, s.m.tok.Encode(prompt, true), opts...)
}

// GenerateTokens is Generate with a tokenized prompt.
func (s *Session) GenerateTokens(ctx context.Context, prompt []int32, opts ...GenerateOption) iter.Seq2[Token, error] {
	return func(yield func(Token, error) bool) {
		g, err := s.startGeneration(ctx, prompt, opts)
		if err != nil {
			yield(Token{}, err)
			return
		}
		for {
			tok, done, err := g.next(ctx)
			if err != nil {
				yield(Token{}, err)
				return
			}
			if done {
				if t := g.flush(); t.Text != "" {
					yield(t, nil)
				}
				return
			}
			if !yield(tok, nil) {
				return
			}
		}
	}
}

// GenerateFunc is the callback form of Generate: fn receives each token;
// an error from fn stops generation and is returned.
func (s *Session) GenerateFunc(ctx context.Context, prompt string, fn func(Token) error, opts ...GenerateOption) error {
	for tok, err := range s.Generate(ctx, prompt, opts...) {
		if err != nil {
			return err
		}
		if err := fn(tok); err != nil {
			return err
		}
	}
	return nil
}

// Generate runs a prompt in a new session.
func (m *Model) Generate(ctx context.Context, prompt string, opts ...GenerateOption) iter.Seq2[Token, error] {
	return func(yield func(Token, error) bool) {
		s, err := m.NewSession()
		if err != nil {
			yield(Token{}, err)
			return
		}
		for t, err := range s.Generate(ctx, prompt, opts...) {
			if !yield(t, err) {
				return
			}
		}
	}
}

// generation is the state of one Generate call.
type generation struct {
	s       *Session
	o       *genOptions
	sampler *sample.Sampler
	dec     *tokenizer.StreamDecoder
	held    string // text held back while it may be the start of a stop string
	n       int
	stopped bool
}

func (s *Session) startGeneration(ctx context.Context, prompt []int32, opts []GenerateOption) (*generation, error) {
	o, err := s.m.genOptions(opts)
	if err != nil {
		return nil, err
	}
	if len(prompt) == 0 && s.last == nil {
		return nil, ErrEmptyPrompt
	}
	sm, err := sample.New(o.Params, s.m.Config.VocabSize)
	if err != nil {
		return nil, err
	}
	sm.Observe(s.tokens...)
	sm.Observe(prompt...)
	if len(prompt) > 0 {
		if _, err := s.run(ctx, prompt, false); err != nil {
			return nil, err
		}
	}
	return &generation{s: s, o: o, sampler: sm, dec: tokenizer.NewStreamDecoder(s.m.tok)}, nil
}

// next samples one token from the session's last logits, feeds it back
// (so the session always holds everything generated), and returns it with
// the text it releases.
func (g *generation) next(ctx context.Context) (Token, bool, error) {
	tok, feed, done, err := g.pick(ctx)
	if err != nil {
		return Token{}, false, err
	}
	if feed {
		if _, err := g.s.run(ctx, []int32{tok.ID}, false); err != nil {
			return Token{}, false, err
		}
	}
	return tok, done, nil
}

// pick samples the next token. feed says whether it must be fed to the
// session (every sampled token is, while the context has room); done ends
// the generation without yielding tok.
func (g *generation) pick(ctx context.Context) (tok Token, feed, done bool, err error) {
	if g.stopped || g.n >= g.o.maxTokens {
		return Token{}, false, true, nil
	}
	if err := ctx.Err(); err != nil {
		return Token{}, false, false, err
	}
	id, err := g.sampler.Sample(g.s.last)
	if err != nil {
		return Token{}, false, false, err
	}
	feed = g.s.pos < g.s.limit
	if !feed {
		g.stopped = true
	}
	for _, st := range g.o.stopTokens {
		if id == st {
			g.stopped = true
			return Token{ID: id}, feed, true, nil
		}
	}
	g.n++
	text := g.held + g.dec.Next(id)
	g.held = ""
	if len(g.o.stopStrings) > 0 {
		var stop bool
		if text, g.held, stop = cutStop(text, g.o.stopStrings); stop {
			g.stopped = true
		}
	}
	return Token{ID: id, Text: text}, feed, false, nil
}

// flush releases text held back: an unfinished character, or the start of
// a stop string that never completed.
func (g *generation) flush() Token {
	text := g.held + g.dec.Flush()
	if len(g.o.stopStrings) > 0 {
		text, _, _ = cutStop(text, g.o.stopStrings)
		if i := indexAny(text, g.o.stopStrings); i >= 0 {
			text = text[:i]
		}
	}
	return Token{ID: -1, Text: text}
}

func indexAny(text string, subs []string) int {
	first := -1
	for _, s := range subs {
		if i := strings.Index(text, s); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	return first
}

// cutStop returns the text before the first stop string (stop = true), or
// the text that can be released and the suffix to hold back because it is
// a prefix of some stop string.
func cutStop(text string, stops []string) (out, held string, stop bool) {
	if first := indexAny(text, stops); first >= 0 {
		return text[:indexAny(text, stops)], "", true
	}
	keep := 0
	for _, s := range stops {
		for k := min(len(s)-1, len(text)); k > keep; k-- {
			if strings.HasSuffix(text, s[:k]) {
				keep = k
				break
			}
		}
	}
	return text[:len(text)-keep], text[len(text)-keep:], false
}
