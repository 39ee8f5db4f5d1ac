package modelbench

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
	"k3/internal/safetensors"
	"k3/internal/tiny"
	"k3/k3"
)

// weightReads is a backend that knows which of its tensors hold
// checkpoint weights (by storage, with the element size the checkpoint
// stores them in) and adds up the weight bytes the products of a pass
// read: MatMul's and HeadMatMul's weights, KDAStep's projections and the
// routed experts' matrices. It stands beside stepParts, which estimates
// the same bytes from the config, so that the bench's bounds and the
// model's work cannot drift apart unnoticed.
type weightReads struct {
	compute.Backend
	t      *testing.T
	stored map[any]int // storage of a weight → bytes per element in the checkpoint
	loaded bool        // Load returned
	on     bool        // counting
	bytes  int64       // weight bytes the products read while on
}

func (b *weightReads) FromHost(dt, src compute.DType, data []byte, dims ...int) (compute.Tensor, error) {
	w, err := b.Backend.FromHost(dt, src, data, dims...)
	if err == nil {
		b.stored[w.Mem] = src.Size()
	}
	return w, err
}

// Copy during load carries the element size into a tensor assembled from
// weights (the stacked q|k|v projection of a KDA layer).
func (b *weightReads) Copy(dst, src compute.Tensor) error {
	if size, ok := b.stored[src.Mem]; ok && !b.loaded {
		b.stored[dst.Mem] = size
	}
	return b.Backend.Copy(dst, src)
}

// Write during load uploads a weight computed on the host from a
// checkpoint matrix (the indexer's head weights, scaled): the presets
// here store their matrices in bf16, so it stands for 2 bytes an element
// (the backend holds it in float32 and reads twice that).
func (b *weightReads) Write(dst compute.Tensor, src any) error {
	if !b.loaded {
		b.stored[dst.Mem] = 2
	}
	return b.Backend.Write(dst, src)
}

func (b *weightReads) Free(t compute.Tensor) {
	delete(b.stored, t.Mem)
	b.Backend.Free(t)
}

// PrepareMatMul: a weight laid out for the products stands for the one
// the checkpoint stores.
func (b *weightReads) PrepareMatMul(w compute.Tensor) (compute.Tensor, error) {
	p, err := compute.PrepareMatMul(b.Backend, w)
	if err == nil {
		if size, ok := b.stored[w.Mem]; ok {
			b.stored[p.Mem] = size
		}
	}
	return p, err
}

// read adds the checkpoint bytes of weight w, which an operation read for
// rows rows of input; a decode step of one session reads each for one.
func (b *weightReads) read(op string, w compute.Tensor, rows int) {
	if !b.on || w.IsZero() {
		return
	}
	size, ok := b.stored[w.Mem]
	if !ok {
		b.t.Errorf("%s: weight %v is not a checkpoint tensor", op, w)
		return
	}
	if rows != 1 {
		b.t.Errorf("%s: %d rows in a one-token step", op, rows)
	}
	b.bytes += int64(w.Len() * size)
}

func (b *weightReads) MatMul(d, x, w compute.Tensor) error {
	b.read("MatMul", w, x.Len()/x.Dim(-1))
	return b.Backend.MatMul(d, x, w)
}

func (b *weightReads) HeadMatMul(d, x, w compute.Tensor) error {
	b.read("HeadMatMul", w, x.Dim(0))
	return b.Backend.HeadMatMul(d, x, w)
}

func (b *weightReads) KDAStep(a *compute.KDAStepArgs) error {
	rows, w := a.X.Dim(0), a.W
	if a.QKVIn.IsZero() { // else the caller ran these products
		for _, p := range []compute.Tensor{w.QKV, w.FA, w.FB, w.B, w.G, w.GA, w.GB} {
			b.read("KDAStep", p, rows)
		}
	}
	if a.Core.IsZero() {
		b.read("KDAStep", w.OProj, rows)
	}
	return b.Backend.KDAStep(a)
}

