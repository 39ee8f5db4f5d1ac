package dsa

import (
	"context"
	"fmt"
	"math"

	"k3/comm"
	"k3/compute"
)

// Split runs the sparse attention of decode rows over a cache whose
// positions are split over the ranks of a context-parallel group: page j
// of a rank holds global page j·n + rank (n ranks), so that a sequence's
// pages spread evenly as it grows. Each rank scores its own keys with the
// Lightning Indexer and keeps its best TopK; the ranks all-gather those
// candidates (score and position), every rank picks the same global top-K
// from them by the indexer's own order (larger score first, exact ties to
// the lower position), and only the selected latent and rope rows travel,
// each from the rank holding it to every rank, which attends over them.
// A decode step then moves about TopK rows however long the context,
// where gathering the cache would move all of it.
//
// Every rank computes the same output; scores are the arithmetic of the
// unsplit indexer per key, so the selection equals the unsplit one
// exactly.
type Split struct {
	B    compute.Backend
	Comm comm.Communicator
	// TopK, Latent and Rope are the indexer's K and the widths of a
	// latent and a rope row (dc, dr).
	TopK, Latent, Rope int

	scores, cand, all []float32
	local, qpos       []int32
	head, start, took []int // per rank: entries merged, where its rows start, rows placed
	latRows, peRows   []float32
	sel               []int32 // global positions of the selection, in rank order
	owner             []int32
	send, recv, rows  []float32
	sendN, recvN      []int
	idx, scoreT       compute.Tensor
	kv, pe            compute.Tensor
	candT, allT       compute.Tensor
	sendT, recvT      compute.Tensor
}

// SplitArgs are one decode row's operands on one rank.
type SplitArgs struct {
	IQ, IW  compute.Tensor   // the row's indexer query [1, HI, DI] and head weights [1, HI]
	IKPages []compute.Tensor // this rank's index-key pages
	Lat, PE []compute.Tensor // this rank's latent [PageSize, dc] and rope [PageSize, dr] pages
	Keys    int              // keys this rank holds
	Q, QPE  compute.Tensor   // the absorbed query [1, Hq, dc] and its rope part [1, Hq, dr]
	Scale   float32
	Out     compute.Tensor // [1, Hq, dc]
	// Selected, when not nil, receives the global top-K positions in the
	// indexer's order (-1 past the count), as the unsplit indexer gives.
	Selected []int32
}

// global is the position of this rank's local key i.
func (s *Split) global(i int) int32 {
	n, r := s.Comm.Size(), s.Comm.Rank()
	return int32((i/PageSize*n+r)*PageSize + i%PageSize)
}

