package k3

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math"

	"github.com/klauspost/compress/zstd"

	"k3/compute"
	"k3/config"
	"k3/dsa"
	"k3/kda"
	"k3/replay"
)

// ErrSessionFile is wrapped by every error about the bytes of a saved
// session: not a session file, another format version, saved from another
// model, truncated, corrupted, or shaped unlike this model's state.
var ErrSessionFile = errors.New("k3: bad session file")

// The saved-session format: an 8-byte magic and a little-endian uint16
// version, uncompressed, then one zstd stream holding the body and, last,
// the CRC-32C of the body. The body: the model's fingerprint (32 bytes),
// the token count and tokens, the next-token logits, then each layer's
// state in order: a KDA layer's conv window and recurrent state and, when
// the session kept them, its replay log's checkpoint and committed
// records; an attention layer's cache rows; then (version 2) the DSpark
// taps the session keeps. Every length is written and checked against the
// model before anything is allocated. LoadSession reads version 1 too.
const (
	sessionMagic   = "K3SESSN\n"
	sessionVersion = 2
)

const (
	layerKDA  byte = 1
	layerAttn byte = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sessionWindow is the zstd window of saved sessions (floats compress
// little; a larger window gains nothing).
const sessionWindow = 1 << 22

// fingerprint identifies the model a session belongs to: a hash of its
// configuration, every tensor's name, type and shape, and the first bytes
// of every tensor's data (so that two checkpoints of one shape differ);
// for a Group's rank also the rank and what the layout gives it to hold
// (TP ranks hold shards of one shape).
func (m *Model) fingerprint() [32]byte {
	m.fpOnce.Do(func() {
		h := sha256.New()
		cfg, _ := json.Marshal(m.Config)
		h.Write(cfg)
		if p := m.par; p != nil {
			l := p.layout.norm()
			fmt.Fprintf(h, "\x00rank %d of tp%d ep%d cp%d split-indexer %v", p.rank, l.TP, l.EP, l.CP, l.SplitIndexer)
		}
		for _, name := range m.ck.Names() {
			data, t, err := m.ck.Bytes(name)
			if err != nil {
				continue
			}
			fmt.Fprintf(h, "\x00%s %v %v ", name, t.DType, t.Shape)
			h.Write(data[:min(len(data), 64)])
		}
		copy(m.fp[:], h.Sum(nil))
	})
	return m.fp
}

// Save writes the session's state to w: its tokens, next-token logits,
// KDA states (with their replay logs, WithRollback), attention caches and
// the hidden states a DSpark drafter reads, zstd-compressed with a format
// version and a checksum. Model.LoadSession reads it back into a session
// that continues exactly as this one would.
// Snapshots (WithSnapshots) and the prefix cache's references are not
// saved. A speculation in flight cannot be saved (Save is called between
// generations).
func (s *Session) Save(w io.Writer) error {
	if err := s.usable(); err != nil {
		return err
	}
	if err := s.m.life.enter(); err != nil {
		return err
	}
	defer s.m.life.exit()
	if s.broken != nil {
		return fmt.Errorf("k3: cannot save a failed session: %w", s.broken)
	}
	return saveFramed(w, sessionMagic, sessionVersion, s.writeBody)
}

// saveFramed writes the frame every saved state shares: an 8-byte magic
// and a uint16 version, then one zstd stream of the body and its CRC-32C.
func saveFramed(w io.Writer, magic string, version uint16, body func(*sessionWriter) error) error {
	var head [10]byte
	copy(head[:], magic)
	binary.LittleEndian.PutUint16(head[8:], version)
	if _, err := w.Write(head[:]); err != nil {
		return err
	}
	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1),
		zstd.WithWindowSize(sessionWindow))
	if err != nil {
		return err
	}
	sw := &sessionWriter{w: bufio.NewWriterSize(zw, 1<<16), crc: crc32.New(castagnoli)}
	if err := body(sw); err != nil {
		zw.Close()
		return err
	}
	var sum [4]byte
	binary.LittleEndian.PutUint32(sum[:], sw.crc.Sum32())
	sw.w.Write(sum[:])
	if err := sw.w.Flush(); err != nil {
		zw.Close()
		return err
	}
	return zw.Close()
}

