package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

// The reference: what the stream parser and ParseUsage decoded with
// encoding/json before the scanner replaced it.
type refUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	// The Responses API's names.
	InputTokens        int `json:"input_tokens"`
	OutputTokens       int `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	// The Anthropic Messages API's cache counts.
	CacheReadInputTokens     *int `json:"cache_read_input_tokens"`
	CacheCreationInputTokens int  `json:"cache_creation_input_tokens"`
}

func (u *refUsage) usage() Usage {
	read := 0
	if u.CacheReadInputTokens != nil {
		read = *u.CacheReadInputTokens
	}
	out := Usage{PromptTokens: u.PromptTokens + u.InputTokens + read + u.CacheCreationInputTokens,
		CompletionTokens: u.CompletionTokens + u.OutputTokens, TotalTokens: u.TotalTokens}
	if d := u.PromptTokensDetails; d != nil && d.CachedTokens != nil {
		out.CachedTokens, out.HasCachedTokens = *d.CachedTokens, true
	} else if d := u.InputTokensDetails; d != nil && d.CachedTokens != nil {
		out.CachedTokens, out.HasCachedTokens = *d.CachedTokens, true
	} else if u.CacheReadInputTokens != nil {
		out.CachedTokens, out.HasCachedTokens = read, true
	}
	return out
}

type refChunk struct {
	Usage *refUsage `json:"usage"`
	// A Responses stream event.
	Type     *string `json:"type"`
	Response *struct {
		Usage *refUsage `json:"usage"`
	} `json:"response"`
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content          *string         `json:"content"`
			ReasoningContent *string         `json:"reasoning_content"`
			Reasoning        *string         `json:"reasoning"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
}

func refScanChunk(data []byte) (u Usage, hasUsage, output bool, err error) {
	var c refChunk
	if err := json.Unmarshal(data, &c); err != nil {
		return Usage{}, false, false, err
	}
	if c.Usage != nil {
		u, hasUsage = c.Usage.usage(), true
	}
	if c.Response != nil && c.Response.Usage != nil {
		u, hasUsage = c.Response.Usage.usage(), true
	}
	if c.Type != nil && *c.Type != "response.created" && *c.Type != "response.in_progress" && *c.Type != "response.queued" &&
		*c.Type != "message_start" && *c.Type != "ping" {
		output = true
	}
	nonEmpty := func(s *string) bool { return s != nil && *s != "" }
	for _, ch := range c.Choices {
		d := ch.Delta
		if ch.Text != "" || nonEmpty(d.Content) || nonEmpty(d.ReasoningContent) || nonEmpty(d.Reasoning) ||
			(len(d.ToolCalls) > 0 && !isNull(d.ToolCalls) && string(bytes.TrimSpace(d.ToolCalls)) != "[]") ||
			ch.FinishReason != nil {
			output = true
		}
	}
	return u, hasUsage, output, nil
}

