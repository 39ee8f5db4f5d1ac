package k3

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/internal/jsonschema"
	"k3/specdec"
)

const personSchema = `{"type":"object","additionalProperties":false,"required":["name","age","role"],
	"properties":{"name":{"type":"string","maxLength":8},"age":{"type":"integer"},
	"role":{"enum":["admin","user"]},"tags":{"type":"array","items":{"type":"string"},"maxItems":2},
	"boss":{"anyOf":[{"type":"null"},{"type":"object","properties":{"name":{"type":"string"}},"required":["name"],"additionalProperties":false}]}}}`

// person is personSchema as Go types, read with unknown fields refused:
// the test's own check of a stopped answer.
type person struct {
	Name *string   `json:"name"`
	Age  *int64    `json:"age"`
	Role *string   `json:"role"`
	Tags *[]string `json:"tags"`
	Boss *struct {
		Name *string `json:"name"`
	} `json:"boss"`
}

func checkPerson(t *testing.T, out string) {
	d := json.NewDecoder(strings.NewReader(out))
	d.DisallowUnknownFields()
	var p person
	require.NoError(t, d.Decode(&p), "%q", out)
	require.False(t, d.More(), "%q", out)
	require.NotNil(t, p.Name, out)
	require.NotNil(t, p.Age, out)
	require.NotNil(t, p.Role, out)
	assert.LessOrEqual(t, utf8.RuneCountInString(*p.Name), 8, out)
	assert.Contains(t, []string{"admin", "user"}, *p.Role, out)
	if p.Tags != nil {
		assert.LessOrEqual(t, len(*p.Tags), 2, out)
	}
	if p.Boss != nil {
		assert.NotNil(t, p.Boss.Name, out)
	}
}

// TestJSONSchema: the embedded model, which writes Go, held to a schema:
// a generation that stops is a value of the schema (read back by Go
// types with unknown fields refused), one cut by max_tokens a prefix of
// a JSON object.
func TestJSONSchema(t *testing.T) {
	if raceEnabled {
		t.Skip("one goroutine's grammar work, minutes of masks under the race detector; the serve tests run constrained requests under it")
	}
	ctx := context.Background()
	m, err := LoadTiny(ctx, WithRollback(4))
	require.NoError(t, err)
	defer m.Close()
	schema, err := CompileJSONSchema([]byte(personSchema))
	require.NoError(t, err)
	prompt := m.Encode(m.ChatPrompt([]Message{{Role: "user", Content: "func main() {"}}))
	stopped := 0
	for i, opts := range [][]GenerateOption{
		{WithTemperature(0)},
		{WithTemperature(1), WithSeed(1)},
		{WithTemperature(1.5), WithSeed(2)},
		{WithTemperature(1), WithSeed(3), WithoutDefaultStops()},
		{WithTemperature(2), WithSeed(4), WithTopK(50)},
		{WithTemperature(1), WithSeed(5), WithSpeculation(specdec.NGram{}, 4)}, // held while speculating
	} {
		out, finish, special := heldGeneration(t, m, prompt, append(opts, WithJSONSchema(schema), WithMaxTokens(200))...)
		assert.Zero(t, special, "case %d: special tokens drawn", i)
		switch finish {
		case FinishStop:
			stopped++
			checkPerson(t, out)
		case FinishLength:
			st := jsonschema.Object().Start()
			require.True(t, st.Feed([]byte(out)), "case %d: %q is not a JSON object's prefix", i, out)
			assert.False(t, st.Done(), "case %d: cut by length after the object closed: %q", i, out)
		default:
			t.Fatalf("case %d: finish %v", i, finish)
		}
		t.Logf("case %d (%v): %q", i, finish, out)
	}
	assert.Positive(t, stopped, "no generation finished its value within 200 tokens")
}

