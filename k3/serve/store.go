package serve

import (
	"bytes"
	"container/list"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
)

// responseStore keeps finished responses for previous_response_id and
// GET /v1/responses/{id}: in memory, least recently used dropped past a
// byte budget, and with a directory also as files, which outlive the
// process and are shared by the servers that mount the directory.
type responseStore struct {
	mu    sync.Mutex
	max   int64 // bytes in memory; 0 keeps none there
	used  int64
	order *list.List // of *storedResponse, most recently used first
	byID  map[string]*list.Element

	dir  string        // "" keeps no files
	ttl  time.Duration // a file older than this is gone
	logf func(format string, args ...any)
	stop chan struct{} // ends the sweeps
	done chan struct{}
}

// storedResponse is one response: its object as GET answers it and the
// chat messages a response that follows it continues (the conversation
// up to and including its answer; no instructions).
type storedResponse struct {
	id    string
	obj   json.RawMessage
	msgs  []chatMessage
	size  int64
	filed bool // its file was written (or it was read from one)
	// msgsJSON is msgs encoded, from put until its file is written, so
	// that the messages are encoded once.
	msgsJSON json.RawMessage
}

// storedFile is a response's file: zstd-compressed JSON.
type storedFile struct {
	Version  int             `json:"version"`
	Object   json.RawMessage `json:"object"`
	Messages []chatMessage   `json:"messages"`
}

const (
	storedVersion = 1
	storedExt     = ".json.zst"
	// maxStoredFile bounds a file's decompressed bytes: a response is
	// its request (at most the server's body limit) and its answer.
	maxStoredFile = 256 << 20
	sweepEvery    = time.Hour
)

// newResponseStore keeps up to max bytes of responses in memory and,
// with dir, every response as a file until it is ttl old. It removes the
// files past ttl now and every hour until close.
func newResponseStore(max int64, dir string, ttl time.Duration, logf func(string, ...any)) (*responseStore, error) {
	st := &responseStore{max: max, order: list.New(), byID: map[string]*list.Element{}, dir: dir, ttl: ttl, logf: logf}
	if dir == "" {
		return st, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("serve: response directory: %w", err)
	}
	st.sweep()
	st.stop, st.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(st.done)
		t := time.NewTicker(sweepEvery)
		defer t.Stop()
		for {
			select {
			case <-st.stop:
				return
			case <-t.C:
				st.sweep()
			}
		}
	}()
	return st, nil
}

// close ends the sweeps.
func (st *responseStore) close() {
	if st.stop != nil {
		close(st.stop)
		<-st.done
		st.stop = nil
	}
}

// enabled reports whether responses are kept at all.
func (st *responseStore) enabled() bool { return st.max > 0 || st.dir != "" }

// validResponseID reports whether id has the form newID gives responses
// ("resp_" and 24 hex digits): only such ids are looked up on disk, so a
// request cannot name any other path.
func validResponseID(id string) bool {
	h, ok := strings.CutPrefix(id, "resp_")
	if !ok || len(h) != 24 {
		return false
	}
	for _, c := range h {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// put keeps a response: in memory, dropping the least recently used
// ones until within the budget (one larger than the whole budget is not
// kept there), and as a file. It reports whether the response was kept.
func (st *responseStore) put(id string, obj map[string]any, msgs []chatMessage) bool {
	if !st.enabled() {
		return false
	}
	raw, err := json.Marshal(obj)
	if err != nil {
		return false
	}
	m, err := json.Marshal(msgs)
	if err != nil {
		return false
	}
	r := &storedResponse{id: id, obj: raw, msgs: msgs, size: int64(len(raw) + len(m)), msgsJSON: m}
	if st.dir != "" && validResponseID(id) {
		if err := st.write(r); err != nil {
			st.logf("serve: keeping response %s: %v", id, err)
		} else {
			r.filed = true
		}
	}
	r.msgsJSON = nil
	return st.hold(r) || r.filed
}

// hold puts r in memory, if it fits the budget.
func (st *responseStore) hold(r *storedResponse) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if r.size > st.max {
		return false
	}
	if e, ok := st.byID[r.id]; ok {
		st.remove(e)
	}
	for st.used+r.size > st.max {
		st.remove(st.order.Back())
	}
	st.byID[r.id] = st.order.PushFront(r)
	st.used += r.size
	return true
}

func (st *responseStore) remove(e *list.Element) {
	r := st.order.Remove(e).(*storedResponse)
	delete(st.byID, r.id)
	st.used -= r.size
}

// get returns a kept response and marks it used; one in the directory
// but not in memory is read from its file. With a directory the file is
// what counts: a response whose file another server deleted, or that
// passed the TTL, is gone from memory too (one whose file could not be
// written is kept in memory alone).
func (st *responseStore) get(id string) (*storedResponse, bool) {
	st.mu.Lock()
	e, ok := st.byID[id]
	if ok {
		st.order.MoveToFront(e)
	}
	st.mu.Unlock()
	if ok && !e.Value.(*storedResponse).filed {
		return e.Value.(*storedResponse), true
	}
	if st.dir != "" && validResponseID(id) {
		info, err := os.Stat(st.path(id))
		if err == nil && st.expired(info) {
			os.Remove(st.path(id))
			err = fs.ErrNotExist
		}
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				st.logf("serve: kept response %s: %v", id, err)
			}
			st.forget(id)
			return nil, false
		}
	}
	if ok {
		return e.Value.(*storedResponse), true
	}
	if st.dir == "" || !validResponseID(id) {
		return nil, false
	}
	r, err := st.read(id)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			st.logf("serve: reading kept response %s: %v", id, err)
		}
		return nil, false
	}
	st.hold(r)
	return r, true
}