func (s *Session) writeBody(sw *sessionWriter) error {
	sw.sequence(s.m, s.tokens, s.last)
	b := s.m.b
	for l, ly := range s.m.layers {
		if ly.kind == config.KDA {
			sw.byte(layerKDA)
			if err := sw.kdaState(b, s.kdaSt[l]); err != nil {
				return err
			}
			var lg *replay.Log
			if l < len(s.logs) {
				lg = s.logs[l]
			}
			if lg == nil {
				sw.byte(0)
				continue
			}
			if lg.Speculative() > 0 {
				return errors.New("k3: cannot save a session with a speculation in flight")
			}
			ckState, ckConv, base := lg.Checkpoint()
			n := lg.Pos() - base
			sw.byte(1)
			sw.u32(uint32(base))
			sw.u32(uint32(n))
			sw.floats(ckState)
			sw.floats(ckConv)
			rec := make([]float32, lg.Shape().RecordLen())
			for i := range n {
				if err := lg.FlatRecord(i, rec); err != nil {
					return err
				}
				sw.raw(rec)
			}
			continue
		}
		sw.byte(layerAttn)
		if err := sw.cacheRows(s.caches[l]); err != nil {
			return err
		}
	}
	s.writeTaps(sw)
	return sw.err
}

// sequence writes m's fingerprint, the tokens and the next-token logits.
func (sw *sessionWriter) sequence(m *Model, tokens []int32, last []float32) {
	fp := m.fingerprint()
	sw.bytes(fp[:])
	sw.u32(uint32(len(tokens)))
	for _, t := range tokens {
		sw.u32(uint32(t))
	}
	if last == nil {
		sw.u32(0)
	} else {
		sw.floats(last)
	}
}

// kdaState writes a KDA layer's conv window and recurrent state.
func (sw *sessionWriter) kdaState(b compute.Backend, st *kda.State) error {
	conv, state := make([]float32, st.Conv.Len()), make([]float32, st.S.Len())
	if err := b.Read(conv, st.Conv); err != nil {
		return err
	}
	if err := b.Read(state, st.S); err != nil {
		return err
	}
	sw.floats(conv)
	sw.floats(state)
	return nil
}

// cacheRows writes an attention cache's row count, row width and rows, a
// page at a time.
func (sw *sessionWriter) cacheRows(c *dsa.Cache) error {
	sw.u32(uint32(c.Len))
	sw.u32(uint32(c.RowLen()))
	rows := make([]float32, dsa.PageSize*c.RowLen())
	for lo := 0; lo < c.Len; lo += dsa.PageSize {
		hi := min(c.Len, lo+dsa.PageSize)
		part := rows[:(hi-lo)*c.RowLen()]
		if err := c.ReadRows(part, lo, hi); err != nil {
			return err
		}
		sw.raw(part)
	}
	return nil
}

// writeTaps writes the DSpark taps the session keeps at positions below
// its own (a rollback leaves the others unread): the row count, then, if
// any, the number of target layers, the row width, the first row's
// position and each layer's rows.
func (s *Session) writeTaps(sw *sessionWriter) {
	rows := min(s.tapsRows, s.pos-s.tapsPos)
	if len(s.taps) == 0 || rows <= 0 {
		sw.u32(0)
		return
	}
	d := s.m.Config.HiddenSize
	sw.u32(uint32(rows))
	sw.u32(uint32(len(s.taps)))
	sw.u32(uint32(d))
	sw.u32(uint32(s.tapsPos))
	for _, tp := range s.taps {
		sw.raw(tp[:rows*d])
	}
}

// sessionWriter writes little-endian values and keeps the body's CRC; the
// first error sticks.
type sessionWriter struct {
	w   *bufio.Writer
	crc hash.Hash32
	err error
	buf [4]byte
}

func (sw *sessionWriter) bytes(p []byte) {
	if sw.err != nil {
		return
	}
	sw.crc.Write(p)
	_, sw.err = sw.w.Write(p)
}

func (sw *sessionWriter) byte(v byte) { sw.bytes([]byte{v}) }

func (sw *sessionWriter) u32(v uint32) {
	binary.LittleEndian.PutUint32(sw.buf[:], v)
	sw.bytes(sw.buf[:])
}

// floats writes a length, then the values.
func (sw *sessionWriter) floats(v []float32) {
	sw.u32(uint32(len(v)))
	sw.raw(v)
}

// raw writes values without a length.
func (sw *sessionWriter) raw(v []float32) {
	var chunk [4096]byte
	for len(v) > 0 {
		n := min(len(v), len(chunk)/4)
		for i, f := range v[:n] {
			binary.LittleEndian.PutUint32(chunk[4*i:], math.Float32bits(f))
		}
		sw.bytes(chunk[:4*n])
		v = v[n:]
	}
}

