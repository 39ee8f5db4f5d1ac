package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"k3/internal/tokenizer"
	"k3/k3"
)

// Tool calls in the Kimi chat format (docs/SERVING.md, "Tool calls").

const (
	toolSectionBegin = "<|tool_calls_section_begin|>"
	toolSectionEnd   = "<|tool_calls_section_end|>"
	toolCallBegin    = "<|tool_call_begin|>"
	toolArgsBegin    = "<|tool_call_argument_begin|>"
	toolCallEnd      = "<|tool_call_end|>"
)

// maxTools bounds a request's tools list.
const maxTools = 128

var toolName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// toolCall is an entry of an assistant message's tool_calls, in requests
// and in answers.
type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
	cut bool // max_tokens or the context cut its arguments short
}

// toolDeclaration validates a request's tools and renders the turn that
// declares them, with their names; "" when there are none.
func toolDeclaration(raw json.RawMessage) (decl string, names []string, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil, nil
	}
	var tools []map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // numbers in the schemas render as written
	if err := dec.Decode(&tools); err != nil {
		return "", nil, badParam("tools", "tools must be a list of objects")
	}
	if len(tools) == 0 {
		return "", nil, nil
	}
	if len(tools) > maxTools {
		return "", nil, badParam("tools", "tools holds %d tools, at most %d", len(tools), maxTools)
	}
	for i, t := range tools {
		param := fmt.Sprintf("tools[%d]", i)
		if t["type"] != "function" {
			return "", nil, badParam(param+".type", "%s.type = %v, want \"function\"", param, jsonText(t["type"]))
		}
		f, ok := t["function"].(map[string]any)
		if !ok {
			return "", nil, badParam(param+".function", "%s.function must be an object", param)
		}
		name, _ := f["name"].(string)
		names = append(names, name)
		if !toolName.MatchString(name) {
			return "", nil, badParam(param+".function.name", "%s.function.name = %v, want 1-64 letters, digits, _ or -", param, jsonText(f["name"]))
		}
		if p, ok := f["parameters"]; ok {
			if _, ok := p.(map[string]any); !ok && p != nil {
				return "", nil, badParam(param+".function.parameters", "%s.function.parameters must be a JSON Schema object", param)
			}
		}
	}
	// Compact, keys sorted (encoding/json sorts map keys), no HTML escapes:
	// the template's tojson.
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(tools); err != nil {
		return "", nil, badParam("tools", "tools: %v", err)
	}
	return strings.TrimSuffix(b.String(), "\n"), names, nil
}

