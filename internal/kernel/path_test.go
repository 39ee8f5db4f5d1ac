package kernel

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPathForced re-runs this test binary under K3_KERNEL and checks that
// the path it reports is capped there (never above what this CPU has).
func TestPathForced(t *testing.T) {
	if os.Getenv("K3_PATH_CHILD") != "" {
		os.Stdout.WriteString("path=" + Path() + "\n")
		return
	}
	if os.Getenv("K3_KERNEL") != "" {
		t.Skip("run without K3_KERNEL: the test compares capped paths with the CPU's own")
	}
	rank := map[string]int{"go": 0, "avx2": 1, "avx512": 2, "avx512+bf16": 3}
	here := rank[Path()]
	for _, c := range []struct{ env, want string }{{"go", "go"}, {"avx2", "avx2"}, {"avx512", "avx512"}, {"", Path()}} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestPathForced$")
		cmd.Env = append(os.Environ(), "K3_PATH_CHILD=1", "K3_KERNEL="+c.env)
		out, err := cmd.Output()
		require.NoError(t, err)
		_, got, ok := strings.Cut(string(out), "path=")
		require.True(t, ok, "%s", out)
		got, _, _ = strings.Cut(got, "\n")
		want := c.want
		if rank[want] > here {
			want = Path() // the CPU has less than the cap
		}
		assert.Equal(t, want, got, "K3_KERNEL=%s", c.env)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPathForced$")
	cmd.Env = append(os.Environ(), "K3_PATH_CHILD=1", "K3_KERNEL=avx-2")
	out, err := cmd.Output()
	require.NoError(t, err)
	assert.Contains(t, string(out), `K3_KERNEL="avx-2" not understood`)
}
