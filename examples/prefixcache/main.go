// Command prefixcache shows the prefix cache at work and what a router
// sees of it: two requests share a long system prompt, the second resumes
// from the first's cached state (Usage.CachedTokens), and a watcher of
// the cache (Model.WatchPrefixCache, what `k3 serve -kv-events` publishes
// for llm-d) prints each change to the blocks a new prompt can reuse.
//
//	go run ./examples/prefixcache
package main

import (
	"context"
	"fmt"
	"log"
	"strings"

	"k3/k3"
)

func main() {
	ctx := context.Background()
	m, err := k3.LoadTiny(ctx, k3.WithPrefixCache(64<<20))
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	// The watcher is called with the cache locked, once with the blocks
	// reusable now, then once per change: it must only take note.
	var seen []string
	stop, err := m.WatchPrefixCache(func(evs []k3.KVEvent) {
		for _, ev := range evs {
			seen = append(seen, fmt.Sprintf("%v: %d blocks (%d tokens)", ev.Kind, len(ev.Hashes), len(ev.Tokens)))
		}
	})
	if err != nil {
		log.Fatal(err)
	}
	defer stop()

	system := "// Package stack implements a LIFO stack.\n" + strings.Repeat("// It is safe for one goroutine at a time.\n", 40)
	for i, tail := range []string{"func New() *Stack {\n", "func (s *Stack) Len() int {\n"} {
		var usage *k3.Usage
		for tok, err := range m.Generate(ctx, system+tail, k3.WithMaxTokens(16), k3.WithTemperature(0)) {
			if err != nil {
				log.Fatal(err)
			}
			if tok.Usage != nil {
				usage = tok.Usage
			}
		}
		fmt.Printf("request %d: %d prompt tokens, %d resumed from the cache\n", i+1, usage.PromptTokens, usage.CachedTokens)
	}
	fmt.Println("the watcher saw:")
	for _, line := range seen {
		fmt.Println("  " + line)
	}
	st := m.PrefixCacheStats()
	fmt.Printf("cache: %d blocks, %d KDA snapshots, %d bytes\n", st.Blocks, st.Snapshots, st.Bytes)
}
