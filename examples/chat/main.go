// Command chat holds a multi-turn conversation in one session: each turn
// sends only the new user message, because the session keeps the history
// (KDA states and attention caches) from the turns before.
//
//	go run ./examples/chat                 # a scripted conversation
//	go run ./examples/chat -model DIR -i   # interactive, reading stdin
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"os"

	"k3/k3"
)

func main() {
	model := flag.String("model", "", "checkpoint directory (default: the embedded tiny model)")
	interactive := flag.Bool("i", false, "read user turns from stdin")
	flag.Parse()
	ctx := context.Background()

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

	s, err := m.NewSession()
	if err != nil {
		log.Fatal(err)
	}
	turns := []string{"Hello! Who are you?", "Tell me a short joke.", "Thanks!"}
	next := func(i int) (string, bool) {
		if i < len(turns) {
			return turns[i], true
		}
		return "", false
	}
	if *interactive {
		in := bufio.NewScanner(os.Stdin)
		next = func(int) (string, bool) {
			fmt.Print("> ")
			return in.Text(), in.Scan()
		}
	}
	system := []k3.Message{{Role: "system", Content: "You are a concise assistant."}}
	for i := 0; ; i++ {
		line, ok := next(i)
		if !ok {
			break
		}
		// The first turn carries the system message too; later turns only
		// their own message. ChatPrompt ends with an open assistant turn.
		msgs := append(system, k3.Message{Role: "user", Content: line})
		system = nil
		fmt.Printf("user: %s\nassistant: ", line)
		// Generation stops at <|im_end|>, which the session keeps, so the
		// next turn continues the same conversation.
		for tok, err := range s.Generate(ctx, m.ChatPrompt(msgs), k3.WithMaxTokens(40)) {
			if err != nil {
				log.Fatal(err)
			}
			fmt.Print(tok.Text)
		}
		fmt.Printf("\n(session holds %d tokens)\n\n", s.Len())
	}
}
