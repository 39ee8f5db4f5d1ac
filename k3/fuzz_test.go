package k3

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"testing"
	"testing/fstest"
)

// loadAllocBound is the most one LoadFS of the embedded checkpoint (under a
// megabyte of weights) may allocate, whatever its config and header say.
const loadAllocBound = 64 << 20

// FuzzLoadFS loads the embedded checkpoint with a mutated config.json and a
// mutated safetensors header (the tensor data stays): LoadFS must return a
// model or an error wrapping ErrInvalidConfig or ErrCheckpoint, never
// panic, and never allocate more than loadAllocBound.
func FuzzLoadFS(f *testing.F) {
	base := tinyFS(f)
	cfg := base["config.json"].Data
	st := base["model.safetensors"].Data
	hlen := binary.LittleEndian.Uint64(st[:8])
	header, data := st[8:8+hlen], st[8+hlen:]
	f.Add(cfg, header)
	f.Add([]byte(`{"text_config": {"hidden_size": 1099511627776}}`), header)
	f.Add(bytesReplace(cfg, `"hidden_size": 64`, `"hidden_size": 1099511627776`), header)
	f.Add(bytesReplace(cfg, `"num_hidden_layers": 6`, `"num_hidden_layers": 4000`), header)
	f.Add(bytesReplace(cfg, `"vocab_size": 512`, `"vocab_size": 16000000`), header)
	f.Add(bytesReplace(cfg, `"max_position_embeddings": 4096`, `"max_position_embeddings": 0`), header)
	f.Add(cfg, bytesReplace(header, `[512,64]`, `[512,4611686018427387904]`))
	f.Add(cfg, []byte(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}}`))
	f.Fuzz(func(t *testing.T, cfg, header []byte) {
		file := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
		file = append(append(file, header...), data...)
		fsys := fstest.MapFS{}
		for name, mf := range base {
			fsys[name] = mf
		}
		fsys["config.json"] = &fstest.MapFile{Data: cfg}
		fsys["model.safetensors"] = &fstest.MapFile{Data: file}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		m, err := LoadFS(context.Background(), fsys, "fuzz")
		runtime.ReadMemStats(&after)
		if grew := after.TotalAlloc - before.TotalAlloc; grew > loadAllocBound {
			t.Fatalf("LoadFS allocated %d bytes (bound %d); err %v", grew, loadAllocBound, err)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) && !errors.Is(err, ErrCheckpoint) {
				t.Fatalf("error wraps neither ErrInvalidConfig nor ErrCheckpoint: %v", err)
			}
			return
		}
		m.Close()
	})
}

// bytesReplace replaces the first old in b; old must be there.
func bytesReplace(b []byte, old, new string) []byte {
	i := bytes.Index(b, []byte(old))
	if i < 0 {
		panic("bytesReplace: " + old + " not found")
	}
	return append(append(append([]byte(nil), b[:i]...), new...), b[i+len(old):]...)
}
