package k3

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// savedSession prefills and decodes a session, then saves it.
func savedSession(t *testing.T, m *Model, seed uint64) (*Session, []byte) {
	t.Helper()
	s, err := m.NewSession()
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(seed, 1))
	prompt := make([]int32, 70+rng.IntN(90)) // past a page, a partial last one
	for i := range prompt {
		prompt[i] = int32(rng.IntN(m.VocabSize()))
	}
	genIDs(t, s, prompt, WithMaxTokens(9), WithoutDefaultStops())
	var buf bytes.Buffer
	require.NoError(t, s.Save(&buf))
	return s, buf.Bytes()
}

// rewriteSession returns the session file data with its body rewritten by
// edit and its version set, its checksum made anew: a file as another
// writer (another format version, or a forger) would write it.
func rewriteSession(t *testing.T, data []byte, version uint16, edit func(body []byte) []byte) []byte {
	t.Helper()
	zr, err := zstd.NewReader(bytes.NewReader(data[10:]))
	require.NoError(t, err)
	defer zr.Close()
	plain, err := io.ReadAll(zr)
	require.NoError(t, err)
	body := edit(bytes.Clone(plain[:len(plain)-4]))
	out := bytes.NewBuffer(append([]byte(sessionMagic), byte(version), byte(version>>8)))
	zw, err := zstd.NewWriter(out, zstd.WithWindowSize(sessionWindow))
	require.NoError(t, err)
	_, err = zw.Write(binary.LittleEndian.AppendUint32(body, crc32.Checksum(body, castagnoli)))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return out.Bytes()
}

// forgeTaps returns the session file data with its DSpark section (the
// last cut bytes of the body) replaced by one of the given fields and
// floats.
func forgeTaps(t *testing.T, data []byte, cut, rows, count, width, at, floats int) []byte {
	return rewriteSession(t, data, sessionVersion, func(body []byte) []byte {
		body = body[:len(body)-cut]
		for _, v := range []int{rows, count, width, at} {
			body = binary.LittleEndian.AppendUint32(body, uint32(v))
		}
		return append(body, make([]byte, 4*floats)...)
	})
}

// TestSaveLoadContinues: a loaded session holds the saved one's tokens,
// logits and KDA states, and continues bitwise as the original does:
// sampled generation, and (with replay logs) a rollback followed by
// generation, on every testdata model and the embedded one.
func TestSaveLoadContinues(t *testing.T) {
	dirs := testModels(t)
	type named struct {
		name string
		open func() (*Model, error)
	}
	var models []named
	for _, d := range dirs {
		dir := filepath.Dir(d)
		for _, rb := range []int{0, 4} {
			models = append(models, named{filepath.Base(dir) + map[int]string{0: "", 4: "+rollback"}[rb], func() (*Model, error) {
				return Load(context.Background(), dir, WithRollback(rb))
			}})
		}
	}
	models = append(models, named{"embedded+rollback", func() (*Model, error) { return LoadTiny(context.Background(), WithRollback(6)) }})
	for i, tc := range models {
		t.Run(tc.name, func(t *testing.T) {
			m, err := tc.open()
			require.NoError(t, err)
			defer m.Close()
			orig, data := savedSession(t, m, uint64(i))
			defer orig.Close()
			got, err := m.LoadSession(bytes.NewReader(data))
			require.NoError(t, err)
			defer got.Close()
			require.Equal(t, orig.Tokens(), got.Tokens())
			require.Equal(t, orig.Logits(), got.Logits())
			require.Equal(t, kdaStates(t, orig), kdaStates(t, got))
			require.Equal(t, orig.StateBytes(), got.StateBytes())

			opts := []GenerateOption{WithMaxTokens(12), WithoutDefaultStops(), WithTemperature(0.8), WithSeed(5)}
			if m.rollback > 0 {
				back := orig.Len() - m.rollback
				require.NoError(t, orig.Truncate(context.Background(), back))
				require.NoError(t, got.Truncate(context.Background(), back))
				require.Equal(t, kdaStates(t, orig), kdaStates(t, got), "after rolling back")
			}
			a, _ := genIDs(t, orig, []int32{3}, opts...)
			b, _ := genIDs(t, got, []int32{3}, opts...)
			assert.Equal(t, a, b)
			assert.Equal(t, orig.Logits(), got.Logits())
			assert.Equal(t, kdaStates(t, orig), kdaStates(t, got))
		})
	}
}

