package dsa

import (
	"fmt"

	"k3/compute"
	"k3/internal/kernel"
)

// splitIndexer is the scratch of an indexer split by heads: the partial
// scores of a run's rows, their sum read back, and the selection.
type splitIndexer struct {
	scores compute.Tensor // [rows, keys] capacity, grown on demand
	host   []float32
	sel    []int32
}

// selectSummed runs the indexer set up in l.ixArgs for this rank's heads
// with the scores kept, adds the other ranks' partial scores
// (l.SplitIndexer), and writes each row's top K of the sum to idx
// [t, TopK] (-1 padded). Rows see the keys up to their own position.
func (s *splitIndexer) selectSummed(l *Layer, idx compute.Tensor, pos []int32, keys int) error {
	b, t, k := l.b, len(pos), l.cfg.Indexer.TopK
	if s.scores.IsZero() || s.scores.Len() < t*keys {
		if !s.scores.IsZero() {
			b.Free(s.scores)
		}
		var err error
		if s.scores, err = b.Alloc(compute.F32, max(t*keys, 2*s.scores.Len())); err != nil {
			return fmt.Errorf("dsa: split indexer scores: %w", err)
		}
	}
	sc := s.scores.Rows(0, t*keys).Reshape(t, keys)
	l.ixArgs.Scores = sc
	if err := b.LightningIndexer(&l.ixArgs); err != nil {
		return fmt.Errorf("dsa: indexer: %w", err)
	}
	l.ixArgs.Scores = compute.Tensor{}
	if err := l.SplitIndexer(sc); err != nil {
		return fmt.Errorf("dsa: indexer scores over the heads' ranks: %w", err)
	}
	s.host = growF(s.host, t*keys)
	if err := b.Read(&s.host, sc); err != nil {
		return err
	}
	s.sel = growI32(s.sel, t*k)
	for r, p := range pos {
		topKPadded(s.sel[r*k:(r+1)*k], s.host[r*keys:r*keys+min(int(p)+1, keys)])
	}
	return b.Write(idx, &s.sel)
}

// topKPadded writes to out the indices of the len(out) best scores in the
// backend's order (larger first, ties to the lower index), -1 past the
// number of scores.
func topKPadded(out []int32, scores []float32) {
	n := kernel.TopK(out, nil, scores, len(out))
	for i := n; i < len(out); i++ {
		out[i] = -1
	}
}
