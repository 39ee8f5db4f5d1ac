package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"
)

// SessionHeader names the request header that keeps a conversation's
// state on the server between requests: a request carrying it continues
// the session of that id (its tokens are reused up to where the new
// prompt departs from them), and the session stays after the answer.
const SessionHeader = "K3-Session"

var sessionID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// sessionStore keeps the sessions of requests that named one: live in
// memory while in use or recently used, parked on disk (Session.Save)
// once idle when a directory is configured, dropped otherwise. Files are
// written and read outside the store's lock, so a large session's save
// or load holds up only the requests for that session.
type sessionStore struct {
	e    engine
	dir  string        // where idle sessions are parked ("" : dropped instead)
	idle time.Duration // how long a session stays live unused
	max  int           // live sessions at most; past it the oldest idle one leaves

	mu     sync.Mutex
	live   map[string]*keptSession
	moving map[string]chan struct{} // sessions being parked or loaded: closed when done
	parked int                      // sessions parked this run (a counter for /metrics)
	closed bool                     // close has run: sessions given back are parked at once
	writes sync.WaitGroup           // parking writes in flight
	stop   chan struct{}
	done   chan struct{}

	// starved reports that requests wait for memory while nothing runs
	// (the Batcher's gauges); idle sessions then leave before their time.
	starved func() bool

	beforeSave func(id string) // tests: called before a parking write
}

type keptSession struct {
	s    seq
	busy bool
	used time.Time
}

var errStoreClosed = &apiError{status: 503, typ: "server_error", msg: "the server is shutting down"}

var errSessionBusy = &apiError{status: 409, typ: "invalid_request_error", param: SessionHeader,
	msg: "the session is answering another request; send one request per session at a time"}

func newSessionStore(e engine, dir string, idle time.Duration, max int, starved func() bool) (*sessionStore, error) {
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("serve: session directory: %w", err)
		}
	}
	st := &sessionStore{e: e, dir: dir, idle: idle, max: max, live: map[string]*keptSession{},
		moving: map[string]chan struct{}{}, stop: make(chan struct{}), done: make(chan struct{}), starved: starved}
	go st.sweep()
	return st, nil
}

func (st *sessionStore) path(id string) string { return filepath.Join(st.dir, id+".k3session") }

// settledLocked waits (releasing the lock meanwhile) until id is neither
// being parked nor loaded.
func (st *sessionStore) settledLocked(id string) {
	for {
		ch, ok := st.moving[id]
		if !ok {
			return
		}
		st.mu.Unlock()
		<-ch
		st.mu.Lock()
	}
}

// take returns id's session for one request: live, loaded from where it
// was parked, or new.
func (st *sessionStore) take(id string) (seq, error) {
	if !sessionID.MatchString(id) {
		return nil, badParam(SessionHeader, "%s = %q, want 1 to 64 letters, digits, '-' or '_'", SessionHeader, id)
	}
	st.mu.Lock()
	st.settledLocked(id)
	if st.closed {
		st.mu.Unlock()
		return nil, errStoreClosed
	}
	if k, ok := st.live[id]; ok {
		defer st.mu.Unlock()
		if k.busy {
			return nil, errSessionBusy
		}
		k.busy = true
		return k.s, nil
	}
	ch := make(chan struct{})
	st.moving[id] = ch
	st.evictLocked()
	st.mu.Unlock()

	s, err := st.load(id)

	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.moving, id)
	close(ch)
	if err != nil {
		return nil, err
	}
	st.live[id] = &keptSession{s: s, busy: true}
	return s, nil
}

// load reads id's parked session, or starts a new one.
func (st *sessionStore) load(id string) (seq, error) {
	if st.dir != "" {
		f, err := os.Open(st.path(id))
		switch {
		case err == nil:
			s, err := st.e.loadSeq(f)
			f.Close()
			if err != nil {
				return nil, fmt.Errorf("serve: session %s: %w", id, err)
			}
			os.Remove(st.path(id))
			return s, nil
		case !errors.Is(err, os.ErrNotExist):
			return nil, err
		}
	}
	return st.e.newSeq()
}

// put gives id's session back after a request; a session left unusable
// (a failed pass) is dropped.
func (st *sessionStore) put(id string, s seq, usable bool) {
	st.mu.Lock()
	k, ok := st.live[id]
	switch {
	case !ok || k.s != s:
		// The store was closed while the request ran: nothing keeps it.
		st.mu.Unlock()
		s.Close()
	case !usable || st.closed && st.dir == "":
		// Unusable, or closed with nowhere to park it: dropped.
		delete(st.live, id)
		st.mu.Unlock()
		s.Close()
	case st.closed:
		// close has waited out the writes already: this one is written
		// now, before the request ends, as moving (a request for it
		// waits, then is refused).
		delete(st.live, id)
		ch := make(chan struct{})
		st.moving[id] = ch
		st.mu.Unlock()
		st.write(id, s, ch)
	default:
		k.busy, k.used = false, time.Now()
		st.mu.Unlock()
	}
}

