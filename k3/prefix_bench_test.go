package k3

import "testing"

// BenchmarkPrefixEvict times the prefix cache's eviction of one block from
// a tree of 27,000 (216 prompts of 125 blocks: the 100M preset's default
// 512 MiB cache of long prompts holds about that many), the blocks
// without pages or snapshots so that only finding and unlinking the
// least recently used leaf is timed.
func BenchmarkPrefixEvict(b *testing.B) {
	const prompts, depth = 216, 125
	build := func() *prefixCache {
		c := newPrefixCache(1<<40, &ledger{})
		for p := range prompts {
			n := &c.root
			for d := range depth {
				var toks [PrefixBlock]int32
				toks[0], toks[1] = int32(p), int32(d)
				if n.kids == nil {
					n.kids = map[uint64]*prefixNode{}
				}
				k := &prefixNode{parent: n, toks: toks, pos: (d + 1) * PrefixBlock, share: 1}
				n.kids[blockKey(toks[:])] = k
				c.stats.Blocks++
				c.stats.Bytes++
				n = k
			}
			c.clock++
			c.touch(n)
		}
		return c
	}
	c := build()
	b.ResetTimer()
	for range b.N {
		if c.stats.Blocks < prompts*depth/2 {
			b.StopTimer()
			c = build()
			b.StartTimer()
		}
		c.evictTo(c.stats.Bytes-1, false)
	}
}