// LoadSession reads a session written by Session.Save into a new session
// of this model, which continues exactly as the saved one would have. A
// file that is not a k3 session, has another format version, was saved
// from another model, or is truncated or corrupted fails with an error
// wrapping ErrSessionFile that names the problem; no session is returned
// then. The session's memory counts against the budget as a session's
// tokens would (ErrMemoryBudget).
func (m *Model) LoadSession(r io.Reader) (*Session, error) {
	if err := m.life.enter(); err != nil {
		return nil, err
	}
	defer m.life.exit()
	var s *Session
	err := loadFramed(r, sessionMagic, "a k3 session", 1, sessionVersion, func(sr *sessionReader, version uint16) error {
		var err error
		if s, err = m.NewSession(); err != nil {
			return err
		}
		return s.readBody(sr, version)
	})
	if err != nil {
		if s != nil {
			s.Close()
		}
		return nil, err
	}
	return s, nil
}

// loadFramed reads what saveFramed wrote, with body reading the body of a
// version from oldest to newest; the frame's failures wrap ErrSessionFile
// (body's own say what they are).
func loadFramed(r io.Reader, magic, what string, oldest, newest uint16, body func(*sessionReader, uint16) error) error {
	var head [10]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return fmt.Errorf("%w: %d-byte header: %v", ErrSessionFile, len(head), err)
	}
	if string(head[:8]) != magic {
		return fmt.Errorf("%w: not %s (it starts %q)", ErrSessionFile, what, head[:8])
	}
	version := binary.LittleEndian.Uint16(head[8:])
	if version < oldest || version > newest {
		return fmt.Errorf("%w: format version %d; this k3 reads versions %d to %d", ErrSessionFile, version, oldest, newest)
	}
	// A window bound keeps a forged frame header from asking for memory.
	zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(sessionWindow))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrSessionFile, err)
	}
	defer zr.Close()
	sr := &sessionReader{r: bufio.NewReaderSize(zr, 1<<16), crc: crc32.New(castagnoli)}
	if err := body(sr, version); err != nil {
		return err
	}
	want := sr.crc.Sum32()
	var sum [4]byte
	if _, err := io.ReadFull(sr.r, sum[:]); err != nil {
		return fmt.Errorf("%w: truncated before the checksum: %v", ErrSessionFile, streamErr(err))
	}
	if got := binary.LittleEndian.Uint32(sum[:]); got != want {
		return fmt.Errorf("%w: checksum %08x, the contents give %08x (corrupted)", ErrSessionFile, got, want)
	}
	if _, err := sr.r.ReadByte(); err != io.EOF {
		if err == nil {
			return fmt.Errorf("%w: data after the checksum", ErrSessionFile)
		}
		return fmt.Errorf("%w: after the checksum: %v", ErrSessionFile, streamErr(err))
	}
	return nil
}

// streamErr names a read failure: the end of the data, or what the
// decompressor said.
func streamErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("the data ends there")
	}
	return err
}

func (s *Session) readBody(sr *sessionReader, version uint16) error {
	m := s.m
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrSessionFile}, args...)...)
	}
	tokens, last, err := sr.sequence(m, s.limit)
	if err != nil {
		return err
	}
	n := uint32(len(tokens))
	// The state grows as the tokens' would: reserve it first.
	grow := s.growth(int(n))
	if err := m.mem.take(grow, "a loaded session"); err != nil {
		return err
	}
	defer func() {
		m.mem.add(-grow)
		s.charge()
	}()
	b := m.b
	for l, ly := range m.layers {
		kind, err := sr.byte(fmt.Sprintf("layer %d's kind", l))
		if err != nil {
			return err
		}
		if ly.kind == config.KDA {
			if kind != layerKDA {
				return bad("layer %d is a KDA layer; the file holds kind %d there", l, kind)
			}
			conv, state, err := sr.kdaState(b, s.kdaSt[l], l)
			if err != nil {
				return err
			}
			if err := s.readLog(sr, l, int(n), state, conv); err != nil {
				return err
			}
			continue
		}
		if kind != layerAttn {
			return bad("layer %d is an attention layer; the file holds kind %d there", l, kind)
		}
		if err := sr.cacheRows(s.caches[l], int(n), l); err != nil {
			return err
		}
	}
	if version >= 2 {
		if err := s.readTaps(sr, int(n)); err != nil {
			return err
		}
	}
	s.pos, s.tokens, s.last = int(n), tokens, last
	if iv := m.snapInterval; iv > 0 {
		s.nextSnap = (s.pos/iv + 1) * iv
	}
	return nil
}

