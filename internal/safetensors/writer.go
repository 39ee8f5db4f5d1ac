package safetensors

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
)

// Tensor is a tensor to write.
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte
}

// F32Tensor makes a float32 tensor to write.
func F32Tensor(name string, shape []int, v []float32) Tensor {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return Tensor{Name: name, DType: F32, Shape: shape, Data: b}
}

// I32Tensor makes an int32 tensor to write.
func I32Tensor(name string, shape []int, v []int32) Tensor {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return Tensor{Name: name, DType: I32, Shape: shape, Data: b}
}

// U16Tensor makes a tensor of 16-bit elements (BF16 or F16 codes).
func U16Tensor(name string, dt DType, shape []int, v []uint16) Tensor {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], x)
	}
	return Tensor{Name: name, DType: dt, Shape: shape, Data: b}
}

// Write writes tensors, in the given order, and metadata as a safetensors
// stream. The header is padded with spaces to a multiple of 8 bytes so that
// every tensor starts aligned when its predecessors' sizes allow it.
func Write(w io.Writer, tensors []Tensor, metadata map[string]string) error {
	header := make(map[string]any, len(tensors)+1)
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	var off int64
	for _, t := range tensors {
		if t.Name == "__metadata__" {
			return fmt.Errorf("safetensors: tensor name %q is reserved", t.Name)
		}
		if _, dup := header[t.Name]; dup {
			return fmt.Errorf("safetensors: duplicate tensor name %q", t.Name)
		}
		n := int64(1)
		for _, d := range t.Shape {
			if d < 0 {
				return fmt.Errorf("safetensors: tensor %q: negative dimension %d", t.Name, d)
			}
			n *= int64(d)
		}
		if es := t.DType.Size(); es == 0 {
			return fmt.Errorf("safetensors: tensor %q: unknown dtype %q", t.Name, t.DType)
		} else if n*int64(es) != int64(len(t.Data)) {
			return fmt.Errorf("safetensors: tensor %q: shape %v × %s needs %d bytes, have %d", t.Name, t.Shape, t.DType, n*int64(es), len(t.Data))
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		header[t.Name] = map[string]any{"dtype": t.DType, "shape": shape, "data_offsets": []int64{off, off + int64(len(t.Data))}}
		off += int64(len(t.Data))
	}
	js, err := json.Marshal(header)
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	bw := bufio.NewWriter(w)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(js)))
	bw.Write(lenBuf[:])
	bw.Write(js)
	for _, t := range tensors {
		bw.Write(t.Data)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	return nil
}

// WriteFile writes a safetensors file at path.
func WriteFile(path string, tensors []Tensor, metadata map[string]string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	if err := Write(f, tensors, metadata); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
