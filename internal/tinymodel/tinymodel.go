// Package tinymodel embeds the SDK's two tiny checkpoints, so that the
// examples, `k3 run` and the tests work with no download:
//
//   - gocode, the default: a K3.1 Pro-shaped model trained on the Go
//     standard library source by tools/train (its README gives the
//     commands and the figures), with its BPE tokenizer and DSpark draft
//     module.
//   - k31pro: random weights (written by `k3 new-tiny -preset k31pro -seed 1
//     -bf16`), smaller, for tests that exercise loading and layer kinds;
//     its output is not language.
package tinymodel

import (
	"embed"
	"io/fs"
)

//go:embed k31pro gocode
var files embed.FS

// Default returns the trained checkpoint directory.
func Default() fs.FS { return sub("gocode") }

// Random returns the random-weight checkpoint directory.
func Random() fs.FS { return sub("k31pro") }

func sub(dir string) fs.FS {
	s, err := fs.Sub(files, dir)
	if err != nil {
		panic(err) // the embedded directories are part of the build
	}
	return s
}

// Preset and Seed are how the random-weight checkpoint was generated.
const (
	Preset = "k31pro"
	Seed   = 1
)
