package k3_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/ascend"
	"k3/k3"
)

// On the Ascend backend a decode step of static shapes launches its simple
// operations' executors again instead of preparing them (aclnn phase 1):
// after the first steps, most of a step's cached operations are reused.
func TestAscendDecodeReusesExecutors(t *testing.T) {
	configs, err := filepath.Glob("../testdata/model/*/config.json")
	require.NoError(t, err)
	require.NotEmpty(t, configs)
	for _, cfg := range configs {
		dir := filepath.Dir(cfg)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			b, err := ascend.OpenHost(ascend.Options{ArenaBytes: 256 << 20})
			require.NoError(t, err)
			defer b.Close()
			m, err := k3.Load(context.Background(), dir, k3.WithComputeBackend(b))
			require.NoError(t, err)
			defer m.Close()
			s, err := m.NewSession()
			require.NoError(t, err)
			defer s.Close()
			_, err = s.Forward(context.Background(), []int32{1, 2, 3, 4, 5})
			require.NoError(t, err)
			var prepared, reused int64
			for step := range 6 {
				p0, r0 := b.Executors()
				w0 := b.Waits()
				_, err = s.Forward(context.Background(), []int32{int32(6 + step)})
				require.NoError(t, err)
				p1, r1 := b.Executors()
				prepared, reused = p1-p0, r1-r0
				t.Logf("decode step %d: %d executors prepared, %d launched again; %d waits for the stream", step, prepared, reused, b.Waits()-w0)
			}
			require.Greater(t, reused, 3*prepared, "the last step reuses most of its executors")
		})
	}
}
