package k3

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoTensorDependency: applications that import only k3/k3 never build
// gorgonia (it stays behind k3/tensor) nor the plotting libraries.
func TestNoTensorDependency(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command(gobin, "list", "-deps", "k3/k3").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "gorgonia.org/") || strings.HasPrefix(dep, "gonum.org/") {
			t.Errorf("k3/k3 depends on %s", dep)
		}
	}
}