// drop forgets id's session, live or parked.
func (st *sessionStore) drop(id string) (bool, error) {
	if !sessionID.MatchString(id) {
		return false, badParam("id", "session id %q, want 1 to 64 letters, digits, '-' or '_'", id)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.settledLocked(id)
	found := false
	if k, ok := st.live[id]; ok {
		if k.busy {
			return false, errSessionBusy
		}
		k.s.Close()
		delete(st.live, id)
		found = true
	}
	if st.dir != "" {
		if err := os.Remove(st.path(id)); err == nil {
			found = true
		}
	}
	return found, nil
}

// evictLocked makes room for one more live session: past max, the least
// recently used idle one is parked (or dropped).
func (st *sessionStore) evictLocked() {
	for len(st.live) >= st.max {
		if !st.parkOldestLocked() {
			return // all busy: the memory budget is the bound then
		}
	}
}

// parkOldestLocked parks the least recently used idle session, and
// reports whether there was one.
func (st *sessionStore) parkOldestLocked() bool {
	var oldest string
	for id, k := range st.live {
		if !k.busy && (oldest == "" || k.used.Before(st.live[oldest].used)) {
			oldest = id
		}
	}
	if oldest == "" {
		return false
	}
	st.parkLocked(oldest)
	return true
}

// parkLocked takes id's idle session out of the live ones and, when there
// is a directory, saves it in the background (a request for it waits for
// the file); without one it is dropped.
func (st *sessionStore) parkLocked(id string) {
	k := st.live[id]
	delete(st.live, id)
	if st.dir == "" {
		k.s.Close()
		return
	}
	ch := make(chan struct{})
	st.moving[id] = ch
	st.writes.Add(1)
	go func() {
		defer st.writes.Done()
		st.write(id, k.s, ch)
	}()
}

// write parks s, which is moving under ch: it saves and closes it, then
// settles it (ch closes).
func (st *sessionStore) write(id string, s seq, ch chan struct{}) {
	ok := st.save(id, s)
	s.Close()
	st.mu.Lock()
	defer st.mu.Unlock()
	if ok {
		st.parked++
	}
	delete(st.moving, id)
	close(ch)
}

// save writes s to id's file; a session that fails to save is dropped
// (the next request for it starts afresh).
func (st *sessionStore) save(id string, s seq) bool {
	if st.beforeSave != nil {
		st.beforeSave(id)
	}
	tmp := st.path(id) + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return false
	}
	err = s.Save(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, st.path(id)) // a crash mid-save leaves the old file
	}
	if err != nil {
		os.Remove(tmp)
		return false
	}
	return true
}

// starvedEvery is how often the store looks for requests starved of
// memory; it parks an idle session once it has seen them twice running,
// and none while a session is being parked or loaded.
const starvedEvery = 20 * time.Millisecond

// sweep parks sessions idle past st.idle, and the least recently used
// idle session whenever requests are starved of memory: the memory of
// idle sessions yields to requests, as the prefix cache's does (a kept
// session is a cache of its conversation, which its next request can
// rebuild).
func (st *sessionStore) sweep() {
	defer close(st.done)
	t := time.NewTicker(max(st.idle/4, 10*time.Millisecond))
	defer t.Stop()
	var starved <-chan time.Time
	if st.starved != nil {
		tick := time.NewTicker(starvedEvery)
		defer tick.Stop()
		starved = tick.C
	}
	seen := false
	for {
		select {
		case <-st.stop:
			return
		case <-starved:
			now := st.starved()
			if now && seen {
				st.mu.Lock()
				if len(st.moving) == 0 { // a parking write frees its session's memory when it ends
					st.parkOldestLocked()
				}
				st.mu.Unlock()
			}
			seen = now
		case now := <-t.C:
			st.mu.Lock()
			for id, k := range st.live {
				if !k.busy && now.Sub(k.used) >= st.idle {
					st.parkLocked(id)
				}
			}
			st.mu.Unlock()
		}
	}
}

// close parks every live session that no request holds (the server is
// stopping: with a directory, they resume after a restart) and waits for
// the writes; one still held is parked when its request gives it back.
func (st *sessionStore) close() {
	close(st.stop)
	<-st.done
	st.mu.Lock()
	st.closed = true
	for id, k := range st.live {
		if !k.busy {
			st.parkLocked(id)
		}
	}
	st.mu.Unlock()
	st.writes.Wait()
}

func (st *sessionStore) counts() (live, parked int) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.live), st.parked
}

// continueFrom cuts s back to where prompt departs from its tokens and
// returns the part of prompt still to feed.
func continueFrom(ctx context.Context, s seq, prompt []int32) ([]int32, error) {
	held := s.Tokens()
	k := 0
	for k < len(held) && k < len(prompt) && held[k] == prompt[k] {
		k++
	}
	if k < len(held) {
		if err := s.Truncate(ctx, k); err != nil {
			return nil, err
		}
	}
	return prompt[k:], nil
}

func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request) {
	found, err := s.store.drop(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if !found {
		writeError(w, &apiError{status: 404, typ: "invalid_request_error", param: "id", msg: fmt.Sprintf("no session %q", r.PathValue("id"))})
		return
	}
	writeJSON(w, 200, map[string]any{"id": r.PathValue("id"), "deleted": true})
}
