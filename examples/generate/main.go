// Command generate is the smallest complete use of the k3 SDK: load a
// model, stream a completion, print it.
//
//	go run ./examples/generate                      # embedded tiny model (random weights)
//	go run ./examples/generate -model /path/to/Kimi-K3 -prompt "Why is the sky blue?"
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"unicode"

	"k3/k3"
)

func main() {
	model := flag.String("model", "", "checkpoint directory (default: the embedded tiny model)")
	prompt := flag.String("prompt", "Once upon a time", "prompt")
	flag.Parse()

	// Ctrl-C cancels the context; generation stops within one decode step.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	var m *k3.Model
	var err error
	if *model == "" {
		fmt.Fprintln(os.Stderr, "using the", k3.TinyLabel)
		m, err = k3.LoadTiny(ctx)
	} else {
		m, err = k3.Load(ctx, *model)
	}
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	// Generate returns an iterator of tokens; each carries the text it
	// completes, never half a UTF-8 character.
	for tok, err := range m.Generate(ctx, *prompt, k3.WithMaxTokens(48), k3.WithTemperature(0.7), k3.WithSeed(1)) {
		if err != nil {
			log.Fatal(err)
		}
		if *model == "" {
			// Random weights emit arbitrary bytes, control characters
			// included: show those as dots so the terminal stays sane.
			tok.Text = strings.Map(visible, tok.Text)
		}
		fmt.Print(tok.Text)
	}
	fmt.Println()
}

// visible replaces control characters other than newline and tab.
func visible(r rune) rune {
	if unicode.IsControl(r) && r != '\n' && r != '\t' {
		return '.'
	}
	return r
}
