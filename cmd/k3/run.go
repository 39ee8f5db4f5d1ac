package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode"

	"k3/internal/tiny"
	"k3/k3"
)

type genFlags struct {
	model                           string
	maxTokens                       int
	temperature, topP, minP, repPen float64
	topK                            int
	seed                            uint64
	backend                         string
}

func (g *genFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&g.model, "model", "", "checkpoint directory (default: the embedded tiny model with random weights)")
	fs.IntVar(&g.maxTokens, "max-tokens", 64, "most tokens to generate")
	fs.Float64Var(&g.temperature, "temperature", 0, "sampling temperature (0: greedy)")
	fs.IntVar(&g.topK, "top-k", 0, "keep the k most likely tokens (0: all)")
	fs.Float64Var(&g.topP, "top-p", 1, "nucleus sampling mass, in (0, 1]")
	fs.Float64Var(&g.minP, "min-p", 0, "drop tokens below min-p times the most likely")
	fs.Float64Var(&g.repPen, "repetition-penalty", 1, "penalty for tokens already seen (1: off)")
	fs.Uint64Var(&g.seed, "seed", 0, "random seed (reproducible sampling)")
	fs.StringVar(&g.backend, "backend", "go", "compute backend")
}

func (g *genFlags) options() []k3.GenerateOption {
	return []k3.GenerateOption{k3.WithMaxTokens(g.maxTokens), k3.WithTemperature(float32(g.temperature)), k3.WithTopK(g.topK),
		k3.WithTopP(float32(g.topP)), k3.WithMinP(float32(g.minP)), k3.WithRepetitionPenalty(float32(g.repPen)), k3.WithSeed(g.seed)}
}

func (g *genFlags) load(ctx context.Context, stderr io.Writer) (*k3.Model, error) {
	if g.model == "" {
		fmt.Fprintln(stderr, "k3: using the", k3.TinyLabel)
		return k3.LoadTiny(ctx, k3.WithBackend(g.backend))
	}
	return k3.Load(ctx, g.model, k3.WithBackend(g.backend))
}

func runRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var g genFlags
	g.register(fs)
	prompt := fs.String("prompt", "Hello", `prompt text ("-": read stdin)`)
	chat := fs.Bool("chat", false, "wrap the prompt as one user turn of the chat format")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	m, err := g.load(ctx, stderr)
	if err != nil {
		return err
	}
	defer m.Close()
	text := *prompt
	if text == "-" {
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			return err
		}
		text = string(b)
	}
	if *chat {
		text = m.ChatPrompt([]k3.Message{{Role: "user", Content: text}})
	}
	s, err := m.NewSession()
	if err != nil {
		return err
	}
	start := time.Now()
	var first time.Duration
	n := 0
	for tok, err := range s.Generate(ctx, text, g.options()...) {
		if err != nil {
			return err
		}
		if n == 0 {
			first = time.Since(start)
		}
		n++
		fmt.Fprint(stdout, g.shown(tok.Text))
	}
	total := time.Since(start)
	fmt.Fprintln(stdout)
	promptToks := s.Len() - n
	fmt.Fprintf(stderr, "prefill: %d tokens in %v (%.1f tokens/s, includes the first token)\n", promptToks, first.Round(time.Microsecond), float64(promptToks)/first.Seconds())
	if n > 1 {
		dec := total - first
		fmt.Fprintf(stderr, "decode: %d tokens in %v (%.1f tokens/s)\n", n-1, dec.Round(time.Microsecond), float64(n-1)/dec.Seconds())
	}
	fmt.Fprintf(stderr, "memory: weights %s, session state %s\n", humanBytes(m.WeightBytes()), humanBytes(s.StateBytes()))
	return nil
}

func runChat(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("chat", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var g genFlags
	g.register(fs)
	system := fs.String("system", "You are a helpful assistant.", "system message")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	m, err := g.load(ctx, stderr)
	if err != nil {
		return err
	}
	defer m.Close()
	s, err := m.NewSession()
	if err != nil {
		return err
	}
	// The session keeps the conversation: each turn sends only what is new.
	pending := []k3.Message{{Role: "system", Content: *system}}
	in := bufio.NewScanner(os.Stdin)
	for {
		fmt.Fprint(stdout, "> ")
		if !in.Scan() {
			fmt.Fprintln(stdout)
			return in.Err()
		}
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		if line == "/exit" || line == "/quit" {
			return nil
		}
		prompt := m.ChatPrompt(append(pending, k3.Message{Role: "user", Content: line}))
		pending = nil
		for tok, err := range s.Generate(ctx, prompt, g.options()...) {
			if err != nil {
				return err
			}
			fmt.Fprint(stdout, g.shown(tok.Text))
		}
		fmt.Fprintln(stdout)
	}
}

// shown is the text to print for a token: the embedded model's random
// weights emit arbitrary bytes, so its control characters (other than
// newline and tab) print as dots and cannot upset the terminal.
func (g *genFlags) shown(text string) string {
	if g.model != "" {
		return text
	}
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) && r != '\n' && r != '\t' {
			return '.'
		}
		return r
	}, text)
}

func runNewTiny(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("new-tiny", flag.ContinueOnError)
	fs.SetOutput(stderr)
	preset := fs.String("preset", "k31pro", "layout: "+strings.Join(tiny.Presets, ", "))
	out := fs.String("out", "", "directory to write")
	seed := fs.Uint64("seed", 1, "random seed")
	bf16 := fs.Bool("bf16", false, "store matrices as bf16")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if *out == "" {
		fmt.Fprintln(stderr, "usage: k3 new-tiny -preset k31pro|k3|kimi_linear|k31pro-100m -out DIR [-seed N] [-bf16]")
		return errUsage
	}
	if err := tiny.Write(*out, *preset, tiny.Options{Seed: *seed, BF16: *bf16}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote a random-weight %s checkpoint to %s\n", *preset, *out)
	return nil
}
