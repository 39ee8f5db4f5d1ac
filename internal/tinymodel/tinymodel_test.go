package tinymodel

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"k3/internal/tiny"
)

// TestEmbeddedIsReproducible regenerates the embedded random-weight checkpoint and
// compares every file, so the committed bytes and the generator never drift.
func TestEmbeddedIsReproducible(t *testing.T) {
	dir := t.TempDir()
	if err := tiny.Write(dir, Preset, tiny.Options{Seed: Seed, BF16: true}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"config.json", "model.safetensors", "tokenizer_config.json"} {
		want, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := fs.ReadFile(Random(), name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("embedded %s differs from a fresh `k3 new-tiny -preset %s -seed %d -bf16`", name, Preset, Seed)
		}
	}
}
