package plan

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/config"
)

// The planner's parameter categories add up to the config's own count
// (which also counts norms, conv taps and biases: a fraction of a percent).
func TestCountsMatchConfig(t *testing.T) {
	dirs, err := filepath.Glob("../../testdata/model/*/config.json")
	require.NoError(t, err)
	for _, f := range dirs {
		c, err := config.Load(filepath.Dir(f))
		require.NoError(t, err)
		n := count(c)
		sum := n.attn + n.indexer + n.dense + n.routed + n.shared + n.embed + n.head
		total := float64(c.NumParams())
		assert.InEpsilon(t, total, sum, 0.05, "%s: categories %.0f, config %.0f", f, sum, total)
		assert.LessOrEqual(t, sum, total, f)
	}
}

func TestPlanShape(t *testing.T) {
	c, err := config.Load("../../testdata/model/tiny_k31pro")
	require.NoError(t, err)
	w := Workload{Context: 4096, Batch: 8, Prompt: 1024, WeightBytes: 2, KVBytes: 2, ActBytes: 2}
	one, err := Plan(c, Cards["a3"], 1, w)
	require.NoError(t, err)
	require.Len(t, one, 1)
	assert.Zero(t, one[0].CommMB, "one card moves nothing")
	four, err := Plan(c, Cards["a3"], 4, w)
	require.NoError(t, err)
	byLayout := map[Layout]Estimate{}
	for _, e := range four {
		byLayout[e.Layout] = e
	}
	tp4 := byLayout[Layout{TP: 4, CP: 1, DP: 1, EP: 4}]
	dp4 := byLayout[Layout{TP: 1, CP: 1, DP: 4, EP: 4}]
	cp4 := byLayout[Layout{TP: 1, CP: 4, DP: 1, EP: 4}]
	// Splitting heads shrinks the weights a card holds; splitting
	// sequences or positions shrinks its state.
	assert.Less(t, tp4.WeightsGB, dp4.WeightsGB)
	assert.Less(t, dp4.StateGB, tp4.StateGB)
	assert.Less(t, cp4.StateGB, tp4.StateGB)
	assert.Positive(t, tp4.CommMB)
	assert.Positive(t, cp4.CommMB)
	for i := 1; i < len(four); i++ {
		if four[i-1].Fits == four[i].Fits {
			assert.GreaterOrEqual(t, four[i-1].TokPerCardS, four[i].TokPerCardS)
		}
	}
	_, err = Plan(c, Cards["a3"], 4, Workload{Context: 0, Batch: 1, WeightBytes: 2, KVBytes: 2, ActBytes: 2})
	assert.Error(t, err)
	_, err = Plan(c, Card{Name: "x"}, 4, w)
	assert.Error(t, err)
}

// DeepSeek-V3.2 and its dense-MLA twin (R1's shape): the categories give
// the config's 672B parameters.
func TestCountsDeepSeek(t *testing.T) {
	for _, f := range []string{"../../docs/plan/deepseek_v32.json", "../../docs/plan/deepseek_r1.json"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		c, err := config.Parse(b)
		require.NoError(t, err)
		n := count(c)
		sum := n.attn + n.indexer + n.dense + n.routed + n.shared + n.embed + n.head
		assert.InEpsilon(t, float64(c.NumParams()), sum, 1e-3, f)
	}
}
