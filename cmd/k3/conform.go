package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"k3/internal/backends"
	"k3/internal/conform"
)

func runConform(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("conform", flag.ContinueOnError)
	fs.SetOutput(stderr)
	backend := fs.String("backend", "go", "compute backend: "+backends.Names())
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: k3 conform [-backend name] DIR|FILE...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return errUsage
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
