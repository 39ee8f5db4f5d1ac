package k3

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"

	"k3/internal/jsonschema"
	"k3/internal/kernel"

	"k3/internal/sample"
	"k3/internal/tokenizer"
	"k3/specdec"
)

// ErrInvalidOption is wrapped by errors about options: generation and
// sampling options, load options and parallel layouts.
var ErrInvalidOption = sample.ErrInvalid

// ErrEmptyPrompt is returned when generation has no prompt and no history.
var ErrEmptyPrompt = errors.New("k3: empty prompt")

// Token is one generated token.
type Token struct {
	ID int32
	// Text is the text this token completes. It is empty while a character
	// spans several tokens, and never holds part of a UTF-8 sequence or of
	// a stop string still being matched; text held back that way arrives
	// with a later token, and at the end with the last one (the bytes of an
	// unfinished character as U+FFFD, the start of a stop string that never
	// completed).
	Text string
	// Finish is set on the last token of a generation and says why it
	// ended; it is FinishNone on every other token.
	Finish FinishReason
	// Logprob is the natural log of the token's probability under the
	// model's distribution (softmax of the raw logits, before penalties,
	// bias and temperature); set with WithLogprobs, else 0.
	Logprob float32
	// Top holds the most likely tokens at this position with their log
	// probabilities, most likely first (WithLogprobs(n), n > 0).
	Top []TokenLogprob
	// Usage is set on the last token: what the generation consumed.
	Usage *Usage
}

// TokenLogprob is a token id with its log probability.
type TokenLogprob struct {
	ID      int32
	Logprob float32
}

// Usage counts a generation's tokens.
type Usage struct {
	PromptTokens    int // tokens of the prompt this generation fed
	CachedTokens    int // tokens the session already held, not computed again
	GeneratedTokens int // tokens yielded (the stop token that ended it is not counted)
	// DraftTokens counts the tokens a speculating generation's drafter
	// proposed (WithSpeculation), AcceptedTokens those its draws kept.
	DraftTokens, AcceptedTokens int
}

// FinishReason says why a generation ended. Cancellation is not among
// them: a cancelled generation ends with ctx's error instead.
type FinishReason uint8

const (
	FinishNone       FinishReason = iota // not the last token
	FinishStop                           // the model produced a stop token (not yielded)
	FinishStopString                     // the text reached a stop string (cut before it)
	FinishLength                         // WithMaxTokens tokens were generated
	FinishContext                        // the session reached the model's context length
)

// String returns the reason as OpenAI's API names it where it has a name
// ("stop", "length"), else "stop_string" or "context_full".
func (f FinishReason) String() string {
	switch f {
	case FinishNone:
		return ""
	case FinishStop:
		return "stop"
	case FinishStopString:
		return "stop_string"
	case FinishLength:
		return "length"
	case FinishContext:
		return "context_full"
	}
	return fmt.Sprintf("FinishReason(%d)", uint8(f))
}

// GenerateOption configures Generate.
type GenerateOption func(*genOptions)