// TestLoadSessionRejects: a corrupted, truncated, foreign or mislabelled
// file is an error wrapping ErrSessionFile, never a session.
func TestLoadSessionRejects(t *testing.T) {
	m := load(t, WithRollback(4))
	s, data := savedSession(t, m, 1)
	defer s.Close()
	held := func() int64 { u := m.MemoryUsage(); return u.Used - u.FreePages - u.FreeStates }
	before := held()

	try := func(what string, b []byte) error {
		t.Helper()
		got, err := m.LoadSession(bytes.NewReader(b))
		if got != nil {
			got.Close()
		}
		require.Error(t, err, what)
		require.ErrorIs(t, err, ErrSessionFile, what)
		require.Nil(t, got, what)
		return err
	}
	// Every byte flipped somewhere in the file: a sample of positions,
	// the header's included.
	rng := rand.New(rand.NewPCG(2, 3))
	for range 60 {
		i := rng.IntN(len(data))
		b := bytes.Clone(data)
		b[i] ^= byte(1 + rng.IntN(255))
		try("a flipped byte", b)
	}
	for _, n := range []int{0, 5, 10, 11, 40, len(data) / 3, len(data) / 2, len(data) - 5, len(data) - 1} {
		try("truncated", data[:n])
	}
	assert.Contains(t, try("magic", append([]byte("GGUF\x00\x00\x00\x00"), data[8:]...)).Error(), "not a k3 session")
	v := bytes.Clone(data)
	v[8] = 9
	assert.Contains(t, try("version", v).Error(), "version 9")
	assert.Contains(t, try("trailing", append(bytes.Clone(data), data[10:]...)).Error(), "after the checksum")

	// The DSpark rows' section, forged (this model has no draft module, so
	// the file's section is a zero count): each field out of range.
	n, d := s.Len(), m.Config.HiddenSize
	taps := func(rows, count, width, at, floats int) []byte {
		return forgeTaps(t, data, 4, rows, count, width, at, floats)
	}
	for _, c := range []struct {
		what string
		file []byte
		want string
	}{
		{"too many rows", taps(ExactTokens+1, 1, d, 0, (ExactTokens+1)*d), "at most"},
		{"another width", taps(2, 1, d+1, 0, 2*(d+1)), "hidden size"},
		{"past the tokens", taps(2, 1, d, n-1, 2*d), "of a session of"},
		{"rows for a module the model lacks", taps(2, 1, d, 0, 2*d), "no DSpark draft module"},
		{"a version to come", rewriteSession(t, data, sessionVersion+1, func(b []byte) []byte { return b }), fmt.Sprint("version ", sessionVersion+1)},
	} {
		assert.Contains(t, try(c.what, c.file).Error(), c.want, c.what)
	}

	other, err := LoadTiny(context.Background())
	require.NoError(t, err)
	defer other.Close()
	os2, odata := savedSession(t, other, 1)
	defer os2.Close()
	assert.Contains(t, try("foreign", odata).Error(), "another model")

	assert.Equal(t, before, held(), "memory back after the failures")
	ok, err := m.LoadSession(bytes.NewReader(data))
	require.NoError(t, err, "the file itself still loads")
	require.NoError(t, ok.Close())
}

// TestLoadSessionBudget: a loaded session counts against the memory
// budget; past it, loading fails with ErrMemoryBudget and takes nothing.
func TestLoadSessionBudget(t *testing.T) {
	m := load(t)
	s, data := savedSession(t, m, 4)
	need := s.StateBytes()
	require.NoError(t, s.Close())
	small := load(t, WithMemoryBudget(need/2+need/4))
	_, err := small.LoadSession(bytes.NewReader(data))
	require.ErrorIs(t, err, ErrMemoryBudget)
	u := small.MemoryUsage()
	assert.Zero(t, u.Used-u.FreePages-u.FreeStates)
}

// checkLoadFailed fails t unless a failed load returned no session
// (none) and an error wrapping ErrSessionFile (or ErrMemoryBudget).
func checkLoadFailed(t *testing.T, none bool, err error) {
	t.Helper()
	if !none {
		t.Fatal("a session with an error")
	}
	if !errors.Is(err, ErrSessionFile) && !errors.Is(err, ErrMemoryBudget) {
		t.Fatalf("error not wrapping ErrSessionFile: %v", err)
	}
}

// FuzzLoadSession: no input crashes LoadSession; what it does not load is
// an ErrSessionFile, and what it loads is a usable session.
func FuzzLoadSession(f *testing.F) {
	// The embedded model has a DSpark module, so a session that has run
	// a pass saves its rows: the file has every section.
	m, err := LoadTiny(context.Background(), WithRollback(4))
	if err != nil {
		f.Fatal(err)
	}
	defer m.Close()
	s, err := m.NewSession()
	if err != nil {
		f.Fatal(err)
	}
	if _, err := s.Forward(context.Background(), []int32{1, 2, 3}); err != nil {
		f.Fatal(err)
	}
	var buf bytes.Buffer
	if err := s.Save(&buf); err != nil {
		f.Fatal(err)
	}
	if s.tapsRows == 0 {
		f.Fatal("no DSpark rows saved")
	}
	f.Add(buf.Bytes())
	f.Add(buf.Bytes()[:len(buf.Bytes())/2])
	f.Add([]byte(sessionMagic + "\x01\x00"))
	f.Add([]byte(sessionMagic + "\x02\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := m.LoadSession(bytes.NewReader(b))
		if err != nil {
			checkLoadFailed(t, got == nil, err)
			return
		}
		defer got.Close()
		if _, err := got.Forward(context.Background(), []int32{1}); err != nil {
			t.Fatalf("a loaded session cannot run: %v", err)
		}
	})
}
