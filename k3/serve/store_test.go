package serve

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestResponseDir: with a directory, a kept response outlives its server
// and is read by another server on the same directory, which continues
// its chain; a deletion on one is seen by the other (even where the
// response was in memory); files past the TTL are gone.
func TestResponseDir(t *testing.T) {
	dir := t.TempDir()
	var logMu sync.Mutex
	var logs []string
	logf := func(format string, args ...any) {
		logMu.Lock()
		defer logMu.Unlock()
		logs = append(logs, format)
	}
	a, ha, _ := newTestServer(t, Config{Name: "tiny", ResponseDir: dir, Logf: logf})
	b, hb, _ := newTestServer(t, Config{Name: "tiny", ResponseDir: dir, ResponseStoreBytes: -1})
	code, r1 := post(t, ha.URL+"/v1/responses", map[string]any{"model": "tiny", "max_output_tokens": 6, "temperature": 0, "input": "func main() {"})
	require.Equal(t, 200, code, "%v", r1)
	id := r1["id"].(string)
	assert.FileExists(t, filepath.Join(dir, id+storedExt))
	code, got := respond(t, "GET", hb.URL+"/v1/responses/"+id, nil)
	require.Equal(t, 200, code, "%v", got)
	assert.Equal(t, r1, got, "the other server reads the file")

	var next responsesRequest
	next.PreviousResponseID, next.Input = &id, jsonString("again")
	ja, err := a.responsesJob(&next)
	require.NoError(t, err)
	jb, err := b.responsesJob(&next)
	require.NoError(t, err)
	assert.Equal(t, ja.prompts, jb.prompts, "both servers continue the chain alike")
	code, r2 := post(t, hb.URL+"/v1/responses", map[string]any{"model": "tiny", "max_output_tokens": 4, "previous_response_id": id, "input": "again"})
	require.Equal(t, 200, code, "%v", r2)
	code, got = respond(t, "GET", ha.URL+"/v1/responses/"+r2["id"].(string), nil)
	require.Equal(t, 200, code, "a response the other server kept")

	// B deletes the file; A, which holds the response in memory, no
	// longer finds it.
	code, _ = respond(t, "DELETE", hb.URL+"/v1/responses/"+id, nil)
	require.Equal(t, 200, code)
	assert.NoFileExists(t, filepath.Join(dir, id+storedExt))
	code, _ = respond(t, "GET", ha.URL+"/v1/responses/"+id, nil)
	assert.Equal(t, 404, code, "deleted by the other server, though in this one's memory")

	// A new server on the directory: r2 outlived A and B's memories.
	c, hc, _ := newTestServer(t, Config{Name: "tiny", ResponseDir: dir})
	code, got = respond(t, "GET", hc.URL+"/v1/responses/"+r2["id"].(string), nil)
	require.Equal(t, 200, code)
	assert.Equal(t, r2, got)

	// Past the TTL a file is gone: when looked up, and by the sweep.
	old := time.Now().Add(-2 * time.Hour)
	p2 := filepath.Join(dir, r2["id"].(string)+storedExt)
	require.NoError(t, os.Chtimes(p2, old, old))
	short, err := newResponseStore(1<<20, dir, time.Hour, logf)
	require.NoError(t, err)
	defer short.close()
	assert.NoFileExists(t, p2, "the sweep at start")
	_, ok := c.kept.get(r2["id"].(string))
	assert.False(t, ok, "in C's memory, but its file is gone")
	code, r3 := post(t, hc.URL+"/v1/responses", map[string]any{"model": "tiny", "max_output_tokens": 2, "input": "x"})
	require.Equal(t, 200, code)
	p3 := filepath.Join(dir, r3["id"].(string)+storedExt)
	require.NoError(t, os.Chtimes(p3, old, old))
	_, ok = short.get(r3["id"].(string))
	assert.False(t, ok, "past the TTL when looked up")
	assert.NoFileExists(t, p3)

	// A file that does not decode is no response, and is reported.
	bad := "resp_0123456789abcdef01234567"
	require.NoError(t, os.WriteFile(filepath.Join(dir, bad+storedExt), []byte("not zstd"), 0o644))
	code, _ = respond(t, "GET", ha.URL+"/v1/responses/"+bad, nil)
	assert.Equal(t, 404, code)
	logMu.Lock()
	assert.NotEmpty(t, logs)
	logMu.Unlock()
	// Ids of another form never reach the disk.
	for _, id := range []string{"..%2Fx", "resp_../../etc", "resp_0123456789ABCDEF01234567", "resp_0123"} {
		code, _ = respond(t, "GET", ha.URL+"/v1/responses/"+id, nil)
		assert.Equal(t, 404, code, id)
	}
}