// readTaps reads the DSpark taps section of a session of n tokens. A
// Group's rank, which has the draft module's config but leaves the module
// alone, reads the rows and drops them.
func (s *Session) readTaps(sr *sessionReader, n int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrSessionFile}, args...)...)
	}
	rows, err := sr.u32("the DSpark row count")
	if err != nil || rows == 0 {
		return err
	}
	var head [3]uint32
	for i, what := range []string{"the DSpark target layer count", "the DSpark row width", "the DSpark rows' position"} {
		if head[i], err = sr.u32(what); err != nil {
			return err
		}
	}
	layers, width, at := head[0], head[1], head[2]
	d, want := s.m.Config.HiddenSize, 0
	if c := s.m.Config.Draft; c != nil {
		want = len(c.TargetLayers) // a Group's rank has the module's config, not the module
	}
	switch {
	case rows > ExactTokens:
		return bad("%d DSpark rows; a session keeps at most %d", rows, ExactTokens)
	case int(width) != d:
		return bad("DSpark rows of %d floats; the model's hidden size is %d", width, d)
	case uint64(at)+uint64(rows) > uint64(n):
		return bad("DSpark rows at positions %d to %d of a session of %d tokens", at, uint64(at)+uint64(rows)-1, n)
	case want == 0:
		return bad("DSpark rows, but the model has no DSpark draft module")
	case int(layers) != want:
		return bad("DSpark rows of %d target layers; the model's draft module reads %d", layers, want)
	}
	taps := make([][]float32, layers)
	for i := range taps {
		taps[i] = make([]float32, int(rows)*d, ExactTokens*d) // keepTaps reslices up to ExactTokens rows
		if err := sr.raw(taps[i], fmt.Sprintf("the DSpark rows of target layer %d", i)); err != nil {
			return err
		}
	}
	if s.m.draft != nil {
		s.taps, s.tapsPos, s.tapsRows = taps, int(at), int(rows)
	}
	return nil
}

// readLog reads layer l's replay log section. A saved log is rebuilt
// record by record; a session saved without logs, or a model that keeps
// none, starts its log at the loaded state (rollback then reaches back to
// the load).
// sequence reads what sessionWriter.sequence wrote, checked against m
// (its fingerprint, vocabulary) and a context of limit tokens.
func (sr *sessionReader) sequence(m *Model, limit int) ([]int32, []float32, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrSessionFile}, args...)...)
	}
	var fp [32]byte
	if err := sr.full(fp[:], "the model fingerprint"); err != nil {
		return nil, nil, err
	}
	if want := m.fingerprint(); fp != want {
		return nil, nil, bad("saved from another model (fingerprint %x, this model's %x)", fp[:8], want[:8])
	}
	n, err := sr.u32("the token count")
	if err != nil {
		return nil, nil, err
	}
	if int(n) > limit {
		return nil, nil, bad("%d tokens; the model's context holds %d", n, limit)
	}
	tokens := make([]int32, n)
	for i := range tokens {
		v, err := sr.u32("the tokens")
		if err != nil {
			return nil, nil, err
		}
		if int(v) >= m.Config.VocabSize {
			return nil, nil, bad("token %d is %d, outside the vocabulary of %d", i, v, m.Config.VocabSize)
		}
		tokens[i] = int32(v)
	}
	want := 0
	if n > 0 {
		want = m.Config.VocabSize
	}
	last, err := sr.floats(want, "the next-token logits")
	if err != nil {
		return nil, nil, err
	}
	if n == 0 {
		last = nil
	}
	return tokens, last, nil
}

// kdaState reads what sessionWriter.kdaState wrote into st, layer l's
// state, and returns the floats read.
func (sr *sessionReader) kdaState(b compute.Backend, st *kda.State, l int) (conv, state []float32, err error) {
	if conv, err = sr.floats(st.Conv.Len(), fmt.Sprintf("layer %d's conv window", l)); err != nil {
		return nil, nil, err
	}
	if state, err = sr.floats(st.S.Len(), fmt.Sprintf("layer %d's recurrent state", l)); err != nil {
		return nil, nil, err
	}
	if err := b.Write(st.Conv, conv); err != nil {
		return nil, nil, err
	}
	return conv, state, b.Write(st.S, state)
}

// cacheRows reads what sessionWriter.cacheRows wrote into c, layer l's
// empty cache, which must receive n rows of its width.
func (sr *sessionReader) cacheRows(c *dsa.Cache, n, l int) error {
	rows, err := sr.u32(fmt.Sprintf("layer %d's cache length", l))
	if err != nil {
		return err
	}
	width, err := sr.u32(fmt.Sprintf("layer %d's row width", l))
	if err != nil {
		return err
	}
	if int(rows) != n || int(width) != c.RowLen() {
		return fmt.Errorf("%w: layer %d's cache holds %d rows of %d floats; want %d rows of %d", ErrSessionFile, l, rows, width, n, c.RowLen())
	}
	buf := make([]float32, dsa.PageSize*c.RowLen())
	for lo := 0; lo < n; lo += dsa.PageSize {
		k := min(n-lo, dsa.PageSize)
		part := buf[:k*c.RowLen()]
		if err := sr.raw(part, fmt.Sprintf("layer %d's cache rows", l)); err != nil {
			return err
		}
		if err := c.AppendRows(part, k); err != nil {
			return err
		}
	}
	return nil
}

