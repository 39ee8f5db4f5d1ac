package k3

import (
	"fmt"
	"runtime"

	"golang.org/x/sync/errgroup"

	"k3/compute"
	"k3/config"
	"k3/kda"
	"k3/replay"
)

// WithRollback sets how many tokens back Session.Truncate stays cheap: the
// KDA layers keep ReplaySSM logs (a checkpoint plus per-token records) that
// reach n tokens behind the newest, so rolling back within them replays
// records instead of the whole history. The default, 0, keeps no logs:
// each KDA layer of each session would hold one more state and
// n+2·ExactTokens records (Session.StateBytes counts them), and every
// decode step would copy its records. Speculative decoding, which rolls
// back every step, wants at least ExactTokens.
func WithRollback(n int) Option { return func(o *options) { o.rollback = n } }

// replayConfig is the logs' configuration for a rollback depth: the
// checkpoint moves every ExactTokens committed tokens beyond the depth,
// and a pass may append up to ExactTokens records before it commits.
func replayConfig(rollback int) replay.Config {
	return replay.Config{Interval: rollback + ExactTokens, MaxSpeculative: ExactTokens, Keep: rollback}
}

func replayShape(c kda.Config) replay.Shape {
	return replay.Shape{Heads: c.NumHeads, DK: c.HeadDim, DV: c.HeadDim, ConvChannels: 3 * c.NumHeads * c.HeadDim, ConvWidth: c.ConvKernel}
}

// recorder carries the replay records of a pass's KDA rows from the
// backend to the logs: a device tensor the step writes and a host copy.
// On a backend that captures graphs each KDA layer has rows of its own
// (perLayer), so that a captured step writes all of them and the logs
// take them after it; elsewhere the layers share the rows, each layer's
// records going to the logs before the next layer writes.
type recorder struct {
	dev        compute.Tensor // [rows, RecordLen], or [kdaLayers·rows, RecordLen] perLayer
	host, view []float32
	rl, max    int // the record's length; rows per layer
	perLayer   bool
	slot       []int // perLayer: layer l's block of rows; -1 for other layers
}

// newRecorder sizes a recorder for passes of up to rows rows of the
// model's KDA layers; it is the zero recorder when the model keeps no logs.
func (m *Model) newRecorder(rows int) (*recorder, error) {
	if m.rollback == 0 {
		return &recorder{}, nil
	}
	r := &recorder{max: rows, perLayer: m.graphs != nil}
	blocks := 0
	for _, ly := range m.layers {
		if ly.kind != config.KDA {
			r.slot = append(r.slot, -1)
			continue
		}
		r.rl = kda.RecordLen(ly.kdaCfg)
		r.slot = append(r.slot, blocks)
		blocks++
	}
	if blocks == 0 {
		return &recorder{}, nil
	}
	if !r.perLayer {
		blocks = 1
	}
	t, err := m.b.Alloc(compute.F32, blocks*rows, r.rl)
	if err != nil {
		return nil, err
	}
	r.dev, r.host = t, make([]float32, rows*r.rl)
	return r, nil
}

// short reports whether a pass of n exact rows has more than the recorder
// holds.
func (r *recorder) short(n int) bool { return !r.dev.IsZero() && n > r.max }

// rows returns the device rows layer l's part of a step of n rows writes
// (the zero Tensor when the model keeps no logs).
func (r *recorder) rows(l, n int) compute.Tensor {
	if r.dev.IsZero() {
		return compute.Tensor{}
	}
	if r.perLayer {
		return r.dev.Rows(r.slot[l]*r.max, r.slot[l]*r.max+n)
	}
	return r.dev.Rows(0, n)
}

// read brings layer l's n rows of records to the host, or nil when the
// model keeps no logs.
func (r *recorder) read(b compute.Backend, l, n int) ([]float32, error) {
	if r.dev.IsZero() {
		return nil, nil
	}
	// Through a field, passed by pointer: a local's address would move it
	// to the heap on every step.
	r.view = r.host[:n*r.rl]
	if err := b.Read(&r.view, r.rows(l, n)); err != nil {
		return nil, err
	}
	return r.view, nil
}

// appendAll appends every KDA layer's records of a pass (perLayer) to the
// logs of its sessions, the rows cu[i] to cu[i+1]-1 being sessions[i]'s.
func (r *recorder) appendAll(b compute.Backend, sessions []*Session, cu []int32) error {
	if !r.perLayer || r.dev.IsZero() || len(sessions) == 0 {
		return nil
	}
	for l, slot := range r.slot {
		if slot < 0 {
			continue
		}
		if err := r.appendRuns(b, sessions, cu, l); err != nil {
			return err
		}
	}
	return nil
}

