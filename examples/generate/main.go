// Command generate is the smallest complete use of the k3 SDK: load a
// model, stream a completion, print it.
//
//	go run ./examples/generate                      # the embedded tiny model completes Go code
//	go run ./examples/generate -model /path/to/Kimi-K3 -prompt "Why is the sky blue?"
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"

	"k3/k3"
)

func main() {
	model := flag.String("model", "", "checkpoint directory (default: the embedded tiny model)")
	prompt := flag.String("prompt", "// Reverse returns s with its runes in reverse order.\nfunc Reverse(s string) string {\n", "prompt")
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
	fmt.Print(*prompt)
	for tok, err := range m.Generate(ctx, *prompt, k3.WithMaxTokens(64), k3.WithTemperature(0.3), k3.WithSeed(1)) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Print(tok.Text)
	}
	fmt.Println()
}
