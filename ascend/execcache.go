package ascend

import (
	"container/list"
	"fmt"
	"math"
	"strconv"
	"unsafe"

	"k3/compute"
)

// execCacheSize bounds the repeatable executors a backend keeps.
const execCacheSize = 4096

// execCache holds repeatable executors by the key of the call that
// prepared them (runAs), least recently used last.
type execCache struct {
	byKey            map[string]*list.Element
	lru              list.List // of *execEntry
	prepared, reused int64
	keyBuf           []byte // the key being built (a lookup allocates no string)
}

type execEntry struct {
	key string
	op  prepared
	ts  []tensorDesc // kept while the executor lives
}

// runAs is run for an operation whose executor may be launched again:
// key names the operator and its attributes, and the operands' buffers,
// offsets, dtypes and views complete it. A cached executor is launched
// with no phase 1; a new one is made repeatable and cached. b.mu is held.
func (b *Backend) runAs(key string, prepare func(ts []tensorDesc) (prepared, error), operands ...operand) error {
	k, ok := b.execKey(key, operands)
	if !ok {
		return b.run(prepare, operands...)
	}
	c := &b.execs
	if e, hit := c.byKey[string(k)]; hit {
		c.lru.MoveToFront(e)
		c.reused++
		return b.launch(e.Value.(*execEntry).op)
	}
	full := string(k)
	ts, err := b.describe(operands)
	if err != nil {
		return err
	}
	keep := false
	defer func() {
		if !keep {
			destroy(ts...)
		}
	}()
	op, err := prepare(ts)
	if err != nil {
		return err
	}
	if err := op.repeat(); err != nil {
		return err
	}
	if c.byKey == nil {
		c.byKey = map[string]*list.Element{}
	}
	if c.lru.Len() >= execCacheSize && b.capture == nil { // a capture may hold the oldest: evict after it
		b.evict(c.lru.Back())
	}
	keep = true
	c.byKey[full] = c.lru.PushFront(&execEntry{key: full, op: op, ts: ts})
	c.prepared++
	return b.launch(op)
}

// evict destroys a cached executor after the work queued on every stream
// (it may still be queued).
func (b *Backend) evict(e *list.Element) {
	ent := e.Value.(*execEntry)
	b.execs.lru.Remove(e)
	delete(b.execs.byKey, ent.key)
	b.syncAll() // an error here belongs to the work, reported at its own sync
	ent.op.destroy()
	destroy(ent.ts...)
}

// dropExecs destroys every cached executor; the streams have drained.
func (b *Backend) dropExecs() {
	for e := b.execs.lru.Front(); e != nil; e = e.Next() {
		ent := e.Value.(*execEntry)
		ent.op.destroy()
		destroy(ent.ts...)
	}
	b.execs = execCache{}
}

// execKey completes key with the operands, in the cache's key buffer
// (valid until the next call); ok is false when an operand is not a live
// buffer (run then reports it).
func (b *Backend) execKey(key string, operands []operand) ([]byte, bool) {
	k := append(b.execs.keyBuf[:0], key...)
	for _, o := range operands {
		d, err := bufOf(o.t)
		if err != nil {
			return nil, false
		}
		k = append(k, '|')
		k = strconv.AppendInt(k, int64(d.off), 10)
		k = append(k, '+')
		k = strconv.AppendInt(k, int64(o.t.Off), 10)
		k = append(k, ' ')
		k = strconv.AppendInt(k, int64(o.t.DType), 10)
		if o.i64 {
			k = append(k, "i64"...)
		}
		if o.nz {
			k = append(k, "nz"...)
		}
		if o.stack {
			k = append(k, "stack"...)
			for _, v := range o.t.Dims[:o.t.Rank] {
				k = strconv.AppendInt(append(k, ','), int64(v), 10)
			}
		}
		for _, v := range o.view {
			k = strconv.AppendInt(append(k, ','), v, 10)
		}
		k = append(k, '/')
		for _, v := range o.strides {
			k = strconv.AppendInt(append(k, ','), v, 10)
		}
	}
	b.execs.keyBuf = k
	return k, true
}

// attr is a float attribute in a key, exactly.
func attr(v float32) string { return strconv.FormatUint(uint64(math.Float32bits(v)), 16) }

// Waits reports how many times the backend has waited for one of its
// streams: every Read, Write and FromHost, a host read inside an
// operation (the MoE routing), and the rare refill of the stage ring.
// On a device each wait drains the queue, so a decode step wants few.
func (b *Backend) Waits() int64 {
	b.lock()
	defer b.mu.Unlock()
	return b.waits
}

// Launches reports how many operators the backend and its side streams
// launched one by one, outside captures: what a step leaves to the host
// beside the graphs it replays.
func (b *Backend) Launches() int64 {
	b.lock()
	defer b.mu.Unlock()
	return b.launched
}

// Executors reports how many repeatable executors the backend prepared
// and how many calls launched a cached one again with no phase 1.
func (b *Backend) Executors() (prepared, reused int64) {
	b.lock()
	defer b.mu.Unlock()
	return b.execs.prepared, b.execs.reused
}

// intConstCap bounds the int32 constants a backend keeps on the device.
const intConstCap = 256

// intConsts holds small int32 vectors the compositions pass to
// operators (a recurrence's token counts and state indices), uploaded
// once and found by content, so that a decode step of static shapes
// uploads nothing and can be captured. Entries used during a capture
// stay for the backend's life: a graph reads them on every replay.
type intConsts struct {
	byKey map[string]*list.Element
	lru   list.List // of *intConst
}

type intConst struct {
	key    string
	t      compute.Tensor
	pinned bool
}

// constInts returns a device tensor holding vals; b.mu is held.
func (b *Backend) constInts(vals []int32) (compute.Tensor, error) {
	c := &b.ints
	raw := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(vals))), 4*len(vals))
	if e, ok := c.byKey[string(raw)]; ok { // a lookup by bytes allocates no string
		c.lru.MoveToFront(e)
		ic := e.Value.(*intConst)
		ic.pinned = ic.pinned || b.capture != nil
		return ic.t, nil
	}
	if b.capture != nil {
		return compute.Tensor{}, fmt.Errorf("%w: an int32 constant first needed inside the capture (run the step once before capturing it)", ErrCapturing)
	}
	t, err := b.allocTensor(compute.I32, max(len(vals), 1))
	if err != nil {
		return t, err
	}
	if err := b.put(t, vals); err != nil {
		b.freeBuf(t.Mem.(*devBuf))
		return t, err
	}
	if c.byKey == nil {
		c.byKey = map[string]*list.Element{}
	}
	for e := c.lru.Back(); c.lru.Len() >= intConstCap && e != nil; {
		prev := e.Prev()
		if ic := e.Value.(*intConst); !ic.pinned {
			c.lru.Remove(e)
			delete(c.byKey, ic.key)
			b.freeBuf(ic.t.Mem.(*devBuf))
		}
		e = prev
	}
	key := string(raw)
	c.byKey[key] = c.lru.PushFront(&intConst{key: key, t: t})
	return t, nil
}
