package ascend

import (
	"fmt"
	"reflect"

	"k3/compute"
	"k3/internal/cpu"
)

// OpenHost returns the Ascend backend over the host driver: the whole
// orchestration of the device backend (arena, stream, staging,
// workspaces, descriptors and two-phase operators, capture) with the
// device played by host memory and Go. It is for testing that
// orchestration on machines without an NPU (k3 conform -backend
// ascend-host), not for speed. As on a device, an operation the backend
// has not mapped to aclnn fails with compute.ErrUnsupported (the model
// then takes its composition, as it would on the device), unless
// o.HostFallback is set: then it runs on the pure-Go backend over the
// same memory, after the stream has drained.
func OpenHost(o Options) (*Backend, error) {
	d := newHostDriver()
	b, err := newBackend(d, o)
	if err != nil {
		return nil, err
	}
	b.host, b.hostOps = cpu.New(1), o.HostFallback
	return b, nil
}

// onHost runs an operation the backend has not mapped on the pure-Go
// backend, for a backend over the host driver opened with HostFallback:
// the stream is drained first (the operation reads what queued work
// writes), and args is a pointer to the operation's argument struct,
// copied with every tensor replaced by a pure-Go tensor over the same
// bytes. Without HostFallback it is the unmapped error.
//
// A device backend opened with Options.HostFallback runs them the same
// way over copies: every buffer the arguments name is downloaded, the
// operation runs on the host, and the buffers it changed are uploaded.
// That is slow (a whole KV cache crosses twice per call) and exists so
// that a model runs end to end while operations are still unmapped.
func (b *Backend) onHost(name string, args any, call func(c compute.Backend, args any) error) error {
	var m *mirror
	switch {
	case b.host != nil && b.hostOps:
	case b.fallback != nil:
		m = &mirror{b: b, bufs: map[*devBuf]*mirrored{}}
	default:
		return unmapped(name)
	}
	b.lock()
	defer b.mu.Unlock()
	if b.capture != nil {
		return fmt.Errorf("%w: %s runs on the host, outside the captured stream", ErrCapturing, name)
	}
	if err := b.syncAll(); err != nil {
		return err
	}
	v := reflect.ValueOf(args)
	c := reflect.New(v.Type().Elem())
	c.Elem().Set(v.Elem())
	if err := b.hostTensors(c.Elem(), m); err != nil {
		return fmt.Errorf("ascend: %s on the host: %w", name, err)
	}
	host := b.host
	if m != nil {
		host = b.fallback
	}
	err := call(host, c.Interface())
	if m != nil {
		if werr := m.writeBack(); werr != nil && err == nil {
			err = fmt.Errorf("ascend: %s on the host: %w", name, werr)
		}
	}
	// Fields an operation sets (AttnResUpdateArgs.HasPartial) go back.
	for i := range c.Elem().NumField() {
		if f := c.Elem().Field(i); !tensorish(f.Type()) {
			v.Elem().Field(i).Set(f)
		}
	}
	return err
}

func tensorish(t reflect.Type) bool {
	return t == tensorType || t == weightsType || (t.Kind() == reflect.Slice && t.Elem() == tensorType)
}

// wrapKey names the pure-Go twin of a buffer viewed as one dtype.
type wrapKey struct {
	d  *devBuf
	dt compute.DType
}

var (
	tensorType  = reflect.TypeFor[compute.Tensor]()
	weightsType = reflect.TypeFor[*compute.KDAWeights]()
)

