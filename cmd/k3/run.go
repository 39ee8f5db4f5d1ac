package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"iter"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"k3/internal/tiny"
	"k3/k3"
	"k3/specdec"
)

type genFlags struct {
	model                           string
	maxTokens                       int
	temperature, topP, minP, repPen float64
	presence, frequency             float64
	topK                            int
	seed                            uint64
	stops                           stringList
	noDefaultStops                  bool
	backend                         *backendFlags
	speculate                       string
	draftDepth                      string
	rejection                       bool
	json                            bool
	jsonSchema                      string
	schema                          *k3.JSONSchema // -json-schema, compiled by load
	layout                          k3.Layout      // -tp, -ep, -cp
	// draft is the -speculate model:DIR drafter once load has made it,
	// closeDraft what releases it and its model.
	draft      specdec.Drafter
	closeDraft func()
}

// stringList is a flag that may be given several times.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ", ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func (g *genFlags) register(fs *flag.FlagSet, maxTokens int) {
	fs.StringVar(&g.model, "model", "", "checkpoint directory (default: the embedded tiny model, trained on Go source)")
	fs.IntVar(&g.maxTokens, "max-tokens", maxTokens, "most tokens to generate")
	fs.Float64Var(&g.temperature, "temperature", 0, "sampling temperature (0: greedy)")
	fs.IntVar(&g.topK, "top-k", 0, "keep the k most likely tokens (0: all)")
	fs.Float64Var(&g.topP, "top-p", 1, "nucleus sampling mass, in (0, 1]")
	fs.Float64Var(&g.minP, "min-p", 0, "drop tokens below min-p times the most likely")
	fs.Float64Var(&g.repPen, "repetition-penalty", 1, "penalty for tokens already seen (1: off)")
	fs.Float64Var(&g.presence, "presence-penalty", 0, "subtracted from the logit of every token already seen")
	fs.Float64Var(&g.frequency, "frequency-penalty", 0, "subtracted from a token's logit once per earlier occurrence")
	fs.Var(&g.stops, "stop", "stop when the text reaches this string (repeatable)")
	fs.BoolVar(&g.noDefaultStops, "no-default-stops", false, "do not stop at the model's end-of-sequence tokens")
	fs.Uint64Var(&g.seed, "seed", 0, "random seed (reproducible sampling)")
	fs.BoolVar(&g.json, "json", false, "hold the answer to one JSON object (JSON mode)")
	fs.StringVar(&g.jsonSchema, "json-schema", "", "hold the answer to a value of the JSON Schema in this file (structured output)")
	g.backend = addBackendFlags(fs)
	fs.StringVar(&g.speculate, "speculate", "", "speculative decoding with this drafter: ngram (prompt lookup), self:N (the model's own first N layers and its head), model:DIR (a smaller checkpoint's greedy tokens, same vocabulary) or dspark (the checkpoint's draft module); the output is plain decoding's")
	fs.StringVar(&g.draftDepth, "draft-depth", "auto", "drafts per verify pass with -speculate: 1..15, or auto (chosen per pass from the drafts' acceptance and this machine's measured pass costs, up to 7)")
	fs.IntVar(&g.layout.TP, "tp", 1, "split the model over this many tensor-parallel ranks (heads, MLP columns); needs -model")
	fs.IntVar(&g.layout.EP, "ep", 1, "expert-parallel ranks (routed experts); needs -model")
	fs.IntVar(&g.layout.CP, "cp", 1, "context-parallel ranks (positions); needs -model")
	fs.BoolVar(&g.rejection, "rejection", false, "with -speculate and a temperature: draw the drafts from the drafter's distribution and verify them by rejection sampling (the output is distributed as plain sampling, but not the tokens plain sampling draws for the seed)")
}

// autoDepth is the deepest -draft-depth auto goes.
const autoDepth = 7

// depth parses -draft-depth: the depth (the most, with auto) and whether
// it adapts.
func (g *genFlags) depth() (int, bool, error) {
	if g.draftDepth == "auto" {
		return autoDepth, true, nil
	}
	var k int
	if _, err := fmt.Sscan(g.draftDepth, &k); err != nil || k < 1 || k >= k3.ExactTokens {
		return 0, false, fmt.Errorf("-draft-depth %s: want 1..%d or auto", g.draftDepth, k3.ExactTokens-1)
	}
	return k, false, nil
}

