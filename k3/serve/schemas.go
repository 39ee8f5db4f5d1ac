package serve

import (
	"container/list"
	"sync"

	"k3/k3"
)

// schemaCache keeps compiled JSON Schemas by their documents' bytes, so
// that requests repeating a schema (an agent's tools, sent with every
// turn; a structured output's format) compile it once and share its
// automata, whose masks the model's vocabulary caches by automaton
// (jsonschema.Vocab): a patterned string's first mask in a state costs a
// walk of the vocabulary, later ones a copy. A k3.JSONSchema is
// immutable, so any number of requests may hold one.
type schemaCache struct {
	mu    sync.Mutex
	max   int
	lru   list.List // of *schemaEntry, the most recently used first
	byDoc map[string]*list.Element
}

type schemaEntry struct {
	doc string
	s   *k3.JSONSchema
}

// schemaCacheEntries bounds the schemas kept, and schemaCacheDocMax the
// documents kept: larger ones compile anew each time, so that a few
// huge schemas cannot hold memory.
const (
	schemaCacheEntries = 128
	schemaCacheDocMax  = 64 << 10
)

func newSchemaCache(entries int) *schemaCache {
	return &schemaCache{max: entries, byDoc: map[string]*list.Element{}}
}

// compile returns doc's compiled schema: a kept one, or one compiled now
// (and kept when it compiled and is small enough). Errors are not kept.
func (c *schemaCache) compile(doc []byte) (*k3.JSONSchema, error) {
	if len(doc) > schemaCacheDocMax || c.max <= 0 {
		return k3.CompileJSONSchema(doc)
	}
	c.mu.Lock()
	if e, ok := c.byDoc[string(doc)]; ok {
		c.lru.MoveToFront(e)
		s := e.Value.(*schemaEntry).s
		c.mu.Unlock()
		return s, nil
	}
	c.mu.Unlock()
	s, err := k3.CompileJSONSchema(doc)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byDoc[string(doc)]; ok { // compiled meanwhile by another request
		c.lru.MoveToFront(e)
		return e.Value.(*schemaEntry).s, nil
	}
	c.byDoc[string(doc)] = c.lru.PushFront(&schemaEntry{doc: string(doc), s: s})
	for c.lru.Len() > c.max {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.byDoc, old.Value.(*schemaEntry).doc)
	}
	return s, nil
}
