package k3

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"slices"

	"golang.org/x/sync/errgroup"

	"k3/config"
	"k3/dsa"
)

// The saved-group-session format: an 8-byte magic and a little-endian
// uint16 version; the layout's TP, EP and CP counts (uint32 each) and a
// flags byte; the rank count (uint32); then each rank's file (Session.Save's
// bytes, or under context parallelism the rank's share below, each
// compressed and checksummed on its own), preceded by its length
// (uint64).
const (
	groupMagic   = "K3GROUP\n"
	groupVersion = 1
)

// Under context parallelism each rank's file holds its share of the
// sequence in a frame of its own (saveFramed): the model's fingerprint,
// the tokens and next-token logits, the placement (the CP rank holding
// each position), the rank's index in its CP group, then per layer the
// KDA state or the attention cache's rows of the positions the rank
// holds.
const (
	cpMagic   = "K3CPSEQ\n"
	cpVersion = 1
)

const (
	groupSplitIndexer byte = 1 << iota
	groupDispatch
	groupSerial
)

// Save writes the sequence every rank holds to w, a file that
// Group.LoadSession reads back on a group of the same layout (TP, EP, CP
// and split indexer). Each rank's state is a file of its own
// (Session.Save's, or under context parallelism the rank's share of the
// positions), written by the ranks at once.
func (gs *GroupSession) Save(w io.Writer) error {
	l := gs.g.layout.norm()
	save := func(r int, w io.Writer) error { return gs.ranks[r].Save(w) }
	n := len(gs.ranks)
	if l.CP > 1 {
		if gs.cp == nil {
			return ErrSessionClosed
		}
		if gs.broken != nil {
			return fmt.Errorf("k3: cannot save a failed group session: %w", gs.broken)
		}
		save = func(r int, w io.Writer) error {
			return saveFramed(w, cpMagic, cpVersion, func(sw *sessionWriter) error {
				return gs.cp[r].writeBody(sw, gs.shell.tokens, gs.shell.last)
			})
		}
		n = len(gs.cp)
	}
	files := make([]bytes.Buffer, n)
	var eg errgroup.Group
	for r := range n {
		eg.Go(func() error {
			if err := save(r, &files[r]); err != nil {
				return fmt.Errorf("rank %d: %w", r, err)
			}
			return nil
		})
	}
	if err := eg.Wait(); err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	bw.WriteString(groupMagic)
	var flags byte
	if l.SplitIndexer {
		flags |= groupSplitIndexer
	}
	if l.Dispatch {
		flags |= groupDispatch
	}
	if l.Serial {
		flags |= groupSerial
	}
	head := binary.LittleEndian.AppendUint16(nil, groupVersion)
	for _, v := range []int{l.TP, l.EP, l.CP} {
		head = binary.LittleEndian.AppendUint32(head, uint32(v))
	}
	head = append(head, flags)
	head = binary.LittleEndian.AppendUint32(head, uint32(len(files)))
	bw.Write(head)
	for i := range files {
		bw.Write(binary.LittleEndian.AppendUint64(nil, uint64(files[i].Len())))
		if _, err := files[i].WriteTo(bw); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// LoadSession reads a group session that GroupSession.Save wrote, on a
// group of the same TP, EP, CP and split indexer (Dispatch and Serial
// change how the ranks talk, not what they hold). A file that is not a
// group session, was saved under another layout or from another
// checkpoint, is truncated or corrupted, or whose ranks hold different
// sequences fails with an error wrapping ErrSessionFile that names the
// rank; no session is returned then.
func (g *Group) LoadSession(r io.Reader) (*GroupSession, error) {
	l := g.layout.norm()
	var head [8 + 2 + 12 + 1 + 4]byte
	if n, err := io.ReadFull(r, head[:10]); err != nil {
		return nil, fmt.Errorf("%w: %d-byte header: %v (%d bytes)", ErrSessionFile, 10, err, n)
	}
	if string(head[:8]) != groupMagic {
		return nil, fmt.Errorf("%w: not a k3 group session (it starts %q)", ErrSessionFile, head[:8])
	}
	if v := binary.LittleEndian.Uint16(head[8:]); v != groupVersion {
		return nil, fmt.Errorf("%w: group format version %d; this k3 reads version %d", ErrSessionFile, v, groupVersion)
	}
	if _, err := io.ReadFull(r, head[10:]); err != nil {
		return nil, fmt.Errorf("%w: the layout and rank count: %v", ErrSessionFile, streamErr(err))
	}
	u32 := func(i int) int { return int(binary.LittleEndian.Uint32(head[10+4*i:])) }
	flags := head[22]
	saved := Layout{TP: u32(0), EP: u32(1), CP: u32(2), SplitIndexer: flags&groupSplitIndexer != 0,
		Dispatch: flags&groupDispatch != 0, Serial: flags&groupSerial != 0}
	if saved.TP != l.TP || saved.EP != l.EP || saved.CP != l.CP || saved.SplitIndexer != l.SplitIndexer {
		return nil, fmt.Errorf("%w: saved by a group of layout %v; this group is %v", ErrSessionFile, saved, l)
	}
	if n := int(binary.LittleEndian.Uint32(head[23:])); n != len(g.ranks) {
		return nil, fmt.Errorf("%w: %d ranks; layout %v has %d", ErrSessionFile, n, l, len(g.ranks))
	}
	gs := &GroupSession{g: g}
	fail := func(err error) (*GroupSession, error) {
		gs.Close()
		return nil, err
	}
	var tokens []int32 // rank 0's, which every rank must hold
	var last []float32
	for rank, m := range g.ranks {
		var size [8]byte
		if _, err := io.ReadFull(r, size[:]); err != nil {
			return fail(fmt.Errorf("%w: rank %d's length: %v", ErrSessionFile, rank, streamErr(err)))
		}
		lr := &io.LimitedReader{R: r, N: int64(min(binary.LittleEndian.Uint64(size[:]), 1<<62))}
		var toks []int32
		var logits []float32
		if l.CP > 1 {
			q, err := m.newCPSeq(g.cp[rank%l.TP][rank/l.TP])
			if err != nil {
				return fail(err)
			}
			gs.cp = append(gs.cp, q)
			err = loadFramed(lr, cpMagic, "a k3 context-parallel share", 1, cpVersion, func(sr *sessionReader, _ uint16) error {
				var err error
				toks, logits, err = q.readBody(sr)
				return err
			})
			if err != nil {
				return fail(fmt.Errorf("rank %d: %w", rank, err))
			}
			if p := gs.cp[0].place; !samePlacement(q.place, p) {
				return fail(fmt.Errorf("%w: rank %d places the positions otherwise than rank 0", ErrSessionFile, rank))
			}
		} else {
			s, err := m.LoadSession(lr)
			if err != nil {
				return fail(fmt.Errorf("rank %d: %w", rank, err))
			}
			gs.ranks = append(gs.ranks, s)
			toks, logits = s.tokens, s.last
		}
		if lr.N != 0 {
			return fail(fmt.Errorf("%w: rank %d's state ends %d bytes before its length", ErrSessionFile, rank, lr.N))
		}
		if rank == 0 {
			tokens, last = toks, logits
		} else if !slices.Equal(toks, tokens) || !slices.EqualFunc(logits, last, sameBits) {
			return fail(fmt.Errorf("%w: rank %d holds another sequence than rank 0", ErrSessionFile, rank))
		}
	}
	if l.CP > 1 {
		gs.shell = &Session{m: g.ranks[0], limit: gs.cp[0].limit, pos: len(tokens), tokens: tokens, last: last}
	}
	return gs, nil
}

// samePlacement reports whether a and b place every position alike.
func samePlacement(a, b *dsa.Placement) bool {
	if a.Len() != b.Len() || a.Ranks() != b.Ranks() {
		return false
	}
	for i := range a.Len() {
		if a.Rank(i) != b.Rank(i) {
			return false
		}
	}
	return true
}

// writeBody writes rank q's share of the sequence whose tokens and
// next-token logits are tokens and last (the group session's shell).
func (q *cpSeq) writeBody(sw *sessionWriter, tokens []int32, last []float32) error {
	m := q.m
	if err := m.life.enter(); err != nil {
		return err
	}
	defer m.life.exit()
	sw.sequence(m, tokens, last)
	sw.u32(uint32(q.place.Ranks()))
	for i := range q.place.Len() {
		sw.u32(uint32(q.place.Rank(i)))
	}
	// The ranks of a CP group may be whole models alike, their
	// fingerprints too: the share names its rank.
	sw.u32(uint32(q.c.Rank()))
	for l, ly := range m.layers {
		if ly.kind == config.KDA {
			sw.byte(layerKDA)
			if err := sw.kdaState(m.b, q.st[l]); err != nil {
				return err
			}
			continue
		}
		sw.byte(layerAttn)
		if err := sw.cacheRows(q.cache[l]); err != nil {
			return err
		}
	}
	return sw.err
}

// readBody reads what writeBody wrote into q, a new sequence of its rank,
// and returns the tokens and logits; every length is checked before
// anything is allocated.
func (q *cpSeq) readBody(sr *sessionReader) ([]int32, []float32, error) {
	m := q.m
	if err := m.life.enter(); err != nil {
		return nil, nil, err
	}
	defer m.life.exit()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrSessionFile}, args...)...)
	}
	tokens, last, err := sr.sequence(m, q.limit)
	if err != nil {
		return nil, nil, err
	}
	n := len(tokens)
	ranks, err := sr.u32("the placement's rank count")
	if err != nil {
		return nil, nil, err
	}
	if int(ranks) != q.place.Ranks() {
		return nil, nil, bad("positions placed over %d ranks; this group's CP groups have %d", ranks, q.place.Ranks())
	}
	for i := range n {
		r, err := sr.u32("the placement")
		if err != nil {
			return nil, nil, err
		}
		if r >= ranks {
			return nil, nil, bad("position %d placed on rank %d of %d", i, r, ranks)
		}
		q.place.Add(int(r), 1)
	}
	me, err := sr.u32("the share's rank")
	if err != nil {
		return nil, nil, err
	}
	if int(me) != q.c.Rank() {
		return nil, nil, bad("the share of CP rank %d, read by rank %d", me, q.c.Rank())
	}
	held := q.place.Held(q.c.Rank())
	for l, ly := range m.layers {
		kind, err := sr.byte(fmt.Sprintf("layer %d's kind", l))
		if err != nil {
			return nil, nil, err
		}
		if ly.kind == config.KDA {
			if kind != layerKDA {
				return nil, nil, bad("layer %d is a KDA layer; the file holds kind %d there", l, kind)
			}
			if _, _, err := sr.kdaState(m.b, q.st[l], l); err != nil {
				return nil, nil, err
			}
			continue
		}
		if kind != layerAttn {
			return nil, nil, bad("layer %d is an attention layer; the file holds kind %d there", l, kind)
		}
		if err := sr.cacheRows(q.cache[l], held, l); err != nil {
			return nil, nil, err
		}
	}
	return tokens, last, nil
}

func sameBits(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }
