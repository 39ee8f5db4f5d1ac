package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// IndexName is the file that maps tensor names to shards.
const IndexName = "model.safetensors.index.json"

// Checkpoint is a set of safetensors files read as one namespace of tensors.
type Checkpoint struct {
	Dir    string
	Files  []*File
	byName map[string]*File
}

// OpenCheckpoint opens the weights of a checkpoint directory: the shards
// listed in model.safetensors.index.json if present, else model.safetensors,
// else every *.safetensors file in the directory. A shard named by the index
// but missing, or a tensor the index places in a shard that lacks it, is an
// error; so is a tensor name present in two files.
func OpenCheckpoint(dir string) (*Checkpoint, error) {
	var paths []string
	var weightMap map[string]string
	idxPath := filepath.Join(dir, IndexName)
	if b, err := os.ReadFile(idxPath); err == nil {
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(b, &idx); err != nil {
			return nil, fmt.Errorf("safetensors: %s: %w: %v", idxPath, ErrInvalid, err)
		}
		if len(idx.WeightMap) == 0 {
			return nil, fmt.Errorf("safetensors: %s: %w: empty weight_map", idxPath, ErrInvalid)
		}
		weightMap = idx.WeightMap
		seen := map[string]bool{}
		for _, shard := range idx.WeightMap {
			if filepath.Base(shard) != shard {
				return nil, fmt.Errorf("safetensors: %s: %w: shard name %q is not a file in the directory", idxPath, ErrInvalid, shard)
			}
			if !seen[shard] {
				seen[shard] = true
				paths = append(paths, filepath.Join(dir, shard))
			}
		}
		sort.Strings(paths)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("safetensors: %w", err)
	} else if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err == nil {
		paths = []string{filepath.Join(dir, "model.safetensors")}
	} else {
		paths, _ = filepath.Glob(filepath.Join(dir, "*.safetensors"))
		if len(paths) == 0 {
			return nil, fmt.Errorf("safetensors: %s: %w: no model.safetensors, %s or *.safetensors files", dir, fs.ErrNotExist, IndexName)
		}
	}
	c := &Checkpoint{Dir: dir, byName: map[string]*File{}}
	for _, p := range paths {
		f, err := Open(p)
		if err != nil {
			c.Close()
			if errors.Is(err, fs.ErrNotExist) && weightMap != nil {
				return nil, fmt.Errorf("safetensors: shard %s named in %s is missing: %w", filepath.Base(p), IndexName, err)
			}
			return nil, err
		}
		c.Files = append(c.Files, f)
		for _, t := range f.Tensors() {
			if other, dup := c.byName[t.Name]; dup {
				c.Close()
				return nil, fmt.Errorf("safetensors: %w: tensor %q is in both %s and %s", ErrInvalid, t.Name, other.Name(), f.Name())
			}
			c.byName[t.Name] = f
		}
	}
	for name, shard := range weightMap {
		f, ok := c.byName[name]
		if !ok {
			c.Close()
			return nil, fmt.Errorf("safetensors: %w: %s places tensor %q in %s, which lacks it", ErrInvalid, IndexName, name, shard)
		}
		if filepath.Base(f.Name()) != shard {
			c.Close()
			return nil, fmt.Errorf("safetensors: %w: %s places tensor %q in %s, but it is in %s", ErrInvalid, IndexName, name, shard, filepath.Base(f.Name()))
		}
	}
	return c, nil
}

// NewCheckpoint joins open files (for instance read from an fs.FS with
// FromBytes) into one namespace; a tensor name in two files is an error.
func NewCheckpoint(name string, files ...*File) (*Checkpoint, error) {
	c := &Checkpoint{Dir: name, byName: map[string]*File{}}
	for _, f := range files {
		c.Files = append(c.Files, f)
		for _, t := range f.Tensors() {
			if other, dup := c.byName[t.Name]; dup {
				return nil, fmt.Errorf("safetensors: %w: tensor %q is in both %s and %s", ErrInvalid, t.Name, other.Name(), f.Name())
			}
			c.byName[t.Name] = f
		}
	}
	return c, nil
}

// Tensor returns the description of a tensor and the file holding it.
func (c *Checkpoint) Tensor(name string) (TensorInfo, *File, bool) {
	f, ok := c.byName[name]
	if !ok {
		return TensorInfo{}, nil, false
	}
	t, _ := f.Tensor(name)
	return t, f, true
}

// Names returns every tensor name, sorted.
func (c *Checkpoint) Names() []string {
	names := make([]string, 0, len(c.byName))
	for n := range c.byName {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Bytes returns the raw data of a tensor (see File.Bytes).
func (c *Checkpoint) Bytes(name string) ([]byte, TensorInfo, error) {
	f, ok := c.byName[name]
	if !ok {
		return nil, TensorInfo{}, fmt.Errorf("safetensors: %s: %w: %q", c.Dir, ErrNotFound, name)
	}
	return f.Bytes(name)
}

// Release releases a tensor's pages (see File.Release).
func (c *Checkpoint) Release(name string) {
	if f, ok := c.byName[name]; ok {
		f.Release(name)
	}
}

// Mapped returns a tensor's mapped bytes (see File.Mapped).
func (c *Checkpoint) Mapped(name string) []byte {
	if f, ok := c.byName[name]; ok {
		return f.Mapped(name)
	}
	return nil
}

// Close closes every file.
func (c *Checkpoint) Close() error {
	var first error
	for _, f := range c.Files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
