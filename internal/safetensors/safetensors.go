// Package safetensors reads and writes the safetensors checkpoint format:
// an 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the raw little-endian data.
//
// Files are memory-mapped where the platform allows it, so tensors used in
// their stored dtype are never copied. Sharded checkpoints are read through
// their model.safetensors.index.json (see OpenCheckpoint). Every malformed
// input is reported as an error wrapping ErrInvalid that names the file and
// the problem; nothing in this package panics on bad bytes.
package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
)

// ErrInvalid is wrapped by every error about malformed safetensors data.
var ErrInvalid = errors.New("invalid safetensors data")

// MaxHeaderSize bounds the JSON header; real checkpoints stay far below it
// and the bound stops a corrupt length from causing a huge allocation.
const MaxHeaderSize = 100 << 20

// DType is a safetensors dtype name as it appears in the header.
type DType string

// The dtypes k3 reads. Others in the format (F64, I8, ...) are accepted
// too so that inspecting foreign files works; see Size.
const (
	F32    DType = "F32"
	F16    DType = "F16"
	BF16   DType = "BF16"
	F8E4M3 DType = "F8_E4M3"
	F8E5M2 DType = "F8_E5M2"
	F64    DType = "F64"
	I8     DType = "I8"
	I16    DType = "I16"
	I32    DType = "I32"
	I64    DType = "I64"
	U8     DType = "U8"
	U16    DType = "U16"
	U32    DType = "U32"
	U64    DType = "U64"
	Bool   DType = "BOOL"
)

// Size returns the bytes per element of d, or 0 for an unknown dtype.
func (d DType) Size() int {
	switch d {
	case F8E4M3, F8E5M2, I8, U8, Bool:
		return 1
	case F16, BF16, I16, U16:
		return 2
	case F32, I32, U32:
		return 4
	case F64, I64, U64:
		return 8
	}
	return 0
}

// TensorInfo describes one tensor of a file.
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int
	// Offset is the absolute byte offset of the data in the file, Size its length.
	Offset, Size int64
}

// NumElements returns the product of the shape (1 for a scalar).
func (t TensorInfo) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= int64(d)
	}
	return n
}

// Header is the parsed header of a file.
type Header struct {
	// Tensors in data order (by offset, then name).
	Tensors  []TensorInfo
	Metadata map[string]string
	// DataStart is the file offset of the first data byte (8 + header length).
	DataStart int64
}

