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

	"k3/compute"
)

// The saved-group-session format: an 8-byte magic and a little-endian
// uint16 version; the layout's TP, EP and CP counts (uint32 each) and a
// flags byte; the rank count (uint32); then each rank's session file
// (Session.Save's bytes, compressed and checksummed on their own),
// preceded by its length (uint64).
const (
	groupMagic   = "K3GROUP\n"
	groupVersion = 1
)

const (
	groupSplitIndexer byte = 1 << iota
	groupDispatch
	groupSerial
)

// Save writes the sequence every rank holds to w, a file that
// Group.LoadSession reads back on a group of the same layout (TP, EP and
// split indexer). Each rank's state is a session file of its own
// (Session.Save), written by the ranks at once. Under context
// parallelism it returns compute.ErrUnsupported.
func (gs *GroupSession) Save(w io.Writer) error {
	l := gs.g.layout.norm()
	if l.CP > 1 {
		return fmt.Errorf("%w: saving a sequence split over context-parallel ranks", compute.ErrUnsupported)
	}
	files := make([]bytes.Buffer, len(gs.ranks))
	var eg errgroup.Group
	for r, s := range gs.ranks {
		eg.Go(func() error {
			if err := s.Save(&files[r]); err != nil {
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
// group of the same TP, EP and split indexer (Dispatch and Serial change
// how the ranks talk, not what they hold). A file that is not a group
// session, was saved under another layout or from another checkpoint, is
// truncated or corrupted, or whose ranks hold different sequences fails
// with an error wrapping ErrSessionFile that names the rank; no session
// is returned then. Under context parallelism it returns
// compute.ErrUnsupported.
func (g *Group) LoadSession(r io.Reader) (*GroupSession, error) {
	l := g.layout.norm()
	if l.CP > 1 {
		return nil, fmt.Errorf("%w: loading a sequence split over context-parallel ranks", compute.ErrUnsupported)
	}
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
	for rank, m := range g.ranks {
		var size [8]byte
		if _, err := io.ReadFull(r, size[:]); err != nil {
			return fail(fmt.Errorf("%w: rank %d's length: %v", ErrSessionFile, rank, streamErr(err)))
		}
		lr := &io.LimitedReader{R: r, N: int64(min(binary.LittleEndian.Uint64(size[:]), 1<<62))}
		s, err := m.LoadSession(lr)
		if err != nil {
			return fail(fmt.Errorf("rank %d: %w", rank, err))
		}
		gs.ranks = append(gs.ranks, s)
		if lr.N != 0 {
			return fail(fmt.Errorf("%w: rank %d's session ends %d bytes before its length", ErrSessionFile, rank, lr.N))
		}
	}
	first := gs.ranks[0]
	for rank, s := range gs.ranks[1:] {
		if !slices.Equal(s.tokens, first.tokens) || !slices.EqualFunc(s.last, first.last, sameBits) {
			return fail(fmt.Errorf("%w: rank %d holds another sequence than rank 0", ErrSessionFile, rank+1))
		}
	}
	return gs, nil
}

func sameBits(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }
