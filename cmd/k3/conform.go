package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"k3/internal/backends"
	"k3/internal/conform"
	"k3/internal/kernel"
	"k3/k3"
)

func runConform(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("conform", flag.ContinueOnError)
	backend := addBackendFlags(fs)
	tp := fs.Int("tp", 1, "tensor-parallel ranks for the model cases (heads, MLP columns)")
	ep := fs.Int("ep", 1, "expert-parallel ranks for the model cases (routed experts)")
	cp := fs.Int("cp", 1, "context-parallel ranks for the model cases (positions; with -tp each CP slice is a TP group; -ep beside it must be the rank count, -tp times -cp)")
	dispatch := fs.Bool("dispatch", false, "with -ep: send tokens to the experts' ranks by all-to-all-v instead of all-reducing partial sums")
	splitIndexer := fs.Bool("split-indexer", false, "with -tp: split the Lightning Indexer's heads too, all-reducing its scores before the top-k")
	if err := parseFlags(fs, "conform [-backend NAME] [-tp N] [-ep N] [-cp N] [-dispatch] [-split-indexer] DIR|FILE...", args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errUsage
	}
	if *tp < 1 || *ep < 1 || *cp < 1 {
		return fmt.Errorf("-tp %d -ep %d -cp %d: rank counts must be at least 1", *tp, *ep, *cp)
	}
	layout := k3.Layout{TP: *tp, EP: *ep, CP: *cp, Dispatch: *dispatch, SplitIndexer: *splitIndexer}
	if err := layout.Validate(); err != nil {
		return err
	}
	if layout.Ranks() > 1 && backend.name != "go" && backend.name != "ascend-host" {
		return fmt.Errorf("-tp/-ep/-cp run the model cases on one backend per rank: go or ascend-host")
	}
	b, err := backends.OpenWith(backend.name, backend.options())
	if err != nil {
		return err
	}
	defer b.Close()
	if strings.HasPrefix(b.Name(), "go") {
		// Which kernels ran, on stderr: under K3_KERNEL a run says
		// whether the path it asks for runs on this CPU.
		fmt.Fprintf(stderr, "k3 conform: backend %s, kernel path %s\n", b.Name(), kernel.Path())
	}
	cases, err := conform.Discover(fs.Args()...)
	if err != nil {
		return err
	}
	if len(cases) == 0 {
		return fmt.Errorf("no conformance cases in %s (a case is a golden .safetensors file, or a model directory with expected.safetensors)", strings.Join(fs.Args(), ", "))
	}
	if layout.Ranks() > 1 {
		// The layer cases do not split; under a layout only the model
		// cases say anything about it.
		model := cases[:0]
		for _, c := range cases {
			if c.Op == "model.forward" {
				model = append(model, c)
			}
		}
		if cases = model; len(cases) == 0 {
			return fmt.Errorf("-tp/-ep: no model cases in %s", strings.Join(fs.Args(), ", "))
		}
	}
	passed, failed, skipped := 0, 0, 0
	for r := range conform.RunLayout(ctx, b, cases, layout) {
		fmt.Fprintln(stdout, r)
		switch {
		case r.Skipped:
			skipped++
		case r.Pass:
			passed++
		default:
			failed++
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if skipped > 0 {
		// A checkpoint the layout cannot split says nothing about the
		// engine; a run where no case passed still fails.
		fmt.Fprintf(stdout, "%d passed, %d failed, %d skipped (the layout does not fit them)\n", passed, failed, skipped)
	} else {
		fmt.Fprintf(stdout, "%d passed, %d failed\n", passed, failed)
	}
	if failed > 0 || passed == 0 {
		return errFailed
	}
	return nil
}
