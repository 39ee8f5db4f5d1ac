// Command batch serves many concurrent generations with continuous
// batching: a Batcher runs every active session's decode step in one pass
// over the weights, and sessions join and leave as they start and finish.
//
//	go run ./examples/batch -n 16
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"k3/k3"
)

func main() {
	model := flag.String("model", "", "checkpoint directory (default: the embedded tiny model)")
	n := flag.Int("n", 8, "concurrent requests")
	maxBatch := flag.Int("batch", 8, "largest batch per decode step")
	flag.Parse()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var m *k3.Model
	var err error
	if *model != "" {
		m, err = k3.Load(ctx, *model)
	} else {
		fmt.Fprintln(os.Stderr, "using the", k3.TinyLabel)
		m, err = k3.LoadTiny(ctx)
	}
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	b, err := m.NewBatcher(*maxBatch)
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Start(ctx); err != nil { // serves until ctx is cancelled
		log.Fatal(err)
	}

	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for i := 0; i < *n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := m.NewSession() // one session per conversation
			if err != nil {
				log.Fatal(err)
			}
			count := 0
			for tok, err := range b.Generate(ctx, s, fmt.Sprintf("request %d:", i), k3.WithMaxTokens(32), k3.WithTemperature(0.8), k3.WithSeed(uint64(i))) {
				if err != nil {
					log.Fatal(err)
				}
				if tok.ID >= 0 { // ID -1: a reply that ended before its first token
					count++
				}
			}
			mu.Lock()
			total += count
			mu.Unlock()
		}()
	}
	wg.Wait()
	el := time.Since(start)
	fmt.Printf("%d requests, %d tokens in %v: %.0f tokens/s\n", *n, total, el.Round(time.Millisecond), float64(total)/el.Seconds())
}