// forget drops a response from memory and reports whether it was there.
func (st *responseStore) forget(id string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	e, ok := st.byID[id]
	if ok {
		st.remove(e)
	}
	return ok
}

// drop forgets a response, its file too, and reports whether it was kept.
func (st *responseStore) drop(id string) bool {
	ok := st.forget(id)
	if st.dir != "" && validResponseID(id) {
		err := os.Remove(st.path(id))
		ok = ok || err == nil
	}
	return ok
}

// stats returns the responses kept in memory and their bytes.
func (st *responseStore) stats() (n int, bytes int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.order.Len(), st.used
}

func (st *responseStore) path(id string) string { return filepath.Join(st.dir, id+storedExt) }

// write stores r's file under a temporary name and renames it, so that a
// reader sees the whole file or none.
func (st *responseStore) write(r *storedResponse) error {
	f, err := os.CreateTemp(st.dir, ".tmp-"+r.id+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after a rename, nothing
	err = encodeStored(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(f.Name(), st.path(r.id))
}

func encodeStored(w io.Writer, r *storedResponse) error {
	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return err
	}
	var f any = storedFile{Version: storedVersion, Object: r.obj, Messages: r.msgs}
	if r.msgsJSON != nil {
		// The same bytes: the encoder writes a raw message compacted and
		// HTML-escaped, as json.Marshal wrote it.
		f = struct {
			Version  int             `json:"version"`
			Object   json.RawMessage `json:"object"`
			Messages json.RawMessage `json:"messages"`
		}{storedVersion, r.obj, r.msgsJSON}
	}
	if err := json.NewEncoder(zw).Encode(f); err != nil {
		zw.Close()
		return err
	}
	return zw.Close()
}

// read loads id's file.
func (st *responseStore) read(id string) (*storedResponse, error) {
	data, err := os.ReadFile(st.path(id))
	if err != nil {
		return nil, err
	}
	return decodeStored(id, data)
}

// decodeStored reads a response's file, which must hold response id.
func decodeStored(id string, data []byte) (*storedResponse, error) {
	zr, err := zstd.NewReader(bytes.NewReader(data), zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxStoredFile))
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	plain, err := io.ReadAll(io.LimitReader(zr, maxStoredFile+1))
	if err != nil {
		return nil, fmt.Errorf("decompressing: %w", err)
	}
	if len(plain) > maxStoredFile {
		return nil, fmt.Errorf("more than %d bytes decompressed", maxStoredFile)
	}
	var f storedFile
	if err := json.Unmarshal(plain, &f); err != nil {
		return nil, fmt.Errorf("decoding: %w", err)
	}
	if f.Version != storedVersion {
		return nil, fmt.Errorf("version %d, want %d", f.Version, storedVersion)
	}
	var head struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(f.Object, &head); err != nil || head.ID != id {
		return nil, fmt.Errorf("the file holds response %q, not %q", head.ID, id)
	}
	m, err := json.Marshal(f.Messages)
	if err != nil {
		return nil, err
	}
	return &storedResponse{id: id, obj: f.Object, msgs: f.Messages, size: int64(len(f.Object) + len(m)), filed: true}, nil
}

func (st *responseStore) expired(info fs.FileInfo) bool {
	return st.ttl > 0 && time.Since(info.ModTime()) > st.ttl
}

// sweep removes the response files past the TTL (and temporary files
// of writes that never finished, once as old).
func (st *responseStore) sweep() {
	entries, err := os.ReadDir(st.dir)
	if err != nil {
		st.logf("serve: sweeping kept responses: %v", err)
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, storedExt) && !strings.HasPrefix(name, ".tmp-resp_") {
			continue
		}
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() && st.expired(info) {
			os.Remove(filepath.Join(st.dir, name))
		}
	}
}