func (b *weightReads) MoEExperts(a *compute.ExpertArgs) error {
	if !b.on {
		return b.Backend.MoEExperts(a)
	}
	idx := make([]int32, a.Indices.Len())
	if err := b.Backend.Read(&idx, a.Indices); err != nil {
		return err
	}
	seen := map[int32]bool{}
	for _, e := range idx {
		if e < 0 || seen[e] {
			continue
		}
		seen[e] = true
		for _, w := range []compute.Tensor{a.W1[e], a.W3[e], a.W2[e]} {
			b.read("MoEExperts", w, a.X.Dim(0))
		}
	}
	return b.Backend.MoEExperts(a)
}

// TestStepBytesMatchTheOperations: the weight bytes stepParts counts for
// a one-token decode step (every weight but the embedding table and the
// experts not routed to) are those the step's products read, less the
// checkpoint's vectors and convolution taps, which no product reads; for
// presets with and without a latent MoE, including a latent as wide as
// the hidden state (whose projections once went unapplied while the
// bench counted them).
func TestStepBytesMatchTheOperations(t *testing.T) {
	for _, c := range []struct {
		preset, name string
		edit         func(text map[string]any)
	}{
		{"k31pro", "as-is", nil},
		{"k31pro", "latent-as-wide-as-hidden", func(text map[string]any) { text["routed_expert_hidden_size"] = text["hidden_size"] }},
		{"k31pro", "two-shared-experts-two-dense-layers", func(text map[string]any) {
			text["num_shared_experts"], text["first_k_dense_replace"] = 2, 2
		}},
		{"k31pro", "no-q-lora-no-output-gate", func(text map[string]any) {
			text["q_lora_rank"], text["mla_use_output_gate"] = nil, false
		}},
		{"k31pro", "moe-every-other-layer-attnres-blocks-of-3", func(text map[string]any) {
			text["moe_layer_freq"], text["attn_res_block_size"] = 2, 3
		}},
		{"k3", "as-is", nil},
		{"kimi_linear", "as-is", nil}, // tied embeddings, low-rank KDA gate, no latent
	} {
		t.Run(c.preset+"/"+c.name, func(t *testing.T) {
			dir := t.TempDir()
			opts := tiny.Options{Seed: 3, BF16: true, Edit: c.edit}
			require.NoError(t, tiny.Write(dir, c.preset, opts))
			ck, err := safetensors.OpenCheckpoint(dir)
			require.NoError(t, err)
			var unread int64 // vectors and conv taps: read by no product
			for _, name := range ck.Names() {
				info, _, _ := ck.Tensor(name)
				if len(info.Shape) != 2 || info.Shape[0] == 1 || info.Shape[1] == 1 {
					unread += info.Size
				}
			}
			require.NoError(t, ck.Close())

			be := &weightReads{Backend: cpu.New(1), t: t, stored: map[any]int{}}
			m, err := k3.Load(context.Background(), dir, k3.WithComputeBackend(be))
			require.NoError(t, err)
			defer m.Close()
			be.loaded = true
			s, err := m.NewSession()
			require.NoError(t, err)
			defer s.Close()
			ctx := context.Background()
			// More positions than the indexer keeps, so that DSA's step is sparse.
			_, err = s.Forward(ctx, []int32{5, 9, 14, 3, 7, 22, 41, 8, 13, 30, 6, 17})
			require.NoError(t, err)
			be.on = true
			_, err = s.Forward(ctx, []int32{11})
			be.on = false
			require.NoError(t, err)

			p := stepParts(m.Config, m.WeightBytes(), s.KDAStateBytes(), 1)
			want := int64(p.dense+p.experts) - unread
			t.Logf("%d weight bytes read by the step's products (%d in the checkpoint)", be.bytes, m.WeightBytes())
			require.Equal(t, want, be.bytes, "weight bytes a step's products read (stepParts counts %.0f, %d of them in vectors and taps)", p.dense+p.experts, unread)
		})
	}
}
