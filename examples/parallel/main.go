// Command parallel splits a checkpoint over ranks (tensor parallel over
// heads and MLP columns, expert parallel over routed experts, or context
// parallel over a sequence's positions), prints the share of the weights
// each rank holds, and checks that the split model generates the tokens
// one rank does.
//
//	go run ./examples/parallel -model testdata/model/tiny_k31pro -tp 2 -ep 4
//	go run ./examples/parallel -cp 4 -prompt 200
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"slices"

	"k3/comm"
	"k3/k3"
)

func main() {
	model := flag.String("model", "testdata/model/tiny_k31pro", "checkpoint directory")
	tp := flag.Int("tp", 1, "tensor-parallel ranks")
	ep := flag.Int("ep", 1, "expert-parallel ranks")
	cp := flag.Int("cp", 1, "context-parallel ranks (with -tp each CP slice is a TP group; -ep beside it must be -tp times -cp)")
	promptLen := flag.Int("prompt", 8, "prompt tokens")
	tokens := flag.Int("tokens", 16, "tokens to generate")
	dispatch := flag.Bool("dispatch", false, "send tokens to the experts' ranks (all-to-all-v) instead of all-reducing")
	splitIndexer := flag.Bool("split-indexer", false, "split the Lightning Indexer's heads over the TP ranks too (all-reducing its scores)")
	flag.Parse()
	ctx := context.Background()
	prompt := make([]int32, *promptLen)
	for i := range prompt {
		prompt[i] = int32(1 + (i*131+17)%250)
	}

	one, err := k3.Load(ctx, *model)
	if err != nil {
		log.Fatal(err)
	}
	defer one.Close()
	s, err := one.NewSession()
	if err != nil {
		log.Fatal(err)
	}
	var want []int32
	for tok, err := range s.GenerateTokens(ctx, prompt, k3.WithMaxTokens(*tokens)) {
		if err != nil {
			log.Fatal(err)
		}
		want = append(want, tok.ID)
	}

	if *tp == 1 && *ep == 1 && *cp == 1 {
		*tp, *ep = 2, 2
	}
	g, err := k3.LoadGroup(ctx, *model, k3.Layout{TP: *tp, EP: *ep, CP: *cp, Dispatch: *dispatch, SplitIndexer: *splitIndexer})
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	fmt.Printf("%v: %d ranks; one rank holds %d weight bytes\n", g.Layout(), g.Layout().Ranks(), one.ShardBytes())
	for r, m := range g.Ranks() {
		fmt.Printf("  rank %d holds %d (%.3f)\n", r, m.ShardBytes(), float64(m.ShardBytes())/float64(one.ShardBytes()))
	}
	gs, err := g.NewSession()
	if err != nil {
		log.Fatal(err)
	}
	defer gs.Close()
	before := g.Stats()
	var got []int32
	for tok, err := range gs.GenerateTokens(ctx, prompt, k3.WithMaxTokens(*tokens)) {
		if err != nil {
			log.Fatal(err)
		}
		got = append(got, tok.ID)
	}
	st := g.Stats().Sub(before)
	fmt.Printf("collectives sent %d bytes over the ranks for %d tokens: all-reduce %d, all-to-all-v %d, all-gather %d, send %d\n",
		st.TotalBytes(), len(prompt)+len(got), st.Bytes[comm.OpAllReduce], st.Bytes[comm.OpAllToAllV], st.Bytes[comm.OpAllGather], st.Bytes[comm.OpSend])
	if !slices.Equal(got, want) {
		log.Fatalf("split model generated %v, one rank %v", got, want)
	}
	fmt.Printf("same %d tokens as one rank\n", len(got))
}