// drafter returns the -speculate drafter (nil without the flag).
func (g *genFlags) drafter() (specdec.Drafter, error) {
	switch g.speculate {
	case "":
		return nil, nil
	case "ngram":
		if _, _, err := g.depth(); err != nil {
			return nil, err
		}
		return specdec.NGram{}, nil
	case "dspark":
		if _, _, err := g.depth(); err != nil {
			return nil, err
		}
		if g.draft != nil {
			return g.draft, nil
		}
		return nil, nil // load makes it, once the model is loaded
	}
	if n, ok := strings.CutPrefix(g.speculate, "self:"); ok {
		if _, err := g.selfLayers(n); err != nil {
			return nil, err
		}
		if _, _, err := g.depth(); err != nil {
			return nil, err
		}
		if g.draft != nil {
			return g.draft, nil
		}
		return nil, nil // load makes it, once the target is loaded
	}
	if dir, ok := strings.CutPrefix(g.speculate, "model:"); ok && dir != "" {
		if _, _, err := g.depth(); err != nil {
			return nil, err
		}
		if g.draft != nil {
			return g.draft, nil
		}
		return nil, nil // load makes it, once the target is loaded
	}
	return nil, fmt.Errorf("-speculate %q: want ngram, self:N, model:DIR or dspark", g.speculate)
}

// selfLayers parses self:N's N.
func (g *genFlags) selfLayers(n string) (int, error) {
	var k int
	if _, err := fmt.Sscan(n, &k); err != nil || k < 1 {
		return 0, fmt.Errorf("-speculate self:%s: want self:N with N the layers the drafter runs (at least 1)", n)
	}
	return k, nil
}

func (g *genFlags) options() []k3.GenerateOption {
	opts := []k3.GenerateOption{k3.WithMaxTokens(g.maxTokens), k3.WithTemperature(float32(g.temperature)), k3.WithTopK(g.topK),
		k3.WithTopP(float32(g.topP)), k3.WithMinP(float32(g.minP)), k3.WithRepetitionPenalty(float32(g.repPen)),
		k3.WithPresencePenalty(float32(g.presence)), k3.WithFrequencyPenalty(float32(g.frequency)), k3.WithSeed(g.seed)}
	if len(g.stops) > 0 {
		opts = append(opts, k3.WithStopStrings(g.stops...))
	}
	if g.noDefaultStops {
		opts = append(opts, k3.WithoutDefaultStops())
	}
	if g.json {
		opts = append(opts, k3.WithJSONObject())
	}
	if g.schema != nil {
		opts = append(opts, k3.WithJSONSchema(g.schema))
	}
	if d, _ := g.drafter(); d != nil {
		k, auto, _ := g.depth()
		if auto {
			opts = append(opts, k3.WithAdaptiveSpeculation(d, k))
		} else {
			opts = append(opts, k3.WithSpeculation(d, k))
		}
		if g.rejection {
			opts = append(opts, k3.WithRejectionSampling())
		}
	}
	return opts
}

// compileSchema reads and compiles -json-schema's file, if any.
func (g *genFlags) compileSchema() error {
	if g.jsonSchema == "" {
		return nil
	}
	if g.json {
		return fmt.Errorf("-json and -json-schema: choose one")
	}
	doc, err := os.ReadFile(g.jsonSchema)
	if err != nil {
		return fmt.Errorf("-json-schema: %w", err)
	}
	if g.schema, err = k3.CompileJSONSchema(doc); err != nil {
		return fmt.Errorf("-json-schema %s: %w", g.jsonSchema, err)
	}
	return nil
}