// toolSchemas compiles the parameters of the named functions (through
// the server's schema cache), which
// then hold the calls' arguments, and reports whether one of them is
// strict. A function with "strict": true whose schema k3 cannot hold is
// an error; without strict its arguments are held to a JSON object only
// (OpenAI promises adherence only with strict).
func (srv *Server) toolSchemas(raw json.RawMessage, named []string) (map[string]*k3.JSONSchema, bool, error) {
	var tools []struct {
		Function struct {
			Name       string          `json:"name"`
			Parameters json.RawMessage `json:"parameters"`
			Strict     bool            `json:"strict"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, false, badParam("tools", "tools must be a list of objects")
	}
	out := map[string]*k3.JSONSchema{}
	strict := false
	for i, t := range tools {
		f := t.Function
		if !slices.Contains(named, f.Name) {
			continue
		}
		strict = strict || f.Strict
		if len(f.Parameters) == 0 || string(f.Parameters) == "null" {
			continue
		}
		param := fmt.Sprintf("tools[%d].function.parameters", i)
		s, err := srv.schemas.compile(f.Parameters)
		if err == nil {
			_, err = s.Objects()
		}
		switch {
		case err == nil:
			out[f.Name] = s
		case f.Strict:
			return nil, false, badParam(param, "%s: %s", param, strings.TrimPrefix(err.Error(), k3.ErrInvalidOption.Error()+": "))
		}
	}
	return out, strict, nil
}

func jsonText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// toolCallsParts renders an assistant message's tool calls after its
// content: the section's markers as markup, each call's id and arguments
// as text.
func toolCallsParts(calls []toolCall, param string) ([]tokenizer.ChatPart, error) {
	parts := []tokenizer.ChatPart{{Text: toolSectionBegin, Markup: true}}
	for i, c := range calls {
		p := fmt.Sprintf("%s[%d]", param, i)
		switch {
		case c.Type != "" && c.Type != "function":
			return nil, badParam(p+".type", "%s.type = %q, want \"function\"", p, c.Type)
		case c.ID == "":
			return nil, badParam(p+".id", "%s.id is missing", p)
		}
		parts = append(parts, tokenizer.ChatPart{Text: toolCallBegin, Markup: true}, tokenizer.ChatPart{Text: c.ID},
			tokenizer.ChatPart{Text: toolArgsBegin, Markup: true}, tokenizer.ChatPart{Text: c.Function.Arguments},
			tokenizer.ChatPart{Text: toolCallEnd, Markup: true})
	}
	return append(parts, tokenizer.ChatPart{Text: toolSectionEnd, Markup: true}), nil
}

// toolResult renders a tool message.
func toolResult(m chatMessage, content, param string) (tokenizer.ChatTurn, error) {
	if m.ToolCallID == "" {
		return tokenizer.ChatTurn{}, badParam(param+".tool_call_id", "%s.tool_call_id is missing", param)
	}
	role := "tool"
	if m.Name != "" && m.Name != "user" && m.Name != "assistant" {
		role = m.Name
	}
	return tokenizer.ChatTurn{Role: role, Parts: []tokenizer.ChatPart{{Text: "## Return of " + m.ToolCallID + "\n" + content}}}, nil
}

// parseToolCalls reads generated text back: the content before the tool
// calls section and the section's calls, each complete at its
// <|tool_call_end|>. cut says that max_tokens or the context ended the
// generation: then a last call whose arguments had begun is kept with the
// arguments written so far (as OpenAI answers a call cut short, beside
// finish_reason length), marked cut unless they are whole (cutArguments:
// only the end marker was cut), and a section holding no call is
// dropped, so that the section's markup never reaches the content; nor
// does the start of its marker where the cut fell in it ("<|" and on: a
// lone "<" is kept as text, which it more likely is). ok is
// false when all of the text is content: it has no section or, not cut,
// no complete call.
func parseToolCalls(text string, cut bool) (content string, calls []toolCall, ok bool) {
	before, section, found := strings.Cut(text, toolSectionBegin)
	if !found {
		if n := partialSuffix(text, toolSectionBegin); cut && n >= 2 {
			return text[:len(text)-n], nil, true // the section's marker, cut as it began
		}
		return text, nil, false
	}
	section, _, closed := strings.Cut(section, toolSectionEnd)
	for {
		_, rest, found := strings.Cut(section, toolCallBegin)
		if !found {
			break
		}
		call, after, complete := strings.Cut(rest, toolCallEnd)
		if !complete && (!cut || closed) {
			break // the model stopped inside a call: not one
		}
		section = after
		id, args, found := strings.Cut(call, toolArgsBegin)
		if !found {
			continue
		}
		var c toolCall
		c.ID, c.Type = strings.TrimSpace(id), "function"
		c.Function.Name = toolCallName(c.ID)
		c.Function.Arguments = strings.TrimSpace(args)
		if !complete {
			c.Function.Arguments, c.cut = cutArguments(args)
		}
		calls = append(calls, c)
	}
	if len(calls) == 0 && !cut {
		return text, nil, false
	}
	return before, calls, true
}

// cutArguments reads the arguments of a call the generation ended in.
// Arguments that are a whole JSON object, followed by nothing or by the
// start of <|tool_call_end|> (all that the grammar lets follow them), make
// a complete call. Otherwise they are kept as written, marked cut; their
// trailing white space may be inside a string the cut left open.
func cutArguments(args string) (string, bool) {
	args = strings.TrimLeft(args, " \t\r\n")
	whole := strings.TrimSpace(args[:len(args)-partialSuffix(args, toolCallEnd)])
	if strings.HasPrefix(whole, "{") && json.Valid([]byte(whole)) {
		return whole, false
	}
	return args, true
}

// toolCallName is the function a call's id names: functions.NAME:INDEX
// (or NAME:INDEX) without the prefix and the index.
func toolCallName(id string) string {
	name := strings.TrimPrefix(id, "functions.")
	if i := strings.LastIndexByte(name, ':'); i >= 0 {
		name = name[:i]
	}
	return name
}

// toolStream splits a choice's streamed text: the content before the tool
// calls section is released as it comes, but for a tail that may begin
// the section's marker; from the marker on, the text is kept for
// parseToolCalls at the end.
type toolStream struct {
	held    string // content not yet released
	section bool   // the marker has been seen
	all     []byte // every piece
}

// next takes a piece of text and returns the content that may be sent.
func (t *toolStream) next(text string) string {
	t.all = append(t.all, text...)
	if t.section {
		return ""
	}
	t.held += text
	if i := strings.Index(t.held, toolSectionBegin); i >= 0 {
		out := t.held[:i]
		t.held, t.section = "", true
		return out
	}
	keep := partialSuffix(t.held, toolSectionBegin)
	out := t.held[:len(t.held)-keep]
	t.held = t.held[len(t.held)-keep:]
	return out
}

// end returns the content still held and the calls, once the generation
// has ended (cut: by max_tokens or the context), as parseToolCalls reads
// them. Where that finds no call, everything not yet sent is content.
func (t *toolStream) end(cut bool) (content string, calls []toolCall) {
	_, calls, ok := parseToolCalls(string(t.all), cut)
	if ok && !t.section { // the cut fell in the marker, which t.held ends with
		return t.held[:len(t.held)-partialSuffix(t.held, toolSectionBegin)], nil
	}
	if ok {
		return t.held, calls
	}
	if t.section {
		_, after, _ := strings.Cut(string(t.all), toolSectionBegin)
		return t.held + toolSectionBegin + after, nil
	}
	return t.held, nil
}