type rawEntry struct {
	DType       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// ParseHeader parses and validates the header of a safetensors file whose
// first bytes are prefix (at least 8 + header length of them) and whose
// total size is fileSize. name is used in error messages only.
func ParseHeader(name string, prefix []byte, fileSize int64) (*Header, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("safetensors: %s: %w: %s", name, ErrInvalid, fmt.Sprintf(format, args...))
	}
	if fileSize < 8 || len(prefix) < 8 {
		return nil, bad("not a safetensors file: %d bytes, shorter than the 8-byte header length", fileSize)
	}
	hlen := binary.LittleEndian.Uint64(prefix[:8])
	if hlen > MaxHeaderSize {
		return nil, bad("not a safetensors file: its first 8 bytes give a header length of %d, above the %d-byte limit", hlen, MaxHeaderSize)
	}
	if int64(hlen) > fileSize-8 {
		return nil, bad("header length %d past end of file (%d bytes): truncated, or not a safetensors file", hlen, fileSize)
	}
	if int64(len(prefix)) < 8+int64(hlen) {
		return nil, bad("header truncated: have %d of %d bytes", len(prefix)-8, hlen)
	}
	js := prefix[8 : 8+hlen]
	h := &Header{DataStart: 8 + int64(hlen)}
	dataSize := fileSize - h.DataStart

	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, bad("not a safetensors file: the header is not JSON: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, bad("not a safetensors file: the header is not a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, bad("header JSON: %v", err)
		}
		key, ok := tok.(string)
		if !ok {
			return nil, bad("header JSON: key %v is not a string", tok)
		}
		if seen[key] {
			return nil, bad("duplicate tensor name %q", key)
		}
		seen[key] = true
		if key == "__metadata__" {
			var m map[string]string
			if err := dec.Decode(&m); err != nil {
				return nil, bad("__metadata__ is not a string map: %v", err)
			}
			h.Metadata = m
			continue
		}
		var e rawEntry
		if err := dec.Decode(&e); err != nil {
			return nil, bad("tensor %q: %v", key, err)
		}
		dt := DType(e.DType)
		es := dt.Size()
		if es == 0 {
			return nil, bad("tensor %q: unknown dtype %q", key, e.DType)
		}
		if len(e.DataOffsets) != 2 {
			return nil, bad("tensor %q: data_offsets has %d entries, want 2", key, len(e.DataOffsets))
		}
		begin, end := e.DataOffsets[0], e.DataOffsets[1]
		if begin < 0 || end < begin || end > dataSize {
			return nil, bad("tensor %q: data_offsets [%d, %d] out of range (data is %d bytes)", key, begin, end, dataSize)
		}
		shape := make([]int, len(e.Shape))
		n := int64(1)
		for i, d := range e.Shape {
			if d < 0 {
				return nil, bad("tensor %q: negative dimension %d", key, d)
			}
			if d > 0 && n > math.MaxInt64/d/int64(es) {
				return nil, bad("tensor %q: shape %v overflows", key, e.Shape)
			}
			n *= d
			shape[i] = int(d)
		}
		if n*int64(es) != end-begin {
			return nil, bad("tensor %q: shape %v × %s (%d bytes each) = %d bytes, but data_offsets span %d",
				key, e.Shape, dt, es, n*int64(es), end-begin)
		}
		h.Tensors = append(h.Tensors, TensorInfo{Name: key, DType: dt, Shape: shape, Offset: h.DataStart + begin, Size: end - begin})
	}
	if _, err := dec.Token(); err != nil {
		return nil, bad("header JSON: %v", err)
	}
	if rest, _ := io.ReadAll(dec.Buffered()); len(bytes.TrimSpace(rest)) != 0 {
		return nil, bad("header JSON has trailing data")
	}
	sort.Slice(h.Tensors, func(i, j int) bool {
		a, b := h.Tensors[i], h.Tensors[j]
		if a.Offset != b.Offset {
			return a.Offset < b.Offset
		}
		return a.Name < b.Name
	})
	var prev *TensorInfo
	for i := range h.Tensors {
		t := &h.Tensors[i]
		if t.Size == 0 {
			continue
		}
		if prev != nil && t.Offset < prev.Offset+prev.Size {
			return nil, bad("tensors %q and %q overlap", prev.Name, t.Name)
		}
		prev = t
	}
	return h, nil
}

// File is an open safetensors file.
type File struct {
	name   string
	Header *Header
	byName map[string]int
	data   []byte      // the whole file when mapped or read into memory
	ra     io.ReaderAt // used when data is nil
	close  func() error
	mapped bool // data is a read-only file mapping (see Release)
}

// Open opens and validates a safetensors file, memory-mapping it.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	data, unmap, err := mapFile(f, st.Size())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	h, err := ParseHeader(path, data, st.Size())
	if err != nil {
		unmap()
		f.Close()
		return nil, err
	}
	file := newFile(path, h, data, nil, func() error {
		err := unmap()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	})
	file.mapped = mapsFiles && len(data) > 0
	return file, nil
}

// NewReader reads a safetensors file of the given size from r. Tensor data
// is read on demand; name is used in error messages.
func NewReader(name string, r io.ReaderAt, size int64) (*File, error) {
	var lenBuf [8]byte
	n := min(size, 8)
	if n > 0 {
		if _, err := r.ReadAt(lenBuf[:n], 0); err != nil {
			return nil, fmt.Errorf("safetensors: %s: %w", name, err)
		}
	}
	hlen := binary.LittleEndian.Uint64(lenBuf[:])
	if size < 8 || hlen > MaxHeaderSize || int64(hlen) > size-8 {
		_, err := ParseHeader(name, lenBuf[:n], size) // reports the problem
		return nil, err
	}
	buf := make([]byte, 8+hlen)
	if _, err := r.ReadAt(buf, 0); err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w", name, err)
	}
	h, err := ParseHeader(name, buf, size)
	if err != nil {
		return nil, err
	}
	return newFile(name, h, nil, r, func() error { return nil }), nil
}