func (g *genFlags) load(ctx context.Context, stderr io.Writer) (*k3.Model, error) {
	if _, err := g.drafter(); err != nil {
		return nil, err
	}
	if err := g.compileSchema(); err != nil {
		return nil, err
	}
	opts := g.backend.loadOptions()
	k, _, _ := g.depth()
	if g.speculate != "" {
		opts = append(opts, k3.WithRollback(k)) // speculation rolls back through the replay logs
	}
	var m *k3.Model
	var err error
	if g.model == "" {
		fmt.Fprintln(stderr, "k3: using the", k3.TinyLabel)
		m, err = k3.LoadTiny(ctx, opts...)
	} else {
		m, err = k3.Load(ctx, g.model, opts...)
	}
	if err != nil {
		return nil, err
	}
	if g.speculate == "dspark" {
		ds, err := m.NewDSpark()
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("-speculate dspark: %w", err)
		}
		g.draft = ds
		g.closeDraft = func() { ds.Close() }
	}
	if n, ok := strings.CutPrefix(g.speculate, "self:"); ok {
		k, _ := g.selfLayers(n)
		dm, err := m.NewSelfDraft(k)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("-speculate %s: %w", g.speculate, err)
		}
		g.draft = dm
		g.closeDraft = func() { dm.Close() }
	}
	if dir, ok := strings.CutPrefix(g.speculate, "model:"); ok {
		// The draft model's own session rolls back the drafts the target
		// rejects: it keeps logs as deep as the drafts.
		draft, err := k3.Load(ctx, dir, append(g.backend.loadOptions(), k3.WithRollback(k))...)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("-speculate %s: %w", g.speculate, err)
		}
		dm, err := m.NewDraftModel(draft)
		if err != nil {
			draft.Close()
			m.Close()
			return nil, fmt.Errorf("-speculate %s: %w", g.speculate, err)
		}
		g.draft = dm
		g.closeDraft = func() { dm.Close(); draft.Close() }
	}
	return m, nil
}

// finishText describes why a generation ended, for people.
func finishText(f k3.FinishReason, err error, maxTokens int) string {
	switch {
	case errors.Is(err, context.Canceled):
		return "interrupted"
	case err != nil:
		return "error"
	case f == k3.FinishStop:
		return "end-of-sequence token"
	case f == k3.FinishStopString:
		return "stop string"
	case f == k3.FinishLength:
		return fmt.Sprintf("token limit (-max-tokens %d)", maxTokens)
	case f == k3.FinishContext:
		return "context full"
	}
	return "unknown"
}

func runRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var g genFlags
	g.register(fs, 64)
	prompt := fs.String("prompt", "Hello", `prompt text ("-": read stdin)`)
	chat := fs.Bool("chat", false, "wrap the prompt as one user turn of the chat format")
	synopsis := "run [-model DIR] [-prompt TEXT] [-chat] [-speculate ngram|self:N|model:DIR|dspark [-draft-depth K|auto]] [-tp N] [-ep N] [-cp N] [sampling flags]\n\nStreams a completion to stdout, then prints why it stopped, the token counts, speed and memory on stderr; with -speculate also the drafts' acceptance and the speed of the same generation without speculation; with -tp, -ep or -cp the model runs split over that many ranks (k3.LoadGroup)."
	if err := parseFlags(fs, synopsis, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "k3 run: unexpected argument %q (the prompt goes in -prompt)\n", fs.Arg(0))
		return errUsage
	}
	text := *prompt
	if text == "-" {
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			return err
		}
		text = string(b)
	}
	// A chat's message is text: a special-token string in it stays text.
	encode := func(m *k3.Model) []int32 {
		if *chat {
			return m.ChatTokens([]k3.Message{{Role: "user", Content: text}})
		}
		return m.Encode(text)
	}
	if g.split() {
		return runGroup(ctx, g, encode, stdout, stderr)
	}
	m, err := g.load(ctx, stderr)
	if err != nil {
		return err
	}
	defer m.Close()
	if g.closeDraft != nil {
		defer g.closeDraft()
	}
	promptIDs := encode(m)
	s, err := m.NewSession()
	if err != nil {
		return err
	}
	st, err := streamRun(s.GenerateTokens(ctx, promptIDs, g.options()...), len(promptIDs), g.maxTokens, stdout, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "memory: weights %s, session state %s\n", humanBytes(m.WeightBytes()), humanBytes(s.StateBytes()))
	if g.speculate != "" && st.err == nil && len(st.ids) > 1 {
		return compareSpeculation(ctx, m, text, g, st.ids, st.usage, st.decode, stderr)
	}
	return nil
}

// runStats is what streamRun saw of a generation.
type runStats struct {
	ids    []int32
	usage  k3.Usage
	decode time.Duration // from the first token to the last
	err    error         // the generation's, when the caller interrupted it
}

