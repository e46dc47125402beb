package openai

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestStoredResponsePath(t *testing.T) {
	for _, c := range []struct {
		path, id string
		ok       bool
	}{
		{"/v1/responses/resp_1", "resp_1", true},
		{"/v1/responses/resp_1/cancel", "resp_1", true},
		{"/v1/responses/resp_1?stream=true&starting_after=3", "resp_1", true},
		{"/v1/responses/a%2Fb%20c", "a/b c", true},
		{"/v1/responses", "", false},
		{"/v1/responses/", "", false},
		{"/v1/responses/a/b", "", false},
		{"/v1/responses/cancel", "cancel", true}, // an id named "cancel", as FastAPI reads it
		{"/v1/responses//cancel", "", false},
		{"/v1/responses/%zz", "", false},
		{"/v1/chat/completions", "", false},
		{"/v2/responses/resp_1", "", false},
	} {
		id, ok := StoredResponsePath(c.path)
		if id != c.id || ok != c.ok {
			t.Errorf("%s: %q %v, want %q %v", c.path, id, ok, c.id, c.ok)
		}
	}
}

func TestResponseID(t *testing.T) {
	body := `{"id":"resp_abc","created_at":1,"output":[{"id":"msg_1"}],"usage":null}`
	stream := "event: response.created\ndata: {\"response\":{\"id\":\"resp_s\",\"object\":\"response\"},\"sequence_number\":0,\"type\":\"response.created\"}\n\n" +
		"event: response.in_progress\ndata: {\"response\":{\"id\":\"resp_s\"}}\n\n"
	for _, c := range []struct {
		name   string
		prefix string
		sse    bool
		id     string
		more   bool
	}{
		{"whole body", body, false, "resp_abc", false},
		{"id first, the rest to come", body[:20], false, "resp_abc", false},
		{"cut inside the id", body[:10], false, "", true},
		{"id after other keys", `{"object":"response","nested":{"id":"no"},"id":"resp_late"}`, false, "resp_late", false},
		{"id later than the prefix", `{"object":"response","nested":{"id":"no"}`, false, "", true},
		{"no id", `{"object":"response"}`, false, "", false},
		{"not an object", `[1]`, false, "", false},
		{"empty", ``, false, "", true},
		{"an id that is not a string", `{"id":7}`, false, "", false},
		{"event stream", stream, true, "resp_s", false},
		{"first event cut after the id", stream[:60], true, "resp_s", false},
		{"first event cut before the id", stream[:48], true, "", true},
		{"cut inside the data prefix", "event: response.created\nda", true, "", true},
		{"the response's id after other members", "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"instructions\":\"{\\\"id\\\":1}\",\"id\":\"resp_t\"}}\n\n", true, "resp_t", false},
		{"a whole first event without a response id", "data: {\"response\":{\"object\":\"response\"}}\n\n", true, "", false},
		{"CRLF and split data lines", "event: response.queued\r\ndata: {\"response\":\r\ndata: {\"id\":\"resp_q\"}}\r\n\r\n", true, "resp_q", false},
		{"first event without a response", "data: {\"type\":\"error\"}\n\n" + stream, true, "", false},
		{"leading blank lines", "\n\n" + stream, true, "resp_s", false},
	} {
		id, more := ResponseID([]byte(c.prefix), c.sse)
		if id != c.id || more != c.more {
			t.Errorf("%s: %q more=%v, want %q more=%v", c.name, id, more, c.id, c.more)
		}
	}
}

// FuzzResponseID: a JSON body's id read from any prefix agrees with the
// whole body's, the whole of a valid body never asks for more, and, for a
// body with one "id", the answer is encoding/json's top-level string id.
func FuzzResponseID(f *testing.F) {
	for _, s := range []string{`{"id":"resp_abc","output":[{"id":"msg_1"}]}`, `{"object":"response","nested":{"id":"no"},"id":"resp_late"}`,
		`{"id":7}`, `[1]`, `{"id":"a\u0062c"}`, `{"x":"}","id":"q"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		id, more := ResponseID(body, false)
		if !json.Valid(body) {
			return
		}
		if more {
			t.Fatalf("%q: a whole valid body asks for more", body)
		}
		for n := range len(body) {
			if pid, pmore := ResponseID(body[:n], false); !pmore && pid != id {
				t.Fatalf("%q: prefix %d answers %q, the whole body %q", body, n, pid, id)
			}
		}
		var top map[string]any
		if json.Unmarshal(body, &top) != nil || bytes.Count(body, []byte(`"id"`)) > 1 || bytes.Contains(body, []byte(`\u`)) {
			return
		}
		want, _ := top["id"].(string)
		if id != want {
			t.Fatalf("%q: id %q, encoding/json %q", body, id, want)
		}
	})
}
