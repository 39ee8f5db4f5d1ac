package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func rawFile(header string, data []byte) []byte {
	var b bytes.Buffer
	var l [8]byte
	binary.LittleEndian.PutUint64(l[:], uint64(len(header)))
	b.Write(l[:])
	b.WriteString(header)
	b.Write(data)
	return b.Bytes()
}

func TestRoundTrip(t *testing.T) {
	tensors := []Tensor{
		F32Tensor("a", []int{2, 3}, []float32{1, 2, 3, 4, 5, 6}),
		I32Tensor("ids", []int{3}, []int32{-1, 0, 7}),
		U16Tensor("h", BF16, []int{2}, []uint16{0x3f80, 0xc000}),
		{Name: "scalar", DType: F32, Shape: []int{}, Data: []byte{0, 0, 0x80, 0x3f}},
		{Name: "empty", DType: F32, Shape: []int{0, 4}, Data: nil},
		{Name: "flags", DType: Bool, Shape: []int{2}, Data: []byte{1, 0}},
		{Name: "fp8", DType: F8E4M3, Shape: []int{2}, Data: []byte{0x38, 0x7e}},
		{Name: "big", DType: I64, Shape: []int{1}, Data: make([]byte, 8)},
	}
	var buf bytes.Buffer
	if err := Write(&buf, tensors, map[string]string{"op": "test"}); err != nil {
		t.Fatal(err)
	}
	if (binary.LittleEndian.Uint64(buf.Bytes())+8)%8 != 0 {
		t.Error("header not padded to 8")
	}
	path := filepath.Join(t.TempDir(), "x.safetensors")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	mapped, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer mapped.Close()
	read, err := NewReader("mem", bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []*File{mapped, read} {
		if f.Metadata()["op"] != "test" {
			t.Errorf("metadata %v", f.Metadata())
		}
		if len(f.Tensors()) != len(tensors) {
			t.Fatalf("%d tensors", len(f.Tensors()))
		}
		for _, want := range tensors {
			got, info, err := f.Bytes(want.Name)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want.Data) || info.DType != want.DType || len(info.Shape) != len(want.Shape) {
				t.Errorf("%s: got %v %v %v", want.Name, info.DType, info.Shape, got)
			}
		}
		a, _, err := f.Float32s("a")
		if err != nil || a[5] != 6 {
			t.Errorf("Float32s: %v %v", a, err)
		}
		h, _, _ := f.Float32s("h")
		if h[0] != 1 || h[1] != -2 {
			t.Errorf("bf16 %v", h)
		}
		ids, _, _ := f.Int32s("ids")
		if ids[0] != -1 || ids[2] != 7 {
			t.Errorf("ids %v", ids)
		}
		if _, _, err := f.Bytes("missing"); !errors.Is(err, ErrNotFound) {
			t.Errorf("missing tensor: %v", err)
		}
	}
}