// streamRun prints a generation's text to stdout as it comes, then why
// it stopped and its speed to stderr. A failure is returned; an
// interruption (context.Canceled) is reported and kept in the stats.
func streamRun(gen iter.Seq2[k3.Token, error], promptToks, maxTokens int, stdout, stderr io.Writer) (runStats, error) {
	var st runStats
	start := time.Now()
	var first time.Duration
	var finish k3.FinishReason
	for tok, err := range gen {
		if err != nil {
			st.err = err
			break
		}
		if len(st.ids) == 0 {
			first = time.Since(start)
		}
		if tok.ID >= 0 {
			st.ids = append(st.ids, tok.ID)
		}
		if tok.Usage != nil {
			st.usage = *tok.Usage
		}
		finish = tok.Finish
		fmt.Fprint(stdout, tok.Text)
	}
	total := time.Since(start)
	n := len(st.ids)
	if n > 0 {
		fmt.Fprintln(stdout)
	}
	if st.err != nil && !errors.Is(st.err, context.Canceled) {
		return st, st.err
	}
	fmt.Fprintf(stderr, "stopped: %s\n", finishText(finish, st.err, maxTokens))
	if first > 0 {
		fmt.Fprintf(stderr, "prefill: %d tokens in %v (%.1f tokens/s, includes the first token)\n", promptToks, first.Round(time.Microsecond), float64(promptToks)/first.Seconds())
	}
	st.decode = total - first
	if n > 1 {
		fmt.Fprintf(stderr, "decode: %d more tokens in %v (%.1f tokens/s); %d generated in all\n", n-1, st.decode.Round(time.Microsecond), float64(n-1)/st.decode.Seconds(), n)
	} else {
		fmt.Fprintf(stderr, "decode: %d tokens generated\n", n)
	}
	return st, nil
}

// split reports whether -tp, -ep or -cp asks for more than one rank.
func (g *genFlags) split() bool { return g.layout.TP > 1 || g.layout.EP > 1 || g.layout.CP > 1 }

// openGroup loads -model split by -tp, -ep and -cp, for k3 run and k3
// chat, and starts a sequence on it (close the sequence, then the
// group). A group speculates only at a fixed depth with a drafter
// every rank can call alike: -speculate ngram with -draft-depth K.
func (g *genFlags) openGroup(ctx context.Context) (*k3.Group, *k3.GroupSession, error) {
	if g.model == "" {
		return nil, nil, fmt.Errorf("-tp, -ep and -cp split a checkpoint: give -model DIR (the embedded model is not split)")
	}
	if _, auto, err := g.depth(); g.speculate != "" && (g.speculate != "ngram" || auto || err != nil) {
		return nil, nil, fmt.Errorf("-speculate %s -draft-depth %s with -tp, -ep or -cp: a split model speculates with ngram at a fixed -draft-depth only", g.speculate, g.draftDepth)
	}
	if _, err := g.drafter(); err != nil {
		return nil, nil, err
	}
	if err := g.compileSchema(); err != nil {
		return nil, nil, err
	}
	opts := g.backend.loadOptions()
	if g.speculate != "" {
		k, _, _ := g.depth()
		opts = append(opts, k3.WithRollback(k))
	}
	grp, err := k3.LoadGroup(ctx, g.model, g.layout, opts...)
	if err != nil {
		return nil, nil, err
	}
	gs, err := grp.NewSession()
	if err != nil {
		grp.Close()
		return nil, nil, err
	}
	return grp, gs, nil
}

// runGroup is k3 run on a model split over the ranks -tp, -ep and -cp ask for.
func runGroup(ctx context.Context, g genFlags, encode func(*k3.Model) []int32, stdout, stderr io.Writer) error {
	grp, gs, err := g.openGroup(ctx)
	if err != nil {
		return err
	}
	defer grp.Close()
	defer gs.Close()
	ranks := grp.Ranks()
	promptIDs := encode(ranks[0])
	if _, err := streamRun(gs.GenerateTokens(ctx, promptIDs, g.options()...), len(promptIDs), g.maxTokens, stdout, stderr); err != nil {
		return err
	}
	var held int64
	for _, m := range ranks {
		held = max(held, m.ShardBytes())
	}
	fmt.Fprintf(stderr, "ranks: %d (%v), the largest holding %s of the weights' %s\n", len(ranks), grp.Layout(), humanBytes(held), humanBytes(ranks[0].WeightBytes()))
	return nil
}