func (s *Session) readLog(sr *sessionReader, l, pos int, state, conv []float32) error {
	has, err := sr.byte(fmt.Sprintf("layer %d's log flag", l))
	if err != nil {
		return err
	}
	var lg *replay.Log
	if l < len(s.logs) {
		lg = s.logs[l]
	}
	if has == 0 {
		if lg != nil {
			return lg.SetCheckpoint(pos, state, conv)
		}
		return nil
	}
	if has != 1 {
		return fmt.Errorf("%w: layer %d's log flag is %d", ErrSessionFile, l, has)
	}
	ly := s.m.layers[l]
	shape := replayShape(ly.kdaCfg)
	base, err := sr.u32(fmt.Sprintf("layer %d's log checkpoint position", l))
	if err != nil {
		return err
	}
	n, err := sr.u32(fmt.Sprintf("layer %d's log record count", l))
	if err != nil {
		return err
	}
	if int(base)+int(n) != pos {
		return fmt.Errorf("%w: layer %d's log covers %d..%d; the session holds %d tokens", ErrSessionFile, l, base, int(base)+int(n), pos)
	}
	ckState, err := sr.floats(shape.StateLen(), fmt.Sprintf("layer %d's log checkpoint state", l))
	if err != nil {
		return err
	}
	ckConv, err := sr.floats(shape.ConvLen(), fmt.Sprintf("layer %d's log checkpoint conv window", l))
	if err != nil {
		return err
	}
	if n > uint32(s.m.rollback+maxSavedRecords) {
		return fmt.Errorf("%w: layer %d's log holds %d records", ErrSessionFile, l, n)
	}
	if lg != nil {
		if err := lg.SetCheckpoint(int(base), ckState, ckConv); err != nil {
			return err
		}
	}
	rec := make([]float32, shape.RecordLen())
	for range n {
		if err := sr.raw(rec, fmt.Sprintf("layer %d's log records", l)); err != nil {
			return err
		}
		if lg != nil {
			if err := lg.AppendFlat(rec); err != nil {
				return err
			}
			if err := lg.Commit(1); err != nil {
				return err
			}
		}
	}
	if lg != nil && lg.Pos() != pos {
		return fmt.Errorf("%w: layer %d's log ends at %d, not %d", ErrSessionFile, l, lg.Pos(), pos)
	}
	return nil
}

// maxSavedRecords bounds a saved log's records beyond the rollback depth:
// a log holds fewer committed records than its interval.
const maxSavedRecords = 64

// sessionReader reads what sessionWriter wrote, keeping the CRC and naming
// what it was reading when the data ran out.
type sessionReader struct {
	r   *bufio.Reader
	crc hash.Hash32
	buf [4096]byte
}

func (sr *sessionReader) full(p []byte, what string) error {
	if _, err := io.ReadFull(sr.r, p); err != nil {
		return fmt.Errorf("%w: truncated in %s: %v", ErrSessionFile, what, streamErr(err))
	}
	sr.crc.Write(p)
	return nil
}

func (sr *sessionReader) byte(what string) (byte, error) {
	var b [1]byte
	err := sr.full(b[:], what)
	return b[0], err
}

func (sr *sessionReader) u32(what string) (uint32, error) {
	var b [4]byte
	if err := sr.full(b[:], what); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

// floats reads a length, which must be want, then the values.
func (sr *sessionReader) floats(want int, what string) ([]float32, error) {
	n, err := sr.u32(what)
	if err != nil {
		return nil, err
	}
	if int(n) != want {
		return nil, fmt.Errorf("%w: %s: %d floats, want %d", ErrSessionFile, what, n, want)
	}
	v := make([]float32, n)
	return v, sr.raw(v, what)
}

// raw fills v without a length.
func (sr *sessionReader) raw(v []float32, what string) error {
	for len(v) > 0 {
		k := min(len(v), len(sr.buf)/4)
		if err := sr.full(sr.buf[:4*k], what); err != nil {
			return err
		}
		for i := range v[:k] {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(sr.buf[4*i:]))
		}
		v = v[k:]
	}
	return nil
}