// TestJSONSchemaFormats: strings held to a format and a pattern come out
// as the standard library's parsers and package regexp read them, a
// bounded number within its bounds.
func TestJSONSchemaFormats(t *testing.T) {
	if raceEnabled {
		t.Skip("one goroutine's grammar work (as TestJSONSchema)")
	}
	ctx := context.Background()
	m, err := LoadTiny(ctx)
	require.NoError(t, err)
	defer m.Close()
	schema, err := CompileJSONSchema([]byte(`{"type":"object","additionalProperties":false,"required":["day","id"],
		"properties":{"day":{"type":"string","format":"date"},"id":{"type":"string","pattern":"^[A-Z]{2}[0-9]{3}$"},
		"at":{"type":"string","format":"date-time"},"p":{"type":"number","exclusiveMinimum":0,"maximum":0.5}}}`))
	require.NoError(t, err)
	prompt := m.Encode(m.ChatPrompt([]Message{{Role: "user", Content: "func main() {"}}))
	id := regexp.MustCompile(`^[A-Z]{2}[0-9]{3}$`)
	stopped := 0
	for seed := range uint64(6) {
		out, finish, special := heldGeneration(t, m, prompt, WithJSONSchema(schema), WithTemperature(1), WithSeed(seed), WithMaxTokens(240))
		assert.Zero(t, special, "seed %d: special tokens drawn", seed)
		t.Logf("seed %d (%v): %q", seed, finish, out)
		if finish != FinishStop {
			continue
		}
		stopped++
		var v struct {
			Day, ID, At *string
			P           *float64
		}
		require.NoError(t, json.Unmarshal([]byte(out), &v), out)
		require.NotNil(t, v.Day, out)
		require.NotNil(t, v.ID, out)
		_, err := time.Parse(time.DateOnly, *v.Day)
		assert.NoError(t, err, out)
		assert.Regexp(t, id, *v.ID, out)
		if v.At != nil {
			_, err := time.Parse(time.RFC3339Nano, *v.At)
			assert.NoError(t, err, out)
		}
		if v.P != nil {
			assert.True(t, *v.P > 0 && *v.P <= 0.5, out)
		}
	}
	assert.Positive(t, stopped, "no generation finished its value within 240 tokens")
}

// TestJSONSchemaScalar: a schema whose value is a number at the top
// level may stop after any digit, and without stop tokens ends at the
// white space after it.
func TestJSONSchemaScalar(t *testing.T) {
	ctx := context.Background()
	m, err := LoadTiny(ctx)
	require.NoError(t, err)
	defer m.Close()
	schema, err := CompileJSONSchema([]byte(`{"enum":[7, 70, "x y", [1]]}`))
	require.NoError(t, err)
	prompt := m.Encode("package main\n")
	for seed := range uint64(6) {
		s, err := m.NewSession()
		require.NoError(t, err)
		out, err := genText(ctx, s, prompt, WithJSONSchema(schema), WithTemperature(2), WithSeed(seed), WithMaxTokens(40), WithoutDefaultStops())
		require.NoError(t, err)
		s.Close()
		v := strings.TrimSpace(out)
		assert.Contains(t, []string{"7", "70", `"x y"`, "[1]"}, v, "seed %d: %q", seed, out)
		if v == "7" || v == "70" {
			assert.NotEqual(t, v, strings.TrimLeft(out, " \t\r\n"), "seed %d: a number ended without white space: %q", seed, out)
		}
	}
}

// genText runs a generation to its end and returns its text.
func genText(ctx context.Context, s *Session, prompt []int32, opts ...GenerateOption) (string, error) {
	var b strings.Builder
	for tok, err := range s.GenerateTokens(ctx, prompt, opts...) {
		if err != nil {
			return b.String(), err
		}
		b.WriteString(tok.Text)
	}
	return b.String(), nil
}

func TestJSONSchemaErrors(t *testing.T) {
	ctx := context.Background()
	m, err := LoadTiny(ctx)
	require.NoError(t, err)
	defer m.Close()
	_, err = CompileJSONSchema([]byte(`{"type":"string","pattern":"^a(?!b)"}`))
	assert.ErrorIs(t, err, ErrInvalidOption)
	assert.ErrorContains(t, err, `#/pattern "^a(?!b)"`)
	_, err = CompileJSONSchema([]byte(`{"type":"object","required":["a"],"additionalProperties":false}`))
	assert.ErrorIs(t, err, ErrInvalidOption)
	assert.ErrorContains(t, err, "admits no value")

	schema, err := CompileJSONSchema([]byte(`{"type":"object"}`))
	require.NoError(t, err)
	s, err := m.NewSession()
	require.NoError(t, err)
	defer s.Close()
	prompt := m.Encode("x")
	for _, opts := range [][]GenerateOption{
		{WithJSONSchema(schema), WithJSONObject()},
		{WithJSONSchema(schema), WithToolCalls([]string{"f"}, false)},
		{WithJSONSchema(nil)},
	} {
		_, err := genText(ctx, s, prompt, opts...)
		assert.ErrorIs(t, err, ErrInvalidOption)
	}
	_, err = m.NewSampler(WithJSONSchema(schema))
	assert.ErrorIs(t, err, ErrInvalidOption)
	// The session is still usable.
	out, err := genText(ctx, s, prompt, WithJSONSchema(schema), WithMaxTokens(8))
	require.NoError(t, err)
	assert.True(t, bytes.HasPrefix([]byte(strings.TrimLeft(out, " \t\r\n")), []byte("{")), "%q", out)
}