// compareSpeculation prints a speculative run's acceptance, then runs the
// same generation without speculation to time it against.
func compareSpeculation(ctx context.Context, m *k3.Model, text string, g genFlags, ids []int32, u k3.Usage, spec time.Duration, stderr io.Writer) error {
	passes := len(ids) - u.AcceptedTokens // every verify pass yields its accepted drafts and one token more
	share := 0.0
	if u.DraftTokens > 0 {
		share = 100 * float64(u.AcceptedTokens) / float64(u.DraftTokens)
	}
	fmt.Fprintf(stderr, "speculation (%s, depth %s): %d drafts, %d accepted (%.0f%%), %.2f tokens a pass\n",
		g.speculate, g.draftDepth, u.DraftTokens, u.AcceptedTokens, share, float64(len(ids))/float64(max(passes, 1)))
	plainFlags := g
	plainFlags.speculate = ""
	s, err := m.NewSession()
	if err != nil {
		return err
	}
	defer s.Close()
	var plain []int32
	var first time.Duration
	start := time.Now()
	for tok, err := range s.Generate(ctx, text, plainFlags.options()...) {
		if err != nil {
			return err
		}
		if len(plain) == 0 {
			first = time.Since(start)
		}
		if tok.ID >= 0 {
			plain = append(plain, tok.ID)
		}
	}
	dec := time.Since(start) - first
	if g.rejection && g.temperature > 0 {
		// Rejection sampling matches plain sampling in distribution, not
		// token for token: time the plain run over as many tokens.
		fmt.Fprintf(stderr, "plain sampling of %d tokens: %.1f tokens/s after the first; speculation %.2fx as fast per token\n",
			len(plain), float64(len(plain)-1)/dec.Seconds(), (dec.Seconds()/float64(max(len(plain)-1, 1)))/(spec.Seconds()/float64(max(len(ids)-1, 1))))
		return nil
	}
	if !slices.Equal(plain, ids) {
		return fmt.Errorf("k3 run: speculative decoding gave other tokens than plain decoding (a bug; please report it)")
	}
	fmt.Fprintf(stderr, "plain decoding of the same %d tokens: %.1f tokens/s after the first; speculation %.2fx as fast\n",
		len(plain), float64(len(plain)-1)/dec.Seconds(), dec.Seconds()/spec.Seconds())
	return nil
}

const chatHelp = `Type a message and press Enter. Commands:
  /help    this text
  /reset   forget the conversation (keeps the system message)
  /exit    leave (so do /quit, Ctrl-D and Ctrl-C at the prompt)
Ctrl-C while the model answers stops the answer.`

func runChat(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("chat", flag.ContinueOnError)
	var g genFlags
	g.register(fs, 512)
	system := fs.String("system", "You are a helpful assistant.", "system message")
	if err := parseFlags(fs, "chat [-model DIR] [-system TEXT] [-tp N] [-ep N] [-cp N] [sampling flags]\n\nInteractive multi-turn chat on stdin and stdout.", args, stdout, stderr); err != nil {
		return err
	}
	// Ctrl-C is the chat's own: it stops an answer, or leaves at the prompt.
	interrupts := make(chan os.Signal, 1)
	signal.Notify(interrupts, os.Interrupt)
	defer signal.Stop(interrupts)
	ctx = context.WithoutCancel(ctx)
	label := g.model
	if label == "" {
		label = "the embedded tiny model (trained on Go source, not on conversations: its answers continue code)"
	}
	if g.split() {
		grp, gs, err := g.openGroup(ctx)
		if err != nil {
			return err
		}
		defer grp.Close()
		defer gs.Close()
		fmt.Fprintf(stdout, "k3 chat with %s over %d ranks (%v); /help for commands.\n", label, len(grp.Ranks()), grp.Layout())
		return chatLoop(ctx, grp.Ranks()[0], gs, &g, *system, os.Stdin, stdout, interrupts)
	}
	m, err := g.load(ctx, stderr)
	if err != nil {
		return err
	}
	defer m.Close()
	if g.closeDraft != nil {
		defer g.closeDraft()
	}
	s, err := m.NewSession()
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Fprintf(stdout, "k3 chat with %s; /help for commands.\n", label)
	return chatLoop(ctx, m, s, &g, *system, os.Stdin, stdout, interrupts)
}

// chatLoop runs the conversation: lines from in, answers to out. A value
// on interrupts stops the answer being generated, or ends the chat when
// it arrives at the prompt.
// chatSession is the conversation's sequence: a k3.Session, or a
// k3.GroupSession on a split model.
type chatSession interface {
	GenerateTokens(ctx context.Context, prompt []int32, opts ...k3.GenerateOption) iter.Seq2[k3.Token, error]
	Forward(ctx context.Context, tokens []int32) ([]float32, error)
	Reset() error
}

