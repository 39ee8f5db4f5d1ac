package k3

import (
	"container/list"
	"reflect"
	"slices"
	"sync"

	"k3/compute"
	"k3/dsa"
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

// graphs captures pieces of decode passes on a backend that records
// graphs (compute.Capturer) and replays them: piecewise capture. A piece
// is a run of operations whose shapes are fixed once its key is: the
// feed-forward sublayers (one graph per layer, bucket of rows and
// buffers), the KDA token mixers (per layer, rows, buffers, the
// sessions' states and row offsets: a replay updates the states it was
// captured on), the attention mixers' pieces around their cache appends
// (dsa.Layer.Capture) and the AttnRes stream's steps
// (attnres.Stream.Capture). A key's first call runs eagerly (it
// creates what the piece creates on first use), its second is captured
// and replayed, later ones are replayed. A piece that cannot be captured
// (one that reads the device on the host) is marked and runs eagerly
// from then on.
//
// A capture records everything queued on the backend meanwhile, so passes
// on a capturing backend run one at a time (pass.run holds mu).
type graphs struct {
	mu    sync.Mutex
	c     compute.Capturer
	byKey map[graphKey]*list.Element
	lru   list.List // of *graphEntry, most recent first

	// The signature of the key being built (begin, dep, num): the
	// tensors and host integers a piece depends on besides its layer.
	sig  []bufRef
	ints []int32

	// inline runs every piece directly: set while a whole step is run or
	// captured (stepGraph), whose graph holds the pieces.
	inline bool
	// piecesOnly keeps whole steps off (tests of the pieces).
	piecesOnly bool

	stats GraphStats
}

// graphKey names a captured piece: its part, layer and rows, and a hash of
// its signature, which the entry keeps to confirm a match.
type graphKey struct {
	part        graphPart
	layer, rows int
	hash        uint64
}

// graphPart is the piece a graph runs.
type graphPart uint8

const (
	graphFeedForward graphPart = iota
	graphKDA
	graphAttnProject // dsa.PieceProject, ...
	graphAttnAttend
	graphAttnOutput
	graphAttnRes // a step of the AttnRes stream (the layer is the step)
	graphStep    // a whole decode pass (Batch.stepGraph)
)

// attnPart is the part of an attention mixer's piece.
func attnPart(p dsa.Piece) graphPart { return graphAttnProject + graphPart(p) }

// isMixer says whether a part belongs to a token mixer (GraphStats).
func (p graphPart) isMixer() bool {
	return p != graphFeedForward && p != graphAttnRes && p != graphStep
}

// bufRef is a tensor's buffer, element offset and length: where a graph
// reads or writes it. Entries hold the buffer, so no other tensor can
// take its place while the entry lives.
type bufRef struct {
	mem    any
	off, n int
}

type graphEntry struct {
	key          graphKey
	sig          []bufRef
	ints         []int32
	calls        int
	g            compute.Graph
	bytes        int64 // the device memory g keeps
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

// begin starts the signature of a key.
func (g *graphs) begin() {
	g.sig, g.ints = g.sig[:0], g.ints[:0]
}

// dep adds tensors a piece reads or writes to the signature.
func (g *graphs) dep(ts ...compute.Tensor) {
	for _, t := range ts {
		g.sig = append(g.sig, bufRef{t.Mem, t.Off, t.Len()})
	}
}

// num adds host integers a piece depends on to the signature.
func (g *graphs) num(v ...int32) {
	g.ints = append(g.ints, v...)
}

// key returns the key of part of layer l over rows rows with the
// signature begin, dep and num built.
func (g *graphs) key(part graphPart, l, rows int) graphKey {
	h := uint64(14695981039346656037) // FNV-1a over 64-bit words
	put := func(v uint64) {
		h = (h ^ v) * 1099511628211
	}
	for _, r := range g.sig {
		// The buffer's identity where it is a pointer; other handles
		// only collide more often, and entries confirm their signature.
		if v := reflect.ValueOf(r.mem); v.Kind() == reflect.Pointer {
			put(uint64(v.Pointer()))
		}
		put(uint64(r.off))
		put(uint64(r.n))
	}
	for _, v := range g.ints {
		put(uint64(uint32(v)))
	}
	return graphKey{part: part, layer: l, rows: rows, hash: h}
}

// capture returns the dsa.Layer.Capture of attention layer l of bt: its
// pieces through the cache, but for traced passes (whose reads would fail
// a capture) and passes of more than graphMaxRows rows.
func (g *graphs) capture(bt *Batch, l int) func(dsa.Piece, int, []compute.Tensor, []int32, func() error) error {
	return func(p dsa.Piece, rows int, deps []compute.Tensor, ints []int32, fn func() error) error {
		if bt.trace != nil || rows > graphMaxRows {
			return fn()
		}
		return g.runOn(attnPart(p), l, rows, deps, ints, fn)
	}
}

// attnres returns the attnres.Stream.Capture of p's stream: its steps
// through the cache, but for traced passes and passes of more than
// graphMaxRows rows.
func (g *graphs) attnres(p *pass) func(int, int, []compute.Tensor, func() error) error {
	return func(j, rows int, deps []compute.Tensor, fn func() error) error {
		if p.traced || rows > graphMaxRows {
			return fn()
		}
		return g.runOn(graphAttnRes, j, rows, deps, nil, fn)
	}
}

// runOn is run with the signature deps and ints.
func (g *graphs) runOn(part graphPart, l, rows int, deps []compute.Tensor, ints []int32, fn func() error) error {
	g.begin()
	g.dep(deps...)
	g.num(ints...)
	return g.run(part, l, rows, fn)
}

// matches says whether e was made for the signature being built.
func (e *graphEntry) matches(g *graphs) bool {
	return slices.Equal(e.sig, g.sig) && slices.Equal(e.ints, g.ints)
}

// run runs fn, the piece part of layer l over rows rows, through the
// cache, keyed by the signature begin, dep and num built; g.mu is held
// by the pass.
func (g *graphs) run(part graphPart, l, rows int, fn func() error) error {
	if g.inline {
		return fn()
	}
	k := g.key(part, l, rows)
	el, ok := g.byKey[k]
	if ok && !el.Value.(*graphEntry).matches(g) {
		g.drop(el) // a hash collision: the new signature takes the key
		ok = false
	}
	if !ok {
		el = g.lru.PushFront(&graphEntry{key: k, sig: slices.Clone(g.sig), ints: slices.Clone(g.ints)})
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
		g.count(part, ranReplayed)
		return e.g.Replay()
	case e.uncapturable || e.calls == 1:
		g.count(part, ranEager)
		return fn()
	}
	gr, err := g.c.Capture(fn)
	if err != nil {
		// Nothing ran: the capture only recorded. The sublayer runs
		// eagerly now and from then on.
		e.uncapturable = true
		g.count(part, ranEager)
		return fn()
	}
	e.g = gr
	e.bytes = gr.Bytes()
	g.stats.Bytes += e.bytes
	g.count(part, ranCaptured)
	return gr.Replay()
}

// How a call of a piece ran (GraphStats).
const (
	ranCaptured = iota
	ranReplayed
	ranEager
)

// count adds a call that ran as ran to the totals and, for a token mixer
// or a whole step, to its share.
func (g *graphs) count(part graphPart, ran int) {
	st := &g.stats
	total := [...]*int64{&st.Captured, &st.Replayed, &st.Eager}
	mixers := [...]*int64{&st.MixersCaptured, &st.MixersReplayed, &st.MixersEager}
	steps := [...]*int64{&st.StepsCaptured, &st.StepsReplayed, &st.StepsEager}
	*total[ran]++
	if part.isMixer() {
		*mixers[ran]++
	}
	if part == graphStep {
		*steps[ran]++
	}
}

func (g *graphs) drop(el *list.Element) {
	e := g.lru.Remove(el).(*graphEntry)
	delete(g.byKey, e.key)
	if e.g != nil {
		e.g.Close()
		g.stats.Bytes -= e.bytes
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

// GraphStats counts a model's calls of the pieces it captures (whole
// decode steps, or the feed-forward sublayers, token mixers and AttnRes
// steps of passes that cannot be captured whole) by how they ran on a
// backend that captures graphs: Captured graphs recorded, Replayed calls
// that replayed one, Eager calls run directly (a key's first, and those
// of pieces that could not be captured). The Mixers fields are the token
// mixers' share of each, the Steps fields the whole steps'. Bytes is the
// device memory the graphs kept now hold for their replays (scratch and
// workspaces, outside the memory budget, which counts sequence state);
// Kept is how many graphs are kept (at most 512, the least recently
// replayed closed first). All zero on other backends or with
// WithoutGraphs.
type GraphStats struct {
	Captured, Replayed, Eager                   int64
	MixersCaptured, MixersReplayed, MixersEager int64
	// Of the totals, whole decode steps (every piece in one graph).
	StepsCaptured, StepsReplayed, StepsEager int64
	Kept                                     int
	Bytes                                    int64
}

// GraphStats reports the model's graph counters.
func (m *Model) GraphStats() GraphStats {
	if m.graphs == nil {
		return GraphStats{}
	}
	m.graphs.mu.Lock()
	defer m.graphs.mu.Unlock()
	st := m.graphs.stats
	for el := m.graphs.lru.Front(); el != nil; el = el.Next() {
		if el.Value.(*graphEntry).g != nil {
			st.Kept++
		}
	}
	return st
}