func TestMalformed(t *testing.T) {
	f4 := make([]byte, 16)
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"short", []byte{1, 2, 3}, "shorter than the 8-byte header length"},
		{"header past end", rawFile(`{}`, nil)[:9], "past end of file"},
		{"huge header", append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, make([]byte, 8)...), "above the"},
		{"bad json", rawFile(`{"a":`, nil), `tensor "a": EOF`},
		{"bad json key", rawFile(`{"__metadata__":{},`, nil), "header JSON"},
		{"not object", rawFile(`[1,2]`, nil), "not a JSON object"},
		{"unknown dtype", rawFile(`{"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}}`, f4), `unknown dtype "Q4"`},
		{"offsets out of range", rawFile(`{"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}}`, f4), "out of range"},
		{"negative offset", rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}`, f4), "out of range"},
		{"size mismatch", rawFile(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}`, f4), "data_offsets span 16"},
		{"overlap", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, f4), "overlap"},
		{"duplicate", rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f4), "duplicate tensor name"},
		{"negative dim", rawFile(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, f4), "negative dimension"},
		{"overflow", rawFile(`{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}}`, f4), "overflows"},
		{"offsets arity", rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}`, f4), "want 2"},
		{"metadata not strings", rawFile(`{"__metadata__":{"a":1}}`, nil), "__metadata__"},
		{"trailing", rawFile(`{} {}`, nil), "trailing"},
	}
	for _, c := range cases {
		_, err := FromBytes("case.safetensors", c.data)
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "case.safetensors") {
			t.Errorf("%s: error %q, want it to wrap ErrInvalid, name the file and say %q", c.name, err, c.want)
		}
		if _, err := NewReader("case.safetensors", bytes.NewReader(c.data), int64(len(c.data))); err == nil {
			t.Errorf("%s: NewReader accepted", c.name)
		}
	}
}

func TestSharded(t *testing.T) {
	dir := t.TempDir()
	if err := WriteFile(filepath.Join(dir, "s1.safetensors"), []Tensor{F32Tensor("x", []int{1}, []float32{1})}, nil); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(filepath.Join(dir, "s2.safetensors"), []Tensor{F32Tensor("y", []int{1}, []float32{2})}, nil); err != nil {
		t.Fatal(err)
	}
	writeIndex := func(m string) {
		if err := os.WriteFile(filepath.Join(dir, IndexName), []byte(`{"metadata":{},"weight_map":`+m+`}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeIndex(`{"x":"s1.safetensors","y":"s2.safetensors"}`)
	c, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Names(); len(got) != 2 {
		t.Errorf("names %v", got)
	}
	b, _, err := c.Bytes("y")
	if err != nil || len(b) != 4 {
		t.Errorf("y: %v %v", b, err)
	}
	c.Close()

	writeIndex(`{"x":"s1.safetensors","y":"s3.safetensors"}`)
	if _, err := OpenCheckpoint(dir); err == nil || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "s3.safetensors") {
		t.Errorf("missing shard: %v", err)
	}
	writeIndex(`{"x":"s1.safetensors","y":"s1.safetensors"}`)
	if _, err := OpenCheckpoint(dir); err == nil || !strings.Contains(err.Error(), `"y"`) {
		t.Errorf("misplaced tensor: %v", err)
	}
	writeIndex(`{"x":`)
	if _, err := OpenCheckpoint(dir); err == nil || !strings.Contains(err.Error(), IndexName) {
		t.Errorf("bad index: %v", err)
	}
	writeIndex(`{"x":"../s1.safetensors"}`)
	if _, err := OpenCheckpoint(dir); err == nil {
		t.Errorf("shard outside the directory accepted")
	}
}

// TestGoldenFiles parses every file of the conformance suite.
func TestGoldenFiles(t *testing.T) {
	paths, _ := filepath.Glob("../../testdata/*/*.safetensors")
	more, _ := filepath.Glob("../../testdata/model/*/*.safetensors")
	paths = append(paths, more...)
	if len(paths) < 30 {
		t.Fatalf("found only %d golden files", len(paths))
	}
	for _, p := range paths {
		f, err := Open(p)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, ti := range f.Tensors() {
			if _, _, err := f.Bytes(ti.Name); err != nil {
				t.Error(err)
			}
		}
		f.Close()
	}
	c, err := OpenCheckpoint("../../testdata/model/tiny_k3")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if len(c.Files) != 2 {
		t.Errorf("tiny_k3 has %d shards open", len(c.Files))
	}
}

func FuzzParseHeader(f *testing.F) {
	f.Add(rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, make([]byte, 4)))
	f.Add(rawFile(`{"__metadata__":{"op":"x"},"b":{"dtype":"BF16","shape":[2,1],"data_offsets":[0,4]}}`, make([]byte, 4)))
	f.Add(rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, make([]byte, 16)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := FromBytes("fuzz", data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		for _, ti := range file.Tensors() {
			b, _, err := file.Bytes(ti.Name)
			if err != nil || int64(len(b)) != ti.NumElements()*int64(ti.DType.Size()) {
				t.Fatalf("tensor %s: %d bytes, %v", ti.Name, len(b), err)
			}
		}
	})
}

// TestRelease drops a mapped tensor's pages and reads it again: the values
// come back from the file. An in-memory file is left untouched (dropping
// pages of ordinary memory would zero them).
func TestRelease(t *testing.T) {
	n := 3 * os.Getpagesize() // several whole pages inside the tensor
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(i%1000) + 0.5
	}
	var buf bytes.Buffer
	if err := Write(&buf, []Tensor{F32Tensor("a", []int{n}, v), F32Tensor("b", []int{2}, []float32{7, 8})}, nil); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "r.safetensors")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	mapped, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer mapped.Close()
	mem, err := FromBytes("mem", bytes.Clone(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []*File{mapped, mem} {
		if _, _, err := f.Float32s("a"); err != nil { // touch the pages
			t.Fatal(err)
		}
		f.Release("a")
		f.Release("missing") // no-op
		for _, name := range []string{"a", "b"} {
			got, _, err := f.Float32s(name)
			if err != nil {
				t.Fatal(err)
			}
			want := v
			if name == "b" {
				want = []float32{7, 8}
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("%s: %s[%d] = %v after Release, want %v", f.Name(), name, i, got[i], want[i])
				}
			}
		}
	}
}