func growF(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

func growI32(b []int32, n int) []int32 {
	if cap(b) < n {
		return make([]int32, n)
	}
	return b[:n]
}

// growInt returns b resized to n, zeroed.
func growInt(b []int, n int) []int {
	if cap(b) < n {
		return make([]int, n)
	}
	b = b[:n]
	clear(b)
	return b
}

func (s *Split) tensor(t *compute.Tensor, dims ...int) error {
	n := 1
	for _, d := range dims {
		n *= d
	}
	if !t.IsZero() && t.Len() >= n {
		*t = t.Reshape(t.Len()).Rows(0, n).Reshape(dims...)
		return nil
	}
	if !t.IsZero() {
		s.B.Free(*t)
	}
	var err error
	*t, err = s.B.Alloc(compute.F32, dims...)
	return err
}

// Decode computes one row's attention output on every rank of the group.
func (s *Split) Decode(ctx context.Context, a *SplitArgs) error {
	n, k, b := s.Comm.Size(), s.TopK, s.B
	w := s.Latent + s.Rope
	// 1. This rank's candidates: its best k keys and their scores.
	nl := 0
	if a.Keys > 0 {
		var err error
		if s.idx.IsZero() || s.idx.Len() < k {
			if s.idx, err = b.Alloc(compute.I32, 1, k); err != nil {
				return err
			}
		}
		if err := s.tensor(&s.scoreT, 1, a.Keys); err != nil {
			return err
		}
		s.qpos = append(s.qpos[:0], int32(a.Keys-1))
		ix := compute.IndexerArgs{Q: a.IQ, W: a.IW, KPages: a.IKPages, PageSize: PageSize, KLen: a.Keys,
			QPos: s.qpos, TopK: k, Indices: s.idx.Reshape(1, k), Scores: s.scoreT}
		if err := b.LightningIndexer(&ix); err != nil {
			return fmt.Errorf("dsa: split indexer: %w", err)
		}
		s.local = growI32(s.local, k)
		s.scores = growF(s.scores, a.Keys)
		if err := b.Read(&s.local, s.idx.Reshape(1, k)); err != nil {
			return err
		}
		if err := b.Read(&s.scores, s.scoreT); err != nil {
			return err
		}
		for nl < k && s.local[nl] >= 0 {
			nl++
		}
	}
	// Candidates as (score, position) pairs, padded with position -1.
	s.cand = growF(s.cand, 2*k)
	for i := range k {
		s.cand[2*i], s.cand[2*i+1] = float32(math.Inf(-1)), -1
		if i < nl {
			s.cand[2*i], s.cand[2*i+1] = s.scores[s.local[i]], float32(s.global(int(s.local[i])))
		}
	}
	if err := s.tensor(&s.candT, 2*k); err != nil {
		return err
	}
	if err := b.Write(s.candT, &s.cand); err != nil {
		return err
	}
	if err := s.tensor(&s.allT, 2*k*n); err != nil {
		return err
	}
	if err := s.Comm.AllGather(ctx, s.allT, s.candT); err != nil {
		return fmt.Errorf("dsa: split candidates: %w", err)
	}
	s.all = growF(s.all, 2*k*n)
	if err := b.Read(s.all, s.allT); err != nil {
		return err
	}
	// 2. The global top-K: every rank's list is ranked, so merge them.
	s.sel, s.owner = s.sel[:0], s.owner[:0]
	s.head = growInt(s.head, n)
	head := s.head
	for len(s.sel) < k {
		best := -1
		for r := range n {
			if head[r] >= k || s.all[2*(r*k+head[r])+1] < 0 {
				continue
			}
			if best < 0 || better(s.all[2*(r*k+head[r])], s.all[2*(r*k+head[r])+1], s.all[2*(best*k+head[best])], s.all[2*(best*k+head[best])+1]) {
				best = r
			}
		}
		if best < 0 {
			break
		}
		s.sel = append(s.sel, int32(s.all[2*(best*k+head[best])+1]))
		s.owner = append(s.owner, int32(best))
		head[best]++
	}
	if a.Selected != nil {
		for i := range a.Selected {
			a.Selected[i] = -1
			if i < len(s.sel) {
				a.Selected[i] = s.sel[i]
			}
		}
	}
	// 3. Only the selected rows travel: this rank's, in selection order,
	// to every rank; rank r's rows arrive as head[r] of them.
	mine := head[s.Comm.Rank()]
	s.send = growF(s.send, mine*w)
	at := 0
	for i, o := range s.owner {
		if int(o) != s.Comm.Rank() {
			continue
		}
		g := int(s.sel[i])
		page := g / PageSize / n
		off := g % PageSize
		row := s.send[at*w : (at+1)*w]
		if err := b.Read(row[:s.Latent], a.Lat[page].Rows(off, off+1)); err != nil {
			return err
		}
		if s.Rope > 0 {
			if err := b.Read(row[s.Latent:], a.PE[page].Rows(off, off+1)); err != nil {
				return err
			}
		}
		at++
	}
	s.sendN, s.recvN = s.sendN[:0], s.recvN[:0]
	total := 0
	for r := range n {
		s.sendN = append(s.sendN, mine*w)
		s.recvN = append(s.recvN, head[r]*w)
		total += head[r] * w
	}
	// All-to-all-v takes one block per destination: the same rows n times.
	if err := s.tensor(&s.sendT, max(n*mine*w, 1)); err != nil {
		return err
	}
	if mine > 0 {
		for r := range n {
			if err := b.Write(s.sendT.Rows(r*mine*w, (r+1)*mine*w), &s.send); err != nil {
				return err
			}
		}
	}
	if err := s.tensor(&s.recvT, max(total, 1)); err != nil {
		return err
	}
	if err := s.Comm.AllToAllV(ctx, s.recvT, s.recvN, s.sendT, s.sendN); err != nil {
		return fmt.Errorf("dsa: split rows: %w", err)
	}
	s.recv = growF(s.recv, total)
	if total > 0 {
		if err := b.Read(s.recv, s.recvT.Rows(0, total)); err != nil {
			return err
		}
	}
	// 4. Rows back in selection order, then attention over them.
	m := len(s.sel)
	if m == 0 {
		return fmt.Errorf("dsa: split attention: no keys on any rank")
	}
	s.start, s.took = growInt(s.start, n+1), growInt(s.took, n)
	start, taken := s.start, s.took
	for r := range n {
		start[r+1] = start[r] + head[r]
	}
	s.rows = growF(s.rows, m*w)
	for i, o := range s.owner {
		src := (start[o] + taken[o]) * w
		taken[o]++
		copy(s.rows[i*w:(i+1)*w], s.recv[src:src+w])
	}
	if err := s.tensor(&s.kv, m, 1, s.Latent); err != nil {
		return err
	}
	s.latRows, s.peRows = growF(s.latRows, m*s.Latent), growF(s.peRows, m*s.Rope)
	lat, pe := s.latRows, s.peRows
	for i := range m {
		copy(lat[i*s.Latent:(i+1)*s.Latent], s.rows[i*w:i*w+s.Latent])
		copy(pe[i*s.Rope:(i+1)*s.Rope], s.rows[i*w+s.Latent:(i+1)*w])
	}
	if err := b.Write(s.kv, &s.latRows); err != nil {
		return err
	}
	s.qpos = append(s.qpos[:0], int32(m-1))
	at2 := compute.AttnArgs{Q: a.Q, K: s.kv, V: s.kv, KVLen: m, Scale: a.Scale, Out: a.Out, QPos: s.qpos}
	if s.Rope > 0 {
		if err := s.tensor(&s.pe, m, s.Rope); err != nil {
			return err
		}
		if err := b.Write(s.pe, &s.peRows); err != nil {
			return err
		}
		at2.QRope, at2.KRope = a.QPE, s.pe
	}
	if err := b.Attention(&at2); err != nil {
		return fmt.Errorf("dsa: split attention: %w", err)
	}
	return nil
}

// better is the indexer's order: larger score first, exact ties to the
// lower position.
func better(a, pa, b, pb float32) bool {
	if a != b {
		return a > b
	}
	return pa < pb
}