func refParseUsage(body []byte) (Usage, bool, error) {
	var v struct {
		Usage *refUsage `json:"usage"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return Usage{}, false, err
	}
	if v.Usage == nil {
		return Usage{}, false, nil
	}
	return v.Usage.usage(), true, nil
}

// comparable reports whether encoding/json's answer on data is one the
// scanner is meant to reproduce: no object repeats a key (encoding/json
// then merges into values in ways that depend on its reflection), and no
// key holds non-ASCII bytes or escapes (encoding/json also folds the
// Kelvin sign and the long s into k and s).
func comparable(data []byte) bool {
	if bytes.Contains(data, []byte(`\u`)) || bytes.Contains(data, []byte(`\U`)) {
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	type level struct {
		obj  bool
		keys map[string]bool
		key  bool // the next string token is a key
	}
	var stack []level
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return true
		}
		if err != nil {
			return true // malformed: both must fail
		}
		top := len(stack) - 1
		isKey := top >= 0 && stack[top].obj && stack[top].key
		if top >= 0 && stack[top].obj {
			stack[top].key = !stack[top].key
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				stack = append(stack, level{obj: true, keys: map[string]bool{}, key: true})
			case '[':
				stack = append(stack, level{})
			default:
				stack = stack[:len(stack)-1]
				if n := len(stack) - 1; n >= 0 && stack[n].obj {
					stack[n].key = true
				}
			}
			if t == '{' || t == '[' {
				if top >= 0 && stack[top].obj {
					stack[top].key = true // the container was a value
				}
			}
		case string:
			if isKey {
				for i := 0; i < len(t); i++ {
					if t[i] >= 0x80 {
						return false
					}
				}
				k := strings.ToLower(t)
				if stack[top].keys[k] {
					return false
				}
				stack[top].keys[k] = true
			}
		}
	}
}

var chunkCases = []string{
	`{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":null}`,
	`{"id":"c","choices":[{"index":0,"delta":{"content":"Hel"}}]}`,
	`{"choices":[{"delta":{"content":"lo"},"finish_reason":"stop"}]}`,
	`{"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":2,"total_tokens":42,"prompt_tokens_details":{"cached_tokens":32}}}`,
	`{"usage":{"prompt_tokens":4,"prompt_tokens_details":{"cached_tokens":null}}}`,
	`{"usage":{"prompt_tokens":4,"prompt_tokens_details":null}}`,
	`{"usage":{"prompt_tokens":null,"total_tokens":7}}`,
	`{"choices":[{"text":""},{"text":"x"}]}`,
	`{"choices":[{"text":null,"finish_reason":""}]}`,
	`{"choices":[{"delta":{"tool_calls":[]}}]}`,
	`{"choices":[{"delta":{"tool_calls":[ ]}}]}`,
	`{"choices":[{"delta":{"tool_calls":null}}]}`,
	`{"choices":[{"delta":{"tool_calls":{"a":[1,2]}}}]}`,
	`{"choices":[{"delta":{"reasoning":"r"}}]}`,
	`{"choices":[{"delta":{"reasoning_content":"\n"}}]}`,
	`{"choices":[{"delta":null},null]}`,
	`{"choices":null,"usage":{"prompt_tokens":1}}`,
	`{"Choices":[{"Text":"x"}],"USAGE":{"Prompt_Tokens":3}}`,
	`null`,
	`[]`,
	`"x"`,
	`{"usage":"x"}`,
	`{"usage":{"prompt_tokens":1.5}}`,
	`{"usage":{"prompt_tokens":1e2}}`,
	`{"usage":{"prompt_tokens":99999999999999999999}}`,
	`{"usage":{"prompt_tokens":"3"}}`,
	`{"choices":{}}`,
	`{"choices":[1]}`,
	`{"choices":[{"text":1}]}`,
	`{"choices":[{"delta":[]}]}`,
	`{"choices":[{"delta":{"content":false}}]}`,
	`{"choices":[{"finish_reason":3}]}`,
	`{"choices":[{"text":"x"}]`,
	`{"choices":[{"text":"x"}]} x`,
	`{"a":[1,{"b":"\ud800"}],"choices":[{"text":"\u00e9"}]}`,
	`{"choices":[{"text":"x","extra":{"deep":[[[{}]]]}}],"usage":{"total_tokens":-3}}`,
	// Responses API stream events and bodies.
	`{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","status":"in_progress","usage":null}}`,
	`{"type":"response.in_progress","response":{"id":"resp_1","output":[]}}`,
	`{"type":"response.output_item.added","output_index":0,"item":{"type":"message","content":[]}}`,
	`{"type":"response.output_text.delta","delta":"Hel","item_id":"msg_1"}`,
	`{"type":"response.completed","response":{"id":"resp_1","usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":32},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":42}}}`,
	`{"type":"response.completed","response":{"usage":{"input_tokens":4,"input_tokens_details":null}}}`,
	`{"type":"response.completed","response":null}`,
	`{"type":"response.incomplete","response":{"id":"resp_2","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0},"output_tokens":5,"total_tokens":14}}}`,
	`{"type":null,"response":{"usage":{"output_tokens":1}}}`,
	`{"type":3}`,
	`{"type":"response.failed","response":[]}`,
	`{"usage":{"input_tokens":9,"output_tokens":1,"input_tokens_details":{"cached_tokens":null}}}`,
	`{"id":"resp_1","object":"response","output":[],"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":8},"output_tokens":3,"total_tokens":15}}`,
	// Anthropic Messages stream events and bodies, as vLLM writes them.
	`{"type":"message_start","message":{"id":"chatcmpl-1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":20,"output_tokens":0,"cache_read_input_tokens":32}}}`,
	`{"type":"ping"}`,
	`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
	`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`,
	`{"type":"content_block_stop","index":0}`,
	`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":20,"output_tokens":5,"cache_read_input_tokens":32}}`,
	`{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":52,"output_tokens":5}}`,
	`{"type":"message_delta","usage":{"input_tokens":4,"output_tokens":1,"cache_read_input_tokens":16,"cache_creation_input_tokens":8}}`,
	`{"type":"message_delta","usage":{"input_tokens":4,"cache_read_input_tokens":16,"cache_read_input_tokens":null}}`,
	`{"type":"message_delta","usage":{"cache_read_input_tokens":"16"}}`,
	`{"type":"message_delta","usage":{"cache_creation_input_tokens":null,"cache_read_input_tokens":0}}`,
	`{"type":"message_stop"}`,
	`{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"model":"m","stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":2,"cache_read_input_tokens":48}}`,
}

func TestScanChunkMatchesEncodingJSON(t *testing.T) {
	for _, data := range chunkCases {
		checkChunk(t, []byte(data))
	}
}

func checkChunk(t *testing.T, data []byte) {
	t.Helper()
	c, err := scanChunk(data)
	wu, wHas, wOut, wErr := refScanChunk(data)
	if (err != nil) != (wErr != nil) {
		t.Fatalf("%s: scanner error %v, encoding/json error %v", data, err, wErr)
	}
	if err != nil {
		return
	}
	if c.hasUsage != wHas || c.usage.usage() != wu || c.output != wOut {
		t.Fatalf("%s: scanner usage %+v/%v output %v; encoding/json %+v/%v output %v", data, c.usage.usage(), c.hasUsage, c.output, wu, wHas, wOut)
	}
	if firstByte(data) != '{' {
		return
	}
	u, ok, err := ParseUsage(data)
	ru, rok, rerr := refParseUsage(data)
	if (err != nil) != (rerr != nil) || u != ru || ok != rok {
		t.Fatalf("%s: ParseUsage %+v/%v/%v, encoding/json %+v/%v/%v", data, u, ok, err, ru, rok, rerr)
	}
	if err != nil && !errors.Is(err, ErrInvalidResponse) {
		t.Fatalf("%s: error %v does not wrap ErrInvalidResponse", data, err)
	}
}

func FuzzScanChunk(f *testing.F) {
	for _, c := range chunkCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !comparable(data) {
			return
		}
		checkChunk(t, data)
	})
}

func TestComparableFindsRepeatedKeys(t *testing.T) {
	for data, want := range map[string]bool{
		`{"a":1,"A":2}`:                           false,
		`{"a":{"a":1},"b":[{"a":1}]}`:             true,
		`{"a":[1,{"b":1,"b":2}]}`:                 false,
		`{"choices":[{"text":"x"}],"choices":[]}`: false,
		`{"k\u0061":1}`:                           false,
	} {
		if got := comparable([]byte(data)); got != want {
			t.Errorf("comparable(%s) = %v, want %v", data, got, want)
		}
	}
}
