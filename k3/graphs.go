package k3

import (
	"container/list"
	"sync"

	"k3/compute"
	"k3/kda"
)

// graphMaxRows is the most rows of a feed-forward call that decode graphs
// capture: decode and verification passes; prefill chunks run eagerly.
const graphMaxRows = 16

// graphBucket is the rows a graph runs for rows rows: the next power of
// two, as vLLM's decode buckets, unless the pass has no room for it
// (then rows itself).
func graphBucket(rows, room int) int {
	n := 1
	for n < rows {
		n *= 2
	}
	if n > room {
		return rows
	}
	return n
}

// graphCapacity bounds the graphs a model keeps; the least recently
// replayed is closed first.
const graphCapacity = 512

// graphs captures sublayers of decode passes on a backend that records
// graphs (compute.Capturer) and replays them: piecewise capture. The
// feed-forward sublayers get one graph per layer, bucket of rows and
// buffers; the KDA token mixers one per layer, rows, buffers and the
// sessions' states (a replay updates the states it was captured on). The
// attention mixers stay eager: their shapes follow the context length. A
// key's first call runs eagerly (it creates what the layer creates on
// first use), its second is captured and replayed, later ones are
// replayed. A sublayer that cannot be captured (one that reads the device
// on the host) is marked and runs eagerly from then on.
//
// A capture records everything queued on the backend meanwhile, so passes
// on a capturing backend run one at a time (pass.run holds mu).
type graphs struct {
	mu    sync.Mutex
	c     compute.Capturer
	byKey map[graphKey]*list.Element
	lru   list.List // of *graphEntry, most recent first

	stats GraphStats
}

// graphKey names a captured call: the sublayer, its input and output views
// (buffer and element offset: a replay reads and writes those addresses),
// its rows and, for a token mixer, the state tensors of its sequences and
// their row offsets.
type graphKey struct {
	part          graphPart
	layer, rows   int
	in, out       any
	inOff, outOff int
	states        [2 * graphMaxRows]bufRef
	cu            [graphMaxRows + 1]int32
}

// graphPart is the sublayer a graph runs.
type graphPart uint8

const (
	graphFeedForward graphPart = iota
	graphKDA
)

// bufRef is a tensor's buffer and element offset: where a graph reads or
// writes it. Keys hold the buffer, so no other tensor can take its place
// while the key lives.
type bufRef struct {
	mem any
	off int
}

type graphEntry struct {
	key          graphKey
	calls        int
	g            compute.Graph
	uncapturable bool
}

// newGraphs returns the model's graph cache, or nil when b does not
// capture graphs.
func newGraphs(b compute.Backend) *graphs {
	c, ok := b.(compute.Capturer)
	if !ok {
		return nil
	}
	return &graphs{c: c, byKey: map[graphKey]*list.Element{}}
}

// key returns the key of sublayer part of layer l from in into out.
func (g *graphs) key(part graphPart, l int, in, out compute.Tensor) graphKey {
	return graphKey{part: part, layer: l, rows: in.Dim(0), in: in.Mem, out: out.Mem, inOff: in.Off, outOff: out.Off}
}

// kdaKey returns the key of layer l's KDA mixer from in into out over s,
// and whether so many sequences fit a key.
func (g *graphs) kdaKey(l int, in, out compute.Tensor, s *kda.Seqs) (graphKey, bool) {
	k := g.key(graphKDA, l, in, out)
	if 2*len(s.States) > len(k.states) || len(s.Cu) > len(k.cu) {
		return k, false
	}
	copy(k.cu[:], s.Cu)
	for i, st := range s.States {
		k.states[2*i] = bufRef{st.S.Mem, st.S.Off}
		k.states[2*i+1] = bufRef{st.Conv.Mem, st.Conv.Off}
	}
	return k, true
}

// run runs fn, the sublayer k names, through the cache; g.mu is held by
// the pass.
func (g *graphs) run(k graphKey, fn func() error) error {
	el, ok := g.byKey[k]
	if !ok {
		el = g.lru.PushFront(&graphEntry{key: k})
		g.byKey[k] = el
		if g.lru.Len() > graphCapacity {
			g.drop(g.lru.Back())
		}
	}
	g.lru.MoveToFront(el)
	e := el.Value.(*graphEntry)
	e.calls++
	switch {
	case e.g != nil:
		g.count(k.part, &g.stats.Replayed, &g.stats.MixersReplayed)
		return e.g.Replay()
	case e.uncapturable || e.calls == 1:
		g.count(k.part, &g.stats.Eager, &g.stats.MixersEager)
		return fn()
	}
	gr, err := g.c.Capture(fn)
	if err != nil {
		// Nothing ran: the capture only recorded. The sublayer runs
		// eagerly now and from then on.
		e.uncapturable = true
		g.count(k.part, &g.stats.Eager, &g.stats.MixersEager)
		return fn()
	}
	e.g = gr
	g.count(k.part, &g.stats.Captured, &g.stats.MixersCaptured)
	return gr.Replay()
}

// count adds a call to the total and, for a token mixer, to its share.
func (g *graphs) count(part graphPart, total, mixers *int64) {
	*total++
	if part == graphKDA {
		*mixers++
	}
}

func (g *graphs) drop(el *list.Element) {
	e := g.lru.Remove(el).(*graphEntry)
	delete(g.byKey, e.key)
	if e.g != nil {
		e.g.Close()
	}
}

// close releases every graph.
func (g *graphs) close() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.lru.Len() > 0 {
		g.drop(g.lru.Back())
	}
}

// GraphStats counts a model's calls of the sublayers it captures (the
// feed-forward sublayers and the KDA token mixers of decode passes) by how
// they ran on a backend that captures graphs: Captured graphs recorded,
// Replayed calls that replayed one, Eager calls run directly (a key's
// first, and those of sublayers that could not be captured). The Mixers
// fields are the token mixers' share of each. All zero on other backends
// or with WithoutGraphs.
type GraphStats struct {
	Captured, Replayed, Eager                   int64
	MixersCaptured, MixersReplayed, MixersEager int64
}

// GraphStats reports the model's graph counters.
func (m *Model) GraphStats() GraphStats {
	if m.graphs == nil {
		return GraphStats{}
	}
	m.graphs.mu.Lock()
	defer m.graphs.mu.Unlock()
	return m.graphs.stats
}
