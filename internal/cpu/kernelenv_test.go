package cpu

import (
	"os"
	"testing"
)

// TestKernelVariables reads the variables that choose the kernels. The
// kernel package reads them at init, before go test records what a test
// reads, so without this go test's cache would answer a run under another
// K3_KERNEL or K3_AMX with the default path's results.
func TestKernelVariables(t *testing.T) {
	t.Logf("K3_KERNEL=%q K3_AMX=%q", os.Getenv("K3_KERNEL"), os.Getenv("K3_AMX"))
}
