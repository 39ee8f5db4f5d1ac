// Command llamacpp writes the peer model that k3's prefill is compared
// against in llama.cpp: a dense llama-architecture GGUF with random bf16
// weights (issue 20's "llama.cpp's bf16 prefill share"; docs/bench,
// "against llama.cpp"). Its products are bf16, so llama.cpp's CPU backend
// rounds the activations to bf16 and runs its bf16 kernels (VDPBF16PS
// where the CPU has AVX512_BF16), which is what k3's fast backend does.
//
//	go run ./tools/llamacpp -o /tmp/dense.gguf
//	cd tools/llamacpp && npm ci && node bench.mjs /tmp/dense.gguf 512
//
// The defaults (12 layers of width 768, feed-forward 2048, 12 heads, a
// 512-token vocabulary: 85.3M parameters in products) are the shape of
// the figures in docs/bench. Beside the model it writes NAME.json, the
// products' parameter count, from which bench.mjs reports GFLOP/s (two a
// parameter and token); divided by the peak `k3 bench kernels` probes in
// the same sitting, that is the share to set beside k3's. The rounds
// command (go run ./tools/llamacpp/rounds -gguf /tmp/dense.gguf) times
// k3's prefill and llama.cpp's in alternating rounds and prints the
// ratios and their medians.
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
)

// Shape is the dense model's hyperparameters.
type Shape struct {
	Layers, Width, FF, Heads, Vocab int
}

// check reports the first hyperparameter llama.cpp could not load.
func (s Shape) check() error {
	switch {
	case s.Layers < 1:
		return fmt.Errorf("layers %d: want at least 1", s.Layers)
	case s.Width < 1 || s.FF < 1:
		return fmt.Errorf("width %d, feed-forward %d: want positive", s.Width, s.FF)
	case s.Heads < 1 || s.Width%s.Heads != 0 || (s.Width/s.Heads)%2 != 0:
		return fmt.Errorf("heads %d: want an even head width dividing the width %d", s.Heads, s.Width)
	case s.Vocab < firstWord+1:
		return fmt.Errorf("vocabulary %d: want more than the %d special and byte tokens", s.Vocab, firstWord)
	case s.Layers > maxDim || s.Width > maxDim || s.FF > maxDim || s.Vocab > maxDim:
		return fmt.Errorf("layers %d, width %d, feed-forward %d, vocabulary %d: want each at most %d", s.Layers, s.Width, s.FF, s.Vocab, maxDim)
	}
	return nil
}

// ProductParams is the number of weights the model's matrix products
// read for each token: the attention and feed-forward projections and
// the output head (the embedding is a lookup).
func (s Shape) ProductParams() int64 {
	w, f := int64(s.Width), int64(s.FF)
	return int64(s.Layers)*(4*w*w+3*w*f) + int64(s.Vocab)*w
}

// maxDim bounds every hyperparameter: GGUF's metadata holds them as
// 32-bit values, and a peer model larger than that is not one to time.
const maxDim = 1 << 20

// GGML tensor types.
const (
	typeF32  = 0
	typeBF16 = 30
)

// alignment is GGUF's default alignment of tensor data.
const alignment = 32

// firstWord is the first vocabulary entry after the unknown, begin and
// end tokens and the 256 byte tokens.
const firstWord = 3 + 256

type tensorInfo struct {
	name string
	dims []uint64 // GGML order: the innermost (input) dimension first
	typ  uint32
}

func (t tensorInfo) elems() uint64 {
	n := uint64(1)
	for _, d := range t.dims {
		n *= d
	}
	return n
}

func (t tensorInfo) bytes() uint64 {
	if t.typ == typeF32 {
		return 4 * t.elems()
	}
	return 2 * t.elems()
}

func (s Shape) tensors() []tensorInfo {
	w, f, v := uint64(s.Width), uint64(s.FF), uint64(s.Vocab)
	ts := []tensorInfo{{"token_embd.weight", []uint64{w, v}, typeBF16}}
	for l := range s.Layers {
		p := fmt.Sprintf("blk.%d.", l)
		ts = append(ts,
			tensorInfo{p + "attn_norm.weight", []uint64{w}, typeF32},
			tensorInfo{p + "attn_q.weight", []uint64{w, w}, typeBF16},
			tensorInfo{p + "attn_k.weight", []uint64{w, w}, typeBF16},
			tensorInfo{p + "attn_v.weight", []uint64{w, w}, typeBF16},
			tensorInfo{p + "attn_output.weight", []uint64{w, w}, typeBF16},
			tensorInfo{p + "ffn_norm.weight", []uint64{w}, typeF32},
			tensorInfo{p + "ffn_gate.weight", []uint64{w, f}, typeBF16},
			tensorInfo{p + "ffn_up.weight", []uint64{w, f}, typeBF16},
			tensorInfo{p + "ffn_down.weight", []uint64{f, w}, typeBF16},
		)
	}
	return append(ts,
		tensorInfo{"output_norm.weight", []uint64{w}, typeF32},
		tensorInfo{"output.weight", []uint64{w, v}, typeBF16})
}

// GGUF metadata value types.
const (
	valUint32  = 4
	valInt32   = 5
	valFloat32 = 6
	valString  = 8
	valArray   = 9
)

// gguf writes little-endian GGUF fields and keeps the first error.
type gguf struct {
	w   *bufio.Writer
	n   int64 // bytes written
	err error
}

func (g *gguf) raw(p []byte) {
	if g.err != nil {
		return
	}
	var n int
	n, g.err = g.w.Write(p)
	g.n += int64(n)
}

func (g *gguf) u32(v uint32) { g.raw(binary.LittleEndian.AppendUint32(nil, v)) }
func (g *gguf) u64(v uint64) { g.raw(binary.LittleEndian.AppendUint64(nil, v)) }
func (g *gguf) str(s string) { g.u64(uint64(len(s))); g.raw([]byte(s)) }

func (g *gguf) pad() {
	if r := g.n % alignment; r != 0 {
		g.raw(make([]byte, alignment-r))
	}
}

// kv is one metadata entry: its key and a writer of its type and value.
type kv struct {
	key string
	val func(g *gguf)
}

func u32Val(v uint32) func(*gguf) {
	return func(g *gguf) { g.u32(valUint32); g.u32(v) }
}

func strVal(v string) func(*gguf) {
	return func(g *gguf) { g.u32(valString); g.str(v) }
}

// wordArray writes an array of 32-bit values of GGUF type elem.
func wordArray(elem uint32, v []uint32) func(*gguf) {
	return func(g *gguf) {
		g.u32(valArray)
		g.u32(elem)
		g.u64(uint64(len(v)))
		for _, w := range v {
			g.u32(w)
		}
	}
}

func (s Shape) metadata() []kv {
	toks := make([]string, s.Vocab)
	types := make([]uint32, s.Vocab)     // llama.cpp's token types
	scoreBits := make([]uint32, s.Vocab) // float32 scores' bits
	toks[0], toks[1], toks[2] = "<unk>", "<s>", "</s>"
	types[0], types[1], types[2] = 2, 3, 3 // unknown, control
	for i := range 256 {
		toks[3+i], types[3+i] = fmt.Sprintf("<0x%02X>", i), 6 // byte
	}
	for i := firstWord; i < s.Vocab; i++ {
		toks[i], types[i] = fmt.Sprintf("▁t%d", i), 1 // normal
		scoreBits[i] = math.Float32bits(-float32(i))
	}
	return []kv{
		{"general.architecture", strVal("llama")},
		{"general.name", strVal("k3-peer-dense")},
		{"llama.context_length", u32Val(4096)},
		{"llama.embedding_length", u32Val(uint32(s.Width))},
		{"llama.block_count", u32Val(uint32(s.Layers))},
		{"llama.feed_forward_length", u32Val(uint32(s.FF))},
		{"llama.attention.head_count", u32Val(uint32(s.Heads))},
		{"llama.attention.head_count_kv", u32Val(uint32(s.Heads))},
		{"llama.rope.dimension_count", u32Val(uint32(s.Width / s.Heads))},
		{"llama.attention.layer_norm_rms_epsilon", func(g *gguf) {
			g.u32(valFloat32)
			g.u32(math.Float32bits(1e-5))
		}},
		{"llama.vocab_size", u32Val(uint32(s.Vocab))},
		{"tokenizer.ggml.model", strVal("llama")},
		{"tokenizer.ggml.tokens", func(g *gguf) {
			g.u32(valArray)
			g.u32(valString)
			g.u64(uint64(len(toks)))
			for _, t := range toks {
				g.str(t)
			}
		}},
		{"tokenizer.ggml.scores", wordArray(valFloat32, scoreBits)},
		{"tokenizer.ggml.token_type", wordArray(valInt32, types)},
		{"tokenizer.ggml.bos_token_id", u32Val(1)},
		{"tokenizer.ggml.eos_token_id", u32Val(2)},
		{"tokenizer.ggml.unknown_token_id", u32Val(0)},
	}
}

