// Package tinymodel embeds one tiny K3.1 Pro-shaped checkpoint with random
// weights (written by `k3 new-tiny -preset k31pro -seed 1 -bf16`), so that
// the SDK's examples and `k3 run` work with no download. Its output is not
// language.
package tinymodel

import (
	"embed"
	"io/fs"
)

//go:embed k31pro
var files embed.FS

// FS returns the checkpoint directory.
func FS() fs.FS {
	sub, err := fs.Sub(files, "k31pro")
	if err != nil {
		panic(err) // the embedded directory is part of the build
	}
	return sub
}

// Preset and Seed are how the embedded checkpoint was generated.
const (
	Preset = "k31pro"
	Seed   = 1
)