// appendRuns appends the records of rows cu[i] to cu[i+1]-1 to
// sessions[i]'s log of layer l.
func (r *recorder) appendRuns(b compute.Backend, sessions []*Session, cu []int32, l int) error {
	h, err := r.read(b, l, int(cu[len(cu)-1]))
	if h == nil || err != nil {
		return err
	}
	for i, s := range sessions {
		for row := cu[i]; row < cu[i+1]; row++ {
			if err := s.logs[l].AppendFlat(h[int(row)*r.rl : int(row+1)*r.rl]); err != nil {
				return err
			}
		}
	}
	return nil
}

// newLogs makes a session's logs, one per KDA layer (nil elsewhere), or nil
// when the model keeps none.
func (m *Model) newLogs() ([]*replay.Log, error) {
	if m.rollback == 0 {
		return nil, nil
	}
	logs := make([]*replay.Log, len(m.layers))
	for l, ly := range m.layers {
		if ly.kind != config.KDA {
			continue
		}
		lg, err := replay.NewLog(replayShape(ly.kdaCfg), replayConfig(m.rollback))
		if err != nil {
			return nil, err
		}
		logs[l] = lg
	}
	return logs, nil
}

// commitLogs records a successful pass of t tokens: exact passes commit
// the records they appended; prefill chunks, which append none, move each
// checkpoint to the live state.
func (s *Session) commitLogs(t int) error {
	for l, lg := range s.logs {
		if lg == nil {
			continue
		}
		if t <= ExactTokens {
			if err := lg.Commit(t); err != nil {
				return err
			}
			continue
		}
		st := s.kdaSt[l]
		err := lg.Rebase(s.pos, func(state, conv []float32) error {
			if err := s.m.b.Read(&state, st.S); err != nil {
				return err
			}
			return s.m.b.Read(&conv, st.Conv)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// rollback restores every KDA layer's state to position pos from its log
// and truncates the attention caches; it reports false, changing nothing,
// when some log no longer reaches pos.
func (s *Session) rollback(pos int) (bool, error) {
	if s.logs == nil || pos < 0 {
		return false, nil
	}
	for _, lg := range s.logs {
		if lg != nil && (pos < lg.Base() || pos > lg.Pos()) {
			return false, nil
		}
	}
	// The layers replay independently: one goroutine per core, each with
	// its own host copy of a state.
	b := s.m.b
	workers := min(runtime.GOMAXPROCS(0), len(s.logs))
	for len(s.scratch) < workers {
		s.scratch = append(s.scratch, [2][]float32{})
	}
	free := make(chan int, workers)
	for w := range workers {
		free <- w
	}
	var g errgroup.Group
	for l, lg := range s.logs {
		if lg == nil {
			continue
		}
		g.Go(func() error {
			w := <-free
			defer func() { free <- w }()
			sh := lg.Shape()
			st, cv := grow(s.scratch[w][0], sh.StateLen()), grow(s.scratch[w][1], sh.ConvLen())
			s.scratch[w] = [2][]float32{st, cv}
			if err := lg.StateAt(pos, st, cv); err != nil {
				return err
			}
			if err := b.Write(s.kdaSt[l].S, st); err != nil {
				return err
			}
			if err := b.Write(s.kdaSt[l].Conv, cv); err != nil {
				return err
			}
			return lg.Rewind(pos)
		})
	}
	if err := g.Wait(); err != nil {
		return false, err
	}
	for _, c := range s.caches {
		if c != nil {
			if err := c.Truncate(pos); err != nil {
				return false, fmt.Errorf("k3: truncate cache: %w", err)
			}
		}
	}
	s.pos, s.tokens, s.last = pos, s.tokens[:pos], nil
	s.forgetAfter(pos)
	return true, nil
}

// forgetAfter drops what described tokens past pos, which a rollback took
// back: the snapshots taken after it (a later Truncate beyond the logs
// would restore tokens the session no longer holds) and the prefix
// cache's turn state; the next snapshot comes at the next multiple of the
// interval after pos again.
func (s *Session) forgetAfter(pos int) {
	k := len(s.snaps)
	for k > 0 && s.snaps[k-1].pos > pos {
		k--
	}
	s.snaps = s.snaps[:k]
	if iv := s.m.snapInterval; iv > 0 {
		s.nextSnap = (pos/iv + 1) * iv
	}
	if s.turn != nil && s.turn.pos > pos {
		s.turn = nil
	}
}

func grow(v []float32, n int) []float32 {
	if cap(v) < n {
		return make([]float32, n)
	}
	return v[:n]
}

// WithSnapshots makes every session copy its KDA states every interval
// tokens (at the end of the pass that reaches the next multiple), keeping
// the newest keep copies: Truncate further back than the replay logs reach
// then restores the newest snapshot before the cut and runs the tokens
// after it again, at most about one interval, instead of the whole
// history. Each snapshot holds one copy of every KDA layer's state and
// conv window (Session.StateBytes counts them). interval 0, the default,
// takes none.
func WithSnapshots(interval, keep int) Option {
	return func(o *options) { o.snapInterval, o.snapKeep = interval, keep }
}

// snapshot is a copy of every KDA layer's state and conv window at pos.
type snapshot struct {
	pos  int
	data [][]float32 // per layer (nil at attention layers): state, then conv window
}

// takeSnapshot records the KDA states when the session has passed its
// next snapshot position.
func (s *Session) takeSnapshot() error {
	iv := s.m.snapInterval
	if iv == 0 || s.pos < s.nextSnap {
		return nil
	}
	s.nextSnap = (s.pos/iv + 1) * iv
	var sn *snapshot
	if len(s.snaps) >= s.m.snapKeep {
		sn = s.snaps[0] // the oldest gives its buffers
		s.snaps = append(s.snaps[:0], s.snaps[1:]...)
	} else {
		sn = &snapshot{data: make([][]float32, len(s.kdaSt))}
	}
	sn.pos = s.pos
	if _, err := s.snapshotState(sn.data); err != nil {
		return err
	}
	s.snaps = append(s.snaps, sn)
	return nil
}

// snapshotState copies every KDA layer's state and conv window of s into
// into (reusing its buffers; nil: new ones) and returns it.
func (s *Session) snapshotState(into [][]float32) ([][]float32, error) {
	if into == nil {
		into = make([][]float32, len(s.kdaSt))
	}
	for l, st := range s.kdaSt {
		if st == nil {
			continue
		}
		ns, nc := st.S.Len(), st.Conv.Len()
		into[l] = grow(into[l], ns+nc)
		v := into[l]
		if err := s.m.b.Read(v[:ns], st.S); err != nil {
			return nil, err
		}
		if err := s.m.b.Read(v[ns:], st.Conv); err != nil {
			return nil, err
		}
	}
	return into, nil
}

// loadState puts a snapshotState copy taken at pos back into the KDA
// states, and rebases the replay logs on it.
func (s *Session) loadState(pos int, data [][]float32) error {
	b := s.m.b
	for l, st := range s.kdaSt {
		if st == nil {
			continue
		}
		v, ns := data[l], st.S.Len()
		if err := b.Write(st.S, v[:ns]); err != nil {
			return err
		}
		if err := b.Write(st.Conv, v[ns:]); err != nil {
			return err
		}
		if s.logs != nil && s.logs[l] != nil {
			err := s.logs[l].Rebase(pos, func(state, conv []float32) error {
				copy(state, v[:ns])
				copy(conv, v[ns:])
				return nil
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// restoreSnapshot rewinds the session to its newest snapshot at or before
// pos; it reports false, changing nothing, when there is none.
func (s *Session) restoreSnapshot(pos int) (bool, error) {
	k := -1
	for i, sn := range s.snaps {
		if sn.pos <= pos {
			k = i
		}
	}
	if k < 0 {
		return false, nil
	}
	sn := s.snaps[k]
	s.snaps = s.snaps[:k+1]
	if err := s.loadState(sn.pos, sn.data); err != nil {
		return false, err
	}
	for _, c := range s.caches {
		if c != nil {
			if err := c.Truncate(sn.pos); err != nil {
				return false, fmt.Errorf("k3: truncate cache: %w", err)
			}
		}
	}
	s.pos, s.tokens, s.last = sn.pos, s.tokens[:sn.pos], nil
	s.nextSnap = (sn.pos/s.m.snapInterval + 1) * s.m.snapInterval
	return true, nil
}

// snapshotBytes is the memory the session's snapshots hold (the prefix
// cache's turn snapshot included).
func (s *Session) snapshotBytes() int64 {
	var n int64
	for _, sn := range s.snaps {
		for _, v := range sn.data {
			n += 4 * int64(len(v))
		}
	}
	if s.turn != nil {
		for _, v := range s.turn.data {
			n += 4 * int64(len(v))
		}
	}
	return n
}