// Write writes the model to w: norm weights 1, every matrix drawn from
// N(0, 0.02²) by a generator seeded with seed, each draw's float32 cut to
// its top 16 bits (bf16 toward zero: the values only need to be bf16).
func Write(w io.Writer, s Shape, seed uint64) error {
	if err := s.check(); err != nil {
		return fmt.Errorf("llamacpp: %w", err)
	}
	g := &gguf{w: bufio.NewWriterSize(w, 1<<20)}
	ts, meta := s.tensors(), s.metadata()
	g.raw([]byte("GGUF"))
	g.u32(3) // version
	g.u64(uint64(len(ts)))
	g.u64(uint64(len(meta)))
	for _, e := range meta {
		g.str(e.key)
		e.val(g)
	}
	off := uint64(0)
	for _, t := range ts {
		g.str(t.name)
		g.u32(uint32(len(t.dims)))
		for _, d := range t.dims {
			g.u64(d)
		}
		g.u32(t.typ)
		g.u64(off)
		off += (t.bytes() + alignment - 1) &^ (alignment - 1)
	}
	g.pad()
	r := rand.New(rand.NewPCG(seed, 0x6767_7566))
	var buf []byte
	for _, t := range ts {
		buf = buf[:0]
		for range t.elems() {
			if t.typ == typeF32 {
				buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(1))
				continue
			}
			v := float32(r.NormFloat64() * 0.02)
			buf = binary.LittleEndian.AppendUint16(buf, uint16(math.Float32bits(v)>>16))
			if len(buf) >= 1<<20 {
				g.raw(buf)
				buf = buf[:0]
			}
		}
		g.raw(buf)
		g.pad()
	}
	if g.err == nil {
		g.err = g.w.Flush()
	}
	return g.err
}

// sidecar is NAME.json beside the model, read by bench.mjs.
type sidecar struct {
	ProductParams int64 `json:"productParams"`
	Shape
}

func main() {
	var s Shape
	out := flag.String("o", "", "the GGUF file to write (also writes `FILE`.json)")
	flag.IntVar(&s.Layers, "layers", 12, "decoder layers")
	flag.IntVar(&s.Width, "width", 768, "hidden width")
	flag.IntVar(&s.FF, "ff", 2048, "feed-forward width")
	flag.IntVar(&s.Heads, "heads", 12, "attention heads")
	flag.IntVar(&s.Vocab, "vocab", 512, "vocabulary size")
	seed := flag.Uint64("seed", 1, "weight seed")
	flag.Parse()
	if err := run(*out, s, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "llamacpp:", err)
		os.Exit(1)
	}
}

func run(path string, s Shape, seed uint64) error {
	if path == "" {
		return errors.New("-o: no output file given")
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := Write(f, s, seed); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return err
	}
	meta, err := json.Marshal(sidecar{ProductParams: s.ProductParams(), Shape: s})
	if err != nil {
		return err
	}
	if err := os.WriteFile(path+".json", append(meta, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("%s: %d layers of width %d, feed-forward %d, %.1fM parameters in products (%.1f MFLOP a token)\n",
		path, s.Layers, s.Width, s.FF, float64(s.ProductParams())/1e6, 2*float64(s.ProductParams())/1e6)
	return nil
}