// chatLoop runs the conversation in s, with m's tokenizer and chat
// format (a split model's rank 0).
func chatLoop(ctx context.Context, m *k3.Model, s chatSession, g *genFlags, system string, in io.Reader, out io.Writer, interrupts <-chan os.Signal) error {
	endTurn, hasEnd := m.Tokenizer().Special("<|im_end|>")
	lines := make(chan string)
	readErr := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			lines <- sc.Text()
		}
		readErr <- sc.Err()
		close(lines)
	}()
	// The session keeps the conversation: each turn sends only what is new.
	pending := []k3.Message{{Role: "system", Content: system}}
	for {
		fmt.Fprint(out, "> ")
		var line string
		select {
		case l, ok := <-lines:
			if !ok {
				fmt.Fprintln(out)
				return <-readErr
			}
			line = strings.TrimSpace(l)
		case <-interrupts:
			fmt.Fprintln(out)
			return nil
		}
		switch line {
		case "":
			continue
		case "/exit", "/quit":
			return nil
		case "/help":
			fmt.Fprintln(out, chatHelp)
			continue
		case "/reset":
			if err := s.Reset(); err != nil {
				return err
			}
			pending = []k3.Message{{Role: "system", Content: system}}
			fmt.Fprintln(out, "(conversation cleared)")
			continue
		}
		prompt := m.ChatTokens(append(pending, k3.Message{Role: "user", Content: line}))
		pending = nil
		turn, cancel := context.WithCancel(ctx)
		stopWatch := make(chan struct{})
		go func() {
			select {
			case <-interrupts:
				cancel()
			case <-stopWatch:
			}
		}()
		var finish k3.FinishReason
		var genErr error
		for tok, err := range s.GenerateTokens(turn, prompt, g.options()...) {
			if err != nil {
				genErr = err
				break
			}
			finish = tok.Finish
			fmt.Fprint(out, tok.Text)
		}
		close(stopWatch)
		cancel()
		fmt.Fprintln(out)
		if errors.Is(genErr, k3.ErrContextFull) || finish == k3.FinishContext {
			fmt.Fprintf(out, "(the conversation fills the model's context of %d tokens: /reset to start over)\n", m.ContextLength())
			continue
		}
		if genErr != nil && !errors.Is(genErr, context.Canceled) {
			return genErr
		}
		if finish != k3.FinishStop {
			// The answer did not end its turn itself (interrupted, token
			// limit, stop string): close it so the next turn is well formed.
			if errors.Is(genErr, context.Canceled) {
				fmt.Fprintln(out, "(answer stopped)")
			} else if finish == k3.FinishLength {
				fmt.Fprintf(out, "(answer cut at %d tokens)\n", g.maxTokens)
			}
			if hasEnd {
				if _, err := s.Forward(ctx, []int32{endTurn}); err != nil {
					return err
				}
			}
		}
	}
}

func runNewTiny(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("new-tiny", flag.ContinueOnError)
	preset := fs.String("preset", "k31pro", "layout: "+strings.Join(tiny.Presets, ", "))
	out := fs.String("out", "", "directory to write")
	seed := fs.Uint64("seed", 1, "random seed")
	bf16 := fs.Bool("bf16", false, "store matrices as bf16")
	set := fs.String("set", "", "a JSON object of config fields to change in the preset (the text config's; objects such as linear_attn_config merge, null clears a field)")
	if err := parseFlags(fs, "new-tiny -preset "+strings.Join(tiny.Presets, "|")+" -out DIR [-seed N] [-bf16] [-set JSON]", args, stdout, stderr); err != nil {
		return err
	}
	if *out == "" || fs.NArg() > 0 {
		fs.Usage()
		return errUsage
	}
	o := tiny.Options{Seed: *seed, BF16: *bf16}
	if *set != "" {
		var fields map[string]any
		if err := json.Unmarshal([]byte(*set), &fields); err != nil {
			return fmt.Errorf("-set %q: want a JSON object: %w", *set, err)
		}
		o.Edit = func(text map[string]any) { mergeFields(text, fields) }
	}
	if err := tiny.Write(*out, *preset, o); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote a random-weight %s checkpoint to %s\n", *preset, *out)
	return nil
}

// mergeFields sets every field of src in dst: where both hold an object
// the objects merge, field by field; any other value (null included)
// replaces dst's.
func mergeFields(dst, src map[string]any) {
	for k, v := range src {
		if sub, ok := v.(map[string]any); ok {
			if d, ok := dst[k].(map[string]any); ok {
				mergeFields(d, sub)
				continue
			}
		}
		dst[k] = v
	}
}