// TestResponseDirUnwritable: a response whose file cannot be written is
// kept in memory alone, and found there.
func TestResponseDirUnwritable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "kept")
	var logs []string
	st, err := newResponseStore(1<<20, dir, time.Hour, func(f string, _ ...any) { logs = append(logs, f) })
	require.NoError(t, err)
	defer st.close()
	require.NoError(t, os.RemoveAll(dir))
	id := newID("resp_")
	require.True(t, st.put(id, map[string]any{"id": id}, nil))
	assert.NotEmpty(t, logs, "the failed write is reported")
	r, ok := st.get(id)
	require.True(t, ok)
	assert.JSONEq(t, `{"id":"`+id+`"}`, string(r.obj))
}

func TestValidResponseID(t *testing.T) {
	assert.True(t, validResponseID(newID("resp_")))
	for _, id := range []string{"", "resp_", "resp_0123456789abcdef0123456", "resp_0123456789abcdef012345678", "resp_0123456789abcdef0123456g",
		"chatcmpl-0123456789abcdef01234567", "resp_/123456789abcdef01234567", "resp_0123456789ABCDEF01234567"} {
		assert.False(t, validResponseID(id), id)
	}
}

// TestStoredEncodingOnce: a response's file written from its messages
// encoded once (put's) holds the bytes of encoding the messages there,
// HTML characters, non-ASCII text and tool calls included.
func TestStoredEncodingOnce(t *testing.T) {
	id := "resp_0123456789abcdef01234567"
	msgs := []chatMessage{
		{Role: "user", Content: jsonString("<b>a & b</b> é \u2028 \"q\"")},
		{Role: "assistant", Content: json.RawMessage(`  {"k" : [1, 2]} `), ToolCalls: []toolCall{{ID: "call_1", Type: "function"}}},
		{Role: "tool", ToolCallID: "call_1", Content: jsonString("42 < 43")},
	}
	m, err := json.Marshal(msgs)
	require.NoError(t, err)
	plain := func(r *storedResponse) []byte {
		var b bytes.Buffer
		require.NoError(t, encodeStored(&b, r))
		zr, err := zstd.NewReader(&b)
		require.NoError(t, err)
		defer zr.Close()
		out, err := io.ReadAll(zr)
		require.NoError(t, err)
		return out
	}
	obj := json.RawMessage(`{"id":"` + id + `","x":"<&>"}`)
	want := plain(&storedResponse{id: id, obj: obj, msgs: msgs})
	require.Equal(t, string(want), string(plain(&storedResponse{id: id, obj: obj, msgs: msgs, msgsJSON: m})))
}

// FuzzStoredResponse: a response file, whatever its bytes, decodes to
// the response it names or to an error; what encodes decodes back.
func FuzzStoredResponse(f *testing.F) {
	id := "resp_0123456789abcdef01234567"
	var good bytes.Buffer
	require.NoError(f, encodeStored(&good, &storedResponse{id: id, obj: []byte(`{"id":"` + id + `"}`),
		msgs: []chatMessage{{Role: "user", Content: jsonString("hi")}}}))
	f.Add(good.Bytes())
	_, err := decodeStored("resp_76543210fedcba9876543210", good.Bytes())
	require.ErrorContains(f, err, "not", "a file holding another response")
	f.Add([]byte{})
	f.Add([]byte("\x28\xb5\x2f\xfd"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decodeStored(id, data)
		if err != nil {
			return
		}
		assert.True(t, strings.Contains(string(r.obj), id))
		var again bytes.Buffer
		require.NoError(t, encodeStored(&again, r))
		back, err := decodeStored(id, again.Bytes())
		require.NoError(t, err)
		assert.Equal(t, r.msgs, back.msgs)
		assert.JSONEq(t, string(r.obj), string(back.obj))
	})
}
