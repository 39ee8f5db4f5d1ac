package serve

import (
	"container/list"
	"encoding/json"
	"sync"
)

// responseStore keeps finished responses for previous_response_id and
// GET /v1/responses/{id}, least recently used dropped past a byte budget.
// It lives in memory only: a restart forgets every response.
type responseStore struct {
	mu    sync.Mutex
	max   int64 // bytes; 0 keeps none
	used  int64
	order *list.List // of *storedResponse, most recently used first
	byID  map[string]*list.Element
}

// storedResponse is one response: its object as GET answers it and the
// chat messages a response that follows it continues (the conversation
// up to and including its answer; no instructions).
type storedResponse struct {
	id   string
	obj  json.RawMessage
	msgs []chatMessage
	size int64
}

func newResponseStore(max int64) *responseStore {
	return &responseStore{max: max, order: list.New(), byID: map[string]*list.Element{}}
}

// enabled reports whether responses are kept at all.
func (st *responseStore) enabled() bool { return st.max > 0 }

// put keeps a response, dropping the least recently used ones until the
// store is within its budget; a response larger than the whole budget is
// not kept. It reports whether the response was kept.
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
	r := &storedResponse{id: id, obj: raw, msgs: msgs, size: int64(len(raw) + len(m))}
	st.mu.Lock()
	defer st.mu.Unlock()
	if r.size > st.max {
		return false
	}
	if e, ok := st.byID[id]; ok {
		st.remove(e)
	}
	for st.used+r.size > st.max {
		st.remove(st.order.Back())
	}
	st.byID[id] = st.order.PushFront(r)
	st.used += r.size
	return true
}

func (st *responseStore) remove(e *list.Element) {
	r := st.order.Remove(e).(*storedResponse)
	delete(st.byID, r.id)
	st.used -= r.size
}

// get returns a kept response and marks it used.
func (st *responseStore) get(id string) (*storedResponse, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	e, ok := st.byID[id]
	if !ok {
		return nil, false
	}
	st.order.MoveToFront(e)
	return e.Value.(*storedResponse), true
}

// drop forgets a response and reports whether it was kept.
func (st *responseStore) drop(id string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	e, ok := st.byID[id]
	if ok {
		st.remove(e)
	}
	return ok
}

// stats returns the responses kept and their bytes.
func (st *responseStore) stats() (n int, bytes int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.order.Len(), st.used
}
