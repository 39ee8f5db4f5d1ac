package k3

import (
	"container/list"
	"sync"

	"k3/compute"
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

// graphs captures the feed-forward sublayers of decode passes on a backend
// that records graphs (compute.Capturer) and replays them, one graph per
// layer, bucket of rows and buffers: piecewise capture, the token mixers
// staying eager (their shapes follow the context length). A key's first
// call runs eagerly (it creates what the layer creates on first use), its
// second is captured and replayed, later ones are replayed. A layer that
// cannot be captured (one that reads the device on the host) is marked
// and runs eagerly from then on.
//
// A capture records everything queued on the backend meanwhile, so passes
// on a capturing backend run one at a time (pass.run holds mu).
type graphs struct {
	mu    sync.Mutex
	c     compute.Capturer
	byKey map[graphKey]*list.Element
	lru   list.List // of *graphEntry, most recent first

	captured, replayed, eager int64 // counters (GraphStats)
}

// graphKey names a captured call: the layer, its input and output views
// (buffer and element offset: a replay reads and writes those addresses)
// and its rows.
type graphKey struct {
	layer, rows   int
	in, out       any
	inOff, outOff int
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

// run runs fn, the feed-forward of layer l from in into out, through the
// cache; g.mu is held by the pass.
func (g *graphs) run(l int, in, out compute.Tensor, fn func() error) error {
	k := graphKey{layer: l, rows: in.Dim(0), in: in.Mem, out: out.Mem, inOff: in.Off, outOff: out.Off}
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
		g.replayed++
		return e.g.Replay()
	case e.uncapturable || e.calls == 1:
		g.eager++
		return fn()
	}
	gr, err := g.c.Capture(fn)
	if err != nil {
		// Nothing ran: the capture only recorded. The layer runs eagerly
		// now and from then on.
		e.uncapturable = true
		g.eager++
		return fn()
	}
	e.g = gr
	g.captured++
	return gr.Replay()
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

// GraphStats counts a model's feed-forward calls by how they ran on a
// backend that captures graphs: Captured graphs recorded, Replayed calls
// that replayed one, Eager calls run directly (a key's first, and those
// of layers that could not be captured). All zero on other backends or
// with WithoutGraphs.
type GraphStats struct {
	Captured, Replayed, Eager int64
}

// GraphStats reports the model's graph counters.
func (m *Model) GraphStats() GraphStats {
	if m.graphs == nil {
		return GraphStats{}
	}
	m.graphs.mu.Lock()
	defer m.graphs.mu.Unlock()
	return GraphStats{Captured: m.graphs.captured, Replayed: m.graphs.replayed, Eager: m.graphs.eager}
}
