package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// ggufReader reads back what Write wrote, by the GGUF v3 layout.
type ggufReader struct {
	b   []byte
	pos int
	t   *testing.T
}

func (r *ggufReader) next(n int) []byte {
	r.t.Helper()
	require.LessOrEqual(r.t, r.pos+n, len(r.b), "read past the end at %d", r.pos)
	p := r.b[r.pos : r.pos+n]
	r.pos += n
	return p
}

func (r *ggufReader) u32() uint32 { return binary.LittleEndian.Uint32(r.next(4)) }
func (r *ggufReader) u64() uint64 { return binary.LittleEndian.Uint64(r.next(8)) }
func (r *ggufReader) str() string { return string(r.next(int(r.u64()))) }

// value reads a metadata value of type typ, returning scalars and the
// length of arrays.
func (r *ggufReader) value(typ uint32) any {
	switch typ {
	case valUint32, valInt32:
		return r.u32()
	case valFloat32:
		return math.Float32frombits(r.u32())
	case valString:
		return r.str()
	case valArray:
		elem, n := r.u32(), r.u64()
		for range n {
			r.value(elem)
		}
		return n
	}
	r.t.Fatalf("metadata type %d", typ)
	return nil
}

type readTensor struct {
	dims []uint64
	typ  uint32
	off  uint64
}

// TestWrite: the file parses as GGUF v3 with the shape's metadata and
// tensors, every tensor's data aligned, in order, inside the file, which
// ends with the last one; norms are 1 and matrices bf16 draws of scale
// 0.02.
func TestWrite(t *testing.T) {
	s := Shape{Layers: 2, Width: 36, FF: 50, Heads: 2, Vocab: 300} // sizes that need padding
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, s, 7))
	r := &ggufReader{b: buf.Bytes(), t: t}
	require.Equal(t, "GGUF", string(r.next(4)))
	require.Equal(t, uint32(3), r.u32())
	nt, nkv := r.u64(), r.u64()
	want := s.tensors()
	require.Equal(t, uint64(len(want)), nt)
	meta := map[string]any{}
	for range nkv {
		k := r.str()
		meta[k] = r.value(r.u32())
	}
	require.Equal(t, "llama", meta["general.architecture"])
	require.Equal(t, uint32(36), meta["llama.embedding_length"])
	require.Equal(t, uint32(2), meta["llama.block_count"])
	require.Equal(t, uint32(50), meta["llama.feed_forward_length"])
	require.Equal(t, uint32(2), meta["llama.attention.head_count"])
	require.Equal(t, uint32(18), meta["llama.rope.dimension_count"])
	require.Equal(t, uint64(300), meta["tokenizer.ggml.tokens"])
	require.Equal(t, uint64(300), meta["tokenizer.ggml.scores"])
	require.Equal(t, uint64(300), meta["tokenizer.ggml.token_type"])
	got := map[string]readTensor{}
	var order []string
	for range nt {
		name := r.str()
		dims := make([]uint64, r.u32())
		for i := range dims {
			dims[i] = r.u64()
		}
		got[name] = readTensor{dims: dims, typ: r.u32(), off: r.u64()}
		order = append(order, name)
	}
	data := (r.pos + alignment - 1) &^ (alignment - 1)
	end := uint64(0)
	var params int64
	for i, w := range want {
		require.Equal(t, w.name, order[i])
		g := got[w.name]
		require.Equal(t, w.dims, g.dims, w.name)
		require.Equal(t, w.typ, g.typ, w.name)
		require.Zero(t, g.off%alignment, "%s at %d", w.name, g.off)
		require.Equal(t, end, g.off, "%s follows the tensor before it", w.name)
		end = g.off + (w.bytes()+alignment-1)&^(alignment-1)
		if len(w.dims) == 2 && w.name != "token_embd.weight" {
			params += int64(w.dims[0] * w.dims[1])
		}
		p := buf.Bytes()[data+int(g.off):]
		if w.typ == typeF32 {
			require.Equal(t, float32(1), math.Float32frombits(binary.LittleEndian.Uint32(p)), w.name)
			continue
		}
		var sum, sq float64
		n := int(w.elems())
		for i := range n {
			v := float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(p[2*i:])) << 16))
			sum, sq = sum+v, sq+v*v
		}
		require.InDelta(t, 0.02, math.Sqrt(sq/float64(n)), 0.005, "%s: scale", w.name)
		require.InDelta(t, 0, sum/float64(n), 0.005, "%s: mean", w.name)
	}
	require.Equal(t, data+int(end), buf.Len(), "the file ends with the last tensor")
	require.Equal(t, s.ProductParams(), params)

	var again bytes.Buffer
	require.NoError(t, Write(&again, s, 7))
	require.Equal(t, buf.Bytes(), again.Bytes(), "a seed gives the same file")
	again.Reset()
	require.NoError(t, Write(&again, s, 8))
	require.NotEqual(t, buf.Bytes(), again.Bytes(), "another seed, other weights")
}

// TestWriteRefusesShapes: shapes llama.cpp could not load are refused,
// naming the field, and nothing is written.
func TestWriteRefusesShapes(t *testing.T) {
	good := Shape{Layers: 1, Width: 64, FF: 64, Heads: 4, Vocab: 300}
	for _, c := range []struct {
		edit func(*Shape)
		msg  string
	}{
		{func(s *Shape) { s.Layers = 0 }, "layers 0"},
		{func(s *Shape) { s.Width = -1 }, "width -1"},
		{func(s *Shape) { s.Heads = 5 }, "heads 5"},
		{func(s *Shape) { s.Heads = 64 }, "heads 64"},
		{func(s *Shape) { s.Vocab = 259 }, "vocabulary 259"},
		{func(s *Shape) { s.FF = 1<<20 + 1 }, "feed-forward 1048577"},
	} {
		s := good
		c.edit(&s)
		var buf bytes.Buffer
		err := Write(&buf, s, 1)
		require.ErrorContains(t, err, c.msg, fmt.Sprint(s))
		require.Zero(t, buf.Len())
	}
}

// TestRun writes the model and its sidecar, and reports a missing path.
func TestRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.gguf")
	s := Shape{Layers: 1, Width: 32, FF: 48, Heads: 2, Vocab: 260}
	require.NoError(t, run(path, s, 1))
	side, err := os.ReadFile(path + ".json")
	require.NoError(t, err)
	require.Contains(t, string(side), fmt.Sprintf(`"productParams":%d`, s.ProductParams()))
	require.ErrorContains(t, run("", s, 1), "no output file")
	bad := s
	bad.Layers = 0
	bad2 := filepath.Join(t.TempDir(), "bad.gguf")
	require.Error(t, run(bad2, bad, 1))
	_, err = os.Stat(bad2)
	require.True(t, os.IsNotExist(err), "a refused shape leaves no file")
}