// FromBytes parses a safetensors file held in memory.
func FromBytes(name string, data []byte) (*File, error) {
	h, err := ParseHeader(name, data, int64(len(data)))
	if err != nil {
		return nil, err
	}
	return newFile(name, h, data, nil, func() error { return nil }), nil
}

func newFile(name string, h *Header, data []byte, ra io.ReaderAt, closeFn func() error) *File {
	f := &File{name: name, Header: h, data: data, ra: ra, close: closeFn, byName: make(map[string]int, len(h.Tensors))}
	for i, t := range h.Tensors {
		f.byName[t.Name] = i
	}
	return f
}

// Name returns the path or name the file was opened with.
func (f *File) Name() string { return f.name }

// Metadata returns the __metadata__ map (nil if absent).
func (f *File) Metadata() map[string]string { return f.Header.Metadata }

// Tensors returns the tensors in data order.
func (f *File) Tensors() []TensorInfo { return f.Header.Tensors }

// Tensor returns the named tensor's description.
func (f *File) Tensor(name string) (TensorInfo, bool) {
	i, ok := f.byName[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.Header.Tensors[i], true
}

// ErrNotFound is wrapped when a named tensor is not in a file or checkpoint.
var ErrNotFound = errors.New("tensor not found")

// Bytes returns the raw data of the named tensor. For a mapped or in-memory
// file it aliases the file's memory (read-only; valid until Close);
// otherwise it reads a copy.
func (f *File) Bytes(name string) ([]byte, TensorInfo, error) {
	t, ok := f.Tensor(name)
	if !ok {
		return nil, t, fmt.Errorf("safetensors: %s: %w: %q", f.name, ErrNotFound, name)
	}
	if f.data != nil {
		return f.data[t.Offset : t.Offset+t.Size : t.Offset+t.Size], t, nil
	}
	b := make([]byte, t.Size)
	if _, err := f.ra.ReadAt(b, t.Offset); err != nil {
		return nil, t, fmt.Errorf("safetensors: %s: tensor %q: %w", f.name, name, err)
	}
	return b, t, nil
}

// Release tells a memory-mapped file that the named tensor's bytes were
// needed only while loading (copied, rearranged or converted): the whole
// pages inside them leave the process's resident memory. Reading the tensor
// again still works, the pages come back from the file. For files that are
// not mapped (read into memory, or read on demand) it does nothing.
func (f *File) Release(name string) {
	t, ok := f.Tensor(name)
	if !ok || !f.mapped || f.data == nil {
		return
	}
	// The mapping starts on a page boundary, so offsets into it are
	// page-aligned exactly when addresses are.
	page := int64(os.Getpagesize())
	lo := (t.Offset + page - 1) / page * page
	hi := (t.Offset + t.Size) / page * page
	if lo < hi {
		dropPages(f.data[lo:hi])
	}
}

// Mapped returns the named tensor's bytes in the file's read-only mapping,
// or nil when the file is not mapped: the bytes Release would release.
func (f *File) Mapped(name string) []byte {
	t, ok := f.Tensor(name)
	if !ok || !f.mapped || f.data == nil {
		return nil
	}
	return f.data[t.Offset : t.Offset+t.Size : t.Offset+t.Size]
}

// Close releases the mapping and the file.
func (f *File) Close() error {
	if f.close == nil {
		return nil
	}
	err := f.close()
	f.close, f.data = nil, nil
	return err
}

func (t TensorInfo) String() string {
	dims := make([]string, len(t.Shape))
	for i, d := range t.Shape {
		dims[i] = fmt.Sprint(d)
	}
	return fmt.Sprintf("%s %s [%s]", t.Name, t.DType, strings.Join(dims, ", "))
}