type genOptions struct {
	sample.Params
	maxTokens   int
	stopTokens  []int32
	stopStrings []string
	noDefault   bool
	logprobs    bool
	topLogprobs int
	drafter     specdec.Drafter // WithSpeculation
	depth       int
	adaptive    bool                          // WithAdaptiveSpeculation
	rejection   bool                          // WithRejectionSampling
	json        bool                          // WithJSONObject
	toolNames   []string                      // WithToolCalls, WithOptionalToolCalls
	toolText    bool                          // WithOptionalToolCalls: text may come first
	toolArgs    map[string]*jsonschema.Schema // WithToolArguments
	schema      *jsonschema.Schema            // WithJSONSchema
	parallel    bool
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

// WithLogprobs makes every Token carry its log probability (Token.Logprob)
// and the top most likely alternatives (Token.Top, at most 20). Computing
// them costs a pass over the vocabulary per token.
func WithLogprobs(top int) GenerateOption {
	return func(o *genOptions) {
		if top < 0 || top > 20 {
			o.fail("top_logprobs = %d, want in 0..20", top)
		}
		o.logprobs, o.topLogprobs = true, top
	}
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
	if o.rejection && o.drafter == nil {
		return nil, fmt.Errorf("%w: rejection sampling verifies drafts: it needs WithSpeculation or WithAdaptiveSpeculation", ErrInvalidOption)
	}
	if err := m.checkSpeculation(o); err != nil {
		return nil, err
	}
	return o, nil
}

// Generate appends prompt to the session (it may be empty to continue from
// the session's history) and yields generated tokens until a stop token or
// string, the token limit, the context limit or cancellation. Every Token
// yielded is one generated token and the last one carries Finish, with one
// exception: a generation whose first draw is a stop token yields a single
// Token with ID -1, no text and Finish set. Cancelling ctx stops within one
// decode step, or between prefill chunks; the error is then ctx's. The
// session holds every token yielded (and, after the last, the stop token
// that ended the generation); a caller that stops iterating early leaves
// the session at the last token it received. Special-token strings in the
// prompt are honoured.
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
		defer s.endTurn()
		// Drafts past what the caller received leave the session
		// (cancellation, an early stop of the loop); a failure there marks
		// the session broken, which its next use reports.
		defer g.settle()
		for {
			st, err := g.advance(ctx)
			for _, tok := range st.ready {
				if !yield(tok, nil) {
					if tok.Finish == FinishNone {
						return // the session holds what the caller received
					}
					// The caller has the last token; the session still
					// takes the final feed below, but hears no more.
					yield = func(Token, error) bool { return false }
				}
			}
			if err != nil {
				yield(Token{}, err)
				return
			}
			if st.feed {
				if err := g.feed(ctx, st.id, st.done); err != nil {
					yield(Token{}, err)
					return
				}
			}
			if st.done {
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
		defer s.Close()
		for t, err := range s.Generate(ctx, prompt, opts...) {
			if !yield(t, err) {
				return
			}
		}
	}
}

// generation is the state of one Generate call. It yields each token one
// draw late: only the next draw tells whether a token was the last (the
// next one may be a stop token), and the next draw needs the token's own
// forward pass first, which the token used to wait for anyway.
type generation struct {
	s       *Session
	o       *genOptions
	sampler *sample.Sampler
	dec     *tokenizer.StreamDecoder
	held    string // text held back while it may be the start of a stop string
	stops   *stopMatcher
	n       int   // tokens generated
	prev    Token // the last token drawn, not yielded yet (valid when hasPrev)
	hasPrev bool
	done    bool
	usage   Usage
	scratch []float32 // WithLogprobs: the exponentials of one row of logits
	ready   [2]Token  // the backing of each advance's ready tokens
	one     [1]int32  // the backing of a one-token pass (feedPass)
	spec    *speculation
	con     constraint // WithJSONObject, WithJSONSchema, WithToolCalls
	mask    []bool     // con's, which the sampler reads
}

// constraint holds a generation to a grammar: fill sets the mask its
// sampler reads before each draw, closed advances over the drawn token
// and reports whether the text is whole.
type constraint interface {
	fill()
	closed(id int32) bool
}

// stepResult is one advance of a generation: the tokens to yield now (the
// last of them final when done; valid until the next advance), and the
// token to feed to the session afterwards, if any.
type stepResult struct {
	ready []Token
	id    int32
	feed  bool
	done  bool
}

func (s *Session) startGeneration(ctx context.Context, prompt []int32, opts []GenerateOption) (*generation, error) {
	g, err := s.prepareGeneration(prompt, opts)
	if err != nil {
		return nil, err
	}
	if len(prompt) > 0 {
		if _, err := s.run(ctx, prompt, false); err != nil {
			return nil, err
		}
		g.usage.CachedTokens += s.resumed
	}
	return g, nil
}

// prepareGeneration checks a generation's options and prompt and sets up
// its sampler, without feeding the prompt: the caller feeds it (the
// Batcher, chunk by chunk, inside its passes) before the first advance.
func (s *Session) prepareGeneration(prompt []int32, opts []GenerateOption) (*generation, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	o, err := s.m.genOptions(opts)
	if err != nil {
		return nil, err
	}
	if len(prompt) == 0 && s.last == nil {
		return nil, ErrEmptyPrompt
	}
	if s.broken != nil {
		return nil, fmt.Errorf("k3: session unusable after an earlier failure (Reset or Truncate it): %w", s.broken)
	}
	if s.pos+len(prompt) > s.limit {
		return nil, fmt.Errorf("%w: %d prompt tokens after %d exceed %d", ErrContextFull, len(prompt), s.pos, s.limit)
	}
	sm, err := sample.New(o.Params, s.m.Config.VocabSize)
	if err != nil {
		return nil, err
	}
	sm.Observe(s.tokens...)
	sm.Observe(prompt...)
	usage := Usage{PromptTokens: len(prompt), CachedTokens: s.pos}
	g := &generation{s: s, o: o, sampler: sm, dec: tokenizer.NewStreamDecoder(s.m.tok), usage: usage}
	if len(o.stopStrings) > 0 {
		g.stops = newStopMatcher(o.stopStrings)
	}
	switch {
	case o.json && o.toolNames != nil, o.json && o.schema != nil, o.schema != nil && o.toolNames != nil:
		return nil, fmt.Errorf("%w: more than one of WithJSONObject, WithJSONSchema and WithToolCalls", ErrInvalidOption)
	case o.schema != nil, o.json:
		schema := o.schema
		if o.json {
			schema = jsonschema.Object()
		}
		c := newSchemaConstraint(s.m, schema, o.stopTokens)
		g.con, g.mask = c, c.mask
		sm.SetMask(c.mask)
	case o.toolArgs != nil && o.toolNames == nil:
		return nil, fmt.Errorf("%w: WithToolArguments without WithToolCalls or WithOptionalToolCalls", ErrInvalidOption)
	case o.toolNames != nil:
		schemas, err := argSchemas(o.toolNames, o.toolArgs)
		if err != nil {
			return nil, err
		}
		c := newToolConstraint(s.m, o.toolNames, schemas, o.parallel, o.toolText, o.stopTokens)
		g.con, g.mask = c, c.mask
		sm.SetMask(c.mask)
	}
	// A constrained generation speculates too: every draw, a draft's
	// confirmation included, reads the mask filled for its own position.
	if o.drafter != nil {
		g.spec = &speculation{drafter: o.drafter, depth: o.depth, adaptive: o.adaptive}
		if o.rejection && o.Temperature != 0 {
			g.spec.rejection = true
			g.spec.pick = g.pickDraft
		}
		if b, ok := o.drafter.(interface{ bind(*Session) }); ok {
			b.bind(s) // a drafter that reads the session's own state (DSpark)
		}
	}
	return g, nil
}

// advance draws the next token from the session's last logits (the
// session must hold every token fed so far) and says what to yield and
// what to feed. On error the tokens in ready are still to be yielded.
func (g *generation) advance(ctx context.Context) (stepResult, error) {
	// The caller yields the ready tokens before the next advance, so one
	// buffer serves every step.
	r := stepResult{ready: g.ready[:0]}
	if g.done {
		r.done = true
		return r, nil
	}
	if err := ctx.Err(); err != nil {
		g.done = true
		if g.hasPrev {
			r.ready = append(r.ready, g.prev)
		}
		return r, err
	}
	if g.con != nil {
		g.con.fill()
	}
	id, err := g.draw()
	if err != nil {
		g.done = true
		if g.hasPrev {
			r.ready = append(r.ready, g.prev)
		}
		return r, err
	}
	if g.spec != nil {
		g.spec.drew(id, &g.usage)
	}
	room := g.holds() < g.s.limit
	for _, st := range g.o.stopTokens {
		if id == st {
			// The stop token ends the turn: the session holds it (a chat's
			// <|im_end|>), but it is not yielded.
			last := Token{ID: -1}
			if g.hasPrev {
				last = g.prev
			}
			last.Text += g.flush()
			last.Finish = FinishStop
			g.finish(&last)
			r.ready = append(r.ready, last)
			r.id, r.feed, r.done, g.done = id, room, true, true
			return r, nil
		}
	}
	if g.hasPrev {
		r.ready = append(r.ready, g.prev)
	}
	g.n++
	piece := g.dec.Next(id)
	text := g.held + piece
	g.held = ""
	tok := Token{ID: id}
	if g.o.logprobs {
		g.logprobs(&tok)
	}
	stop := false
	if g.stops != nil {
		text, g.held, stop = g.cutStop(text, piece)
	}
	tok.Text = text
	whole := g.con != nil && g.con.closed(id)
	switch {
	case stop:
		tok.Finish = FinishStopString
	case whole && len(g.o.stopTokens) == 0:
		tok.Finish = FinishStop // the text is whole and no stop token can follow it
	case g.n >= g.o.maxTokens:
		tok.Finish = FinishLength
	case !room:
		tok.Finish = FinishContext
	}
	if tok.Finish != FinishNone {
		if !stop {
			tok.Text += g.flush()
		}
		g.finish(&tok)
		r.ready = append(r.ready, tok)
		g.hasPrev, g.done, r.done = false, true, true
	} else {
		g.prev, g.hasPrev = tok, true
	}
	r.id, r.feed = id, room
	return r, nil
}

// holds is the number of tokens the session holds for the generation:
// its position without the drafts still in flight.
func (g *generation) holds() int {
	p := g.s.pos
	if sp := g.spec; sp != nil {
		p -= len(sp.drafts) - sp.next
	}
	return p
}

// finish completes the last token: the generation's usage.
func (g *generation) finish(t *Token) {
	u := g.usage
	u.GeneratedTokens = g.n
	t.Usage = &u
}

// logprobs sets t's log probability and alternatives from the logits it
// was drawn from (the session's last logits, not yet replaced).
func (g *generation) logprobs(t *Token) {
	x := g.s.last
	if cap(g.scratch) < len(x) {
		g.scratch = make([]float32, len(x))
	}
	lse := kernel.LogSumExp(x, g.scratch)
	t.Logprob = float32(float64(x[t.ID]) - lse)
	if k := g.o.topLogprobs; k > 0 {
		idx := make([]int32, k)
		kernel.TopK(idx, nil, x, k)
		t.Top = make([]TokenLogprob, k)
		for i, id := range idx {
			t.Top[i] = TokenLogprob{ID: id, Logprob: float32(float64(x[id]) - lse)}
		}
	}
}

// flush releases text held back: an unfinished character, or the start of
// a stop string that never completed.
func (g *generation) flush() string {
	text := g.held + g.dec.Flush()
	g.held = ""
	// Nothing follows, so a held start of a stop string is plain text now;
	// only a complete stop string (the flushed bytes may finish one) cuts.
	if i := indexAny(text, g.o.stopStrings); i >= 0 {
		text = text[:i]
	}
	return text
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

// cutStop returns the text (the held text, then piece, the token's)
// before the first stop string (stop = true), or the text that can be
// released and the suffix to hold back because it is a prefix of some
// stop string.
func (g *generation) cutStop(text, piece string) (out, held string, stop bool) {
	if g.stops.feed(piece) {
		// A string ended in piece; it began in the text held back, which
		// holds every start a string may have. The first to begin cuts.
		if i := indexAny(text, g.o.stopStrings); i >= 0 {
			return text[:i], "", true
		}
	}
	keep := min(g.stops.pending(), len(text))
	return text[:len(text)-keep], text[len(text)-keep:], false
}
