package serve

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/k3"
)

// TestSchemaCache: a document compiles once while kept (the same
// schema back, least recently used out first past the bound), under
// concurrent requests too; errors and documents past schemaCacheDocMax
// are not kept.
func TestSchemaCache(t *testing.T) {
	c := newSchemaCache(3)
	doc := func(i int) []byte {
		return []byte(fmt.Sprintf(`{"type":"object","properties":{"p%d":{"type":"string","pattern":"^[a-z]{%d}$"}}}`, i, i+1))
	}
	first := make([]*k3.JSONSchema, 4)
	for i := range 3 {
		s, err := c.compile(doc(i))
		require.NoError(t, err)
		first[i] = s
	}
	again, err := c.compile(doc(0)) // 0 is now the most recent
	require.NoError(t, err)
	require.Same(t, first[0], again)
	_, err = c.compile(doc(3)) // evicts 1, the least recent
	require.NoError(t, err)
	for _, i := range []int{0, 2, 1} { // the kept ones first: compiling 1 again evicts one
		kept := i != 1
		s, err := c.compile(doc(i))
		require.NoError(t, err)
		if kept {
			require.Same(t, first[i], s, "schema %d kept", i)
		} else {
			require.NotSame(t, first[i], s, "schema %d evicted", i)
		}
	}
	require.LessOrEqual(t, c.lru.Len(), 3)
	require.Len(t, c.byDoc, c.lru.Len())

	bad := []byte(`{"type":"nope"}`)
	for range 2 {
		_, err := c.compile(bad)
		require.True(t, errors.Is(err, k3.ErrInvalidOption), "%v", err)
	}
	require.NotContains(t, c.byDoc, string(bad))

	big := []byte(`{"type":"string","description":"` + strings.Repeat("x", schemaCacheDocMax) + `"}`)
	a, err := c.compile(big)
	require.NoError(t, err)
	b, err := c.compile(big)
	require.NoError(t, err)
	require.NotSame(t, a, b, "a document past schemaCacheDocMax is compiled each time")

	c = newSchemaCache(8)
	var wg sync.WaitGroup
	got := make([]*k3.JSONSchema, 16)
	for g := range got {
		wg.Go(func() {
			s, err := c.compile(doc(g % 2))
			if err != nil {
				t.Error(err)
			}
			got[g] = s
		})
	}
	wg.Wait()
	for _, d := range []int{0, 1} {
		kept, err := c.compile(doc(d))
		require.NoError(t, err)
		n := 0
		for g := d; g < len(got); g += 2 {
			if got[g] == kept {
				n++
			}
		}
		require.Positive(t, n, "doc %d: some request got the kept schema", d)
	}
	require.Equal(t, 2, c.lru.Len())
}
