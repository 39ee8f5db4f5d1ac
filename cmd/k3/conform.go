package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"k3/internal/backends"
	"k3/internal/conform"
)

func runConform(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("conform", flag.ContinueOnError)
	backend := fs.String("backend", "go", "compute backend: "+backends.Names())
	if err := parseFlags(fs, "conform [-backend NAME] DIR|FILE...", args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errUsage
	}
	b, err := backends.Open(*backend)
	if err != nil {
		return err
	}
	defer b.Close()
	cases, err := conform.Discover(fs.Args()...)
	if err != nil {
		return err
	}
	if len(cases) == 0 {
		return fmt.Errorf("no conformance cases in %s (a case is a golden .safetensors file, or a model directory with expected.safetensors)", strings.Join(fs.Args(), ", "))
	}
	passed, failed := 0, 0
	for r := range conform.Run(ctx, b, cases) {
		fmt.Fprintln(stdout, r)
		if r.Pass {
			passed++
		} else {
			failed++
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d passed, %d failed\n", passed, failed)
	if failed > 0 || passed == 0 {
		return errFailed
	}
	return nil
}
