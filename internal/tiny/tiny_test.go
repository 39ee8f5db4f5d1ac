package tiny

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k3/config"
	"k3/internal/safetensors"
)

// TestTensorsMatchGoldenCheckpoints checks the tensor list against the
// independently generated checkpoints of the conformance suite.
func TestTensorsMatchGoldenCheckpoints(t *testing.T) {
	for _, name := range []string{"tiny_k31pro", "tiny_k3", "tiny_kimi_linear", "tiny_rope_dsa"} {
		dir := filepath.Join("../../testdata/model", name)
		cfg, err := config.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		ck, err := safetensors.OpenCheckpoint(dir)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{}
		for _, n := range ck.Names() {
			ti, _, _ := ck.Tensor(n)
			want[strings.TrimPrefix(n, "language_model.")] = fmt.Sprint(ti.Shape)
		}
		ck.Close()
		got := map[string]string{}
		for _, ts := range Tensors(cfg) {
			got[ts.Name] = fmt.Sprint(ts.Shape)
		}
		for n, s := range want {
			if strings.HasSuffix(n, "A_log") {
				continue // stored padded or [1,1,H,1] in the goldens
			}
			if got[n] != s {
				t.Errorf("%s: %s has shape %s in the golden checkpoint, %q here", name, n, s, got[n])
			}
		}
		for n := range got {
			if _, ok := want[n]; !ok {
				t.Errorf("%s: %s is not in the golden checkpoint", name, n)
			}
		}
	}
}

func TestWriteDeterministic(t *testing.T) {
	for _, p := range []string{"k31pro", "k3", "kimi_linear"} {
		a, b := t.TempDir(), t.TempDir()
		for _, d := range []string{a, b} {
			if err := Write(d, p, Options{Seed: 3, BF16: true}); err != nil {
				t.Fatal(err)
			}
		}
		fa, err := safetensors.Open(filepath.Join(a, "model.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		fb, _ := safetensors.Open(filepath.Join(b, "model.safetensors"))
		for _, ti := range fa.Tensors() {
			x, _, _ := fa.Bytes(ti.Name)
			y, _, err := fb.Bytes(ti.Name)
			if err != nil || !slices.Equal(x, y) {
				t.Fatalf("%s: %s differs between runs with the same seed", p, ti.Name)
			}
		}
		fa.Close()
		fb.Close()
	}
	if err := Write(t.TempDir(), "nope", Options{}); err == nil {
		t.Error("unknown preset accepted")
	}
}