// hostTensors replaces, in the struct v (settable), every Tensor, every
// []Tensor (copied) and a *KDAWeights (copied) by their host twins (over
// the copies in m, when m is not nil).
func (b *Backend) hostTensors(v reflect.Value, m *mirror) error {
	for i := range v.NumField() {
		f := v.Field(i)
		switch {
		case f.Type() == tensorType:
			t, err := b.hostTensor(f.Interface().(compute.Tensor), m)
			if err != nil {
				return err
			}
			f.Set(reflect.ValueOf(t))
		case f.Kind() == reflect.Slice && f.Type().Elem() == tensorType && !f.IsNil():
			ts := make([]compute.Tensor, f.Len())
			for j := range ts {
				var err error
				if ts[j], err = b.hostTensor(f.Index(j).Interface().(compute.Tensor), m); err != nil {
					return err
				}
			}
			f.Set(reflect.ValueOf(ts))
		case f.Type() == weightsType && !f.IsNil():
			w := *f.Interface().(*compute.KDAWeights)
			if err := b.hostTensors(reflect.ValueOf(&w).Elem(), m); err != nil {
				return err
			}
			f.Set(reflect.ValueOf(&w))
		}
	}
	return nil
}

// hostTensor is t as a pure-Go tensor over the same host memory (the
// pure-Go backend's FromHost aliases aligned bytes).
func (b *Backend) hostTensor(t compute.Tensor, m *mirror) (compute.Tensor, error) {
	if t.IsZero() {
		return t, nil
	}
	d, err := bufOf(t)
	if err != nil {
		return t, err
	}
	if m != nil {
		return m.tensor(t, d)
	}
	// One wrapper per buffer and dtype, so that the pure-Go backend's
	// caches keyed by storage (the conv taps' transpose) see the same
	// tensor on every call.
	key := wrapKey{d, t.DType}
	h, ok := b.wraps[key]
	if !ok {
		size := t.DType.Size()
		mem, err := b.drv.(*hostDriver).mem(b.base.Add(d.off), d.n, "host operation")
		if err != nil {
			return t, err
		}
		if d.nz != nil { // a prepared weight: the host reads a row-major copy
			if mem, err = unpackNZ(d.nz, mem); err != nil {
				return t, err
			}
		}
		n := len(mem) / size
		if h, err = b.host.FromHost(t.DType, t.DType, mem[:n*size], n); err != nil {
			return t, err
		}
		if b.wraps == nil {
			b.wraps = map[wrapKey]compute.Tensor{}
		}
		b.wraps[key] = h
	}
	h.Off, h.Rank, h.Dims = t.Off, t.Rank, t.Dims
	return h, nil
}

// mirror holds one fallback call's host copies of device buffers.
type mirror struct {
	b    *Backend
	bufs map[*devBuf]*mirrored
}

type mirrored struct {
	data, orig []byte
	// readOnly: data is a row-major copy of a FRACTAL_NZ weight, never
	// written back.
	readOnly bool
}

// tensor is t over the host copy of its buffer d, downloaded on first use.
func (m *mirror) tensor(t compute.Tensor, d *devBuf) (compute.Tensor, error) {
	c, ok := m.bufs[d]
	if !ok {
		c = &mirrored{data: make([]byte, d.n)}
		if err := m.b.download(c.data, m.b.base.Add(d.off)); err != nil {
			return t, err
		}
		if d.nz != nil {
			plain, err := unpackNZ(d.nz, c.data)
			if err != nil {
				return t, err
			}
			c.data, c.readOnly = plain, true
		}
		c.orig = append([]byte(nil), c.data...)
		m.bufs[d] = c
	}
	size := t.DType.Size()
	n := len(c.data) / size
	h, err := m.b.fallback.FromHost(t.DType, t.DType, c.data[:n*size], n)
	if err != nil {
		return t, err
	}
	h.Off, h.Rank, h.Dims = t.Off, t.Rank, t.Dims
	return h, nil
}

// writeBack uploads the buffers the operation changed.
func (m *mirror) writeBack() error {
	for d, c := range m.bufs {
		if c.readOnly || string(c.data) == string(c.orig) {
			continue
		}
		if err := m.b.upload(m.b.base.Add(d.off), c.data); err != nil {
			return err
		}
	}
	return nil
}
