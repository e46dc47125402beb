package tokenize

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kvroute/kvroute/pkg/route"
)

// fakeRender implements vLLM's render endpoints: it answers with one id a
// byte of the body it was sent (a list of one for completions), so tests
// can tell that the body went through unchanged.
type fakeRender struct {
	calls    atomic.Int64
	status   atomic.Int64 // when set, the status every call gets
	mu       sync.Mutex
	lastPath string
	lastBody []byte
}

func (f *fakeRender) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.calls.Add(1)
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.lastPath, f.lastBody = r.URL.Path, body
	f.mu.Unlock()
	if s := f.status.Load(); s != 0 {
		http.Error(w, `{"error":{"message":"refused"}}`, int(s))
		return
	}
	ids := make([]string, len(body))
	for i, b := range body {
		ids[i] = fmt.Sprint(b)
	}
	one := `{"request_id":"chatcmpl-1","token_ids":[` + strings.Join(ids, ",") + `],"features":null,"sampling_params":{"max_tokens":5,"stop":["a]"]},"model":"m"}`
	switch r.URL.Path {
	case "/v1/completions/render":
		_, _ = io.WriteString(w, "["+one+`,{"token_ids":[9]}]`)
	case "/v1/chat/completions/render", "/v1/responses/render", "/v1/messages/render":
		_, _ = io.WriteString(w, one)
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeRender) last() (string, []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastPath, f.lastBody
}

func byteIDs(b []byte) []uint32 {
	out := make([]uint32, len(b))
	for i, c := range b {
		out[i] = uint32(c)
	}
	return out
}

func newRenderTokenizer(t *testing.T, mc ModelConfig, replicas func() []string) (*Tokenizer, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	mc.Kind = KindRender
	opts := Options{Registerer: reg}
	if replicas != nil {
		opts.Replicas = func(string) []string { return replicas() }
	}
	tok, err := New(Config{Models: map[string]ModelConfig{"m": mc}}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tok.Close)
	return tok, reg
}

// TestRenderTokenizer: the render tokenizer sends the request's own body to
// its API's render endpoint and takes the token_ids it gets back (the
// first prompt's for completions), exact, from the render servers it names
// or else from the model's replicas; answers are cached by API and body; a
// request without a body, or one the server refuses, falls back to
// approximate tokens, counted.
func TestRenderTokenizer(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	fake := &fakeRender{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	replica := &fakeRender{}
	rsrv := httptest.NewServer(replica)
	defer rsrv.Close()
	tok, reg := newRenderTokenizer(t, ModelConfig{Timeout: 10 * time.Second, RenderURLs: []string{srv.URL + "/"}},
		func() []string { return []string{rsrv.URL} })
	ctx := context.Background()
	chat := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"reasoning_effort":"none"}`)
	for _, c := range []struct {
		api  string
		body []byte
	}{
		{"/v1/chat/completions", chat},
		{"/v1/completions", []byte(`{"model":"m","prompt":["ab","cd"]}`)},
		{"/v1/responses", []byte(`{"model":"m","input":"x","previous_response_id":"resp_1"}`)},
		{"/v1/messages", []byte(`{"model":"m","max_tokens":9,"thinking":{"type":"disabled"},"messages":[{"role":"user","content":"x"}]}`)},
	} {
		got, err := tok.Tokenize(ctx, "m", route.TokenizeInput{Body: c.body, API: c.api})
		if err != nil {
			t.Fatalf("%s: %v", c.api, err)
		}
		if !slices.Equal(got.IDs, byteIDs(c.body)) || got.Source != SourceRender || !got.Exact {
			t.Errorf("%s: got %d ids from %s (exact %v), want the body's %d bytes from render", c.api, len(got.IDs), got.Source, got.Exact, len(c.body))
		}
		if path, body := fake.last(); path != c.api+"/render" || !bytes.Equal(body, c.body) {
			t.Errorf("%s: server got %s %s", c.api, path, body)
		}
	}
	if replica.calls.Load() != 0 {
		t.Errorf("render_urls set, yet the replicas were asked %d times", replica.calls.Load())
	}
	// The same body again is a cache hit; the same body to another API is not.
	calls := fake.calls.Load()
	if _, err := tok.Tokenize(ctx, "m", route.TokenizeInput{Body: chat, API: "/v1/chat/completions"}); err != nil {
		t.Fatal(err)
	}
	if fake.calls.Load() != calls {
		t.Error("a repeated body was asked again")
	}
	if _, err := tok.Tokenize(ctx, "m", route.TokenizeInput{Body: chat, API: "/v1/responses"}); err != nil || fake.calls.Load() != calls+1 {
		t.Errorf("another API's render: %v, %d calls", err, fake.calls.Load()-calls)
	}
	if got := counterValue(t, reg, "kvroute_tokenizer_cache_hits_total", "render"); got != 1 {
		t.Errorf("render cache hits = %v, want 1", got)
	}
	// No body (a caller that is not ext_proc), and a body the server
	// refuses: approximate tokens, the reason kept.
	got, err := tok.Tokenize(ctx, "m", route.TokenizeInput{Prompt: "some text"})
	if err != nil || got.Exact || got.Source != "approximate:render_unsupported" {
		t.Errorf("no body: %+v, %v", got, err)
	}
	fake.status.Store(http.StatusBadRequest)
	_, err = tok.Tokenize(ctx, "m", route.TokenizeInput{Body: []byte(`{"model":"m","messages":[]}`), API: "/v1/chat/completions"})
	if err != nil {
		t.Fatal(err)
	}
	if got := counterValue(t, reg, "kvroute_tokenizer_fallbacks_total", "m", "render", "remote_error"); got != 1 {
		t.Errorf("fallbacks on a refused body = %v, want 1", got)
	}
	if !strings.Contains(tok.Explain("m"), "render endpoints of "+srv.URL) {
		t.Errorf("explain: %s", tok.Explain("m"))
	}

	// Without render_urls the model's replicas are asked.
	tok2, _ := newRenderTokenizer(t, ModelConfig{Timeout: 10 * time.Second}, func() []string { return []string{rsrv.URL} })
	got, err = tok2.Tokenize(ctx, "m", route.TokenizeInput{Body: chat, API: "/v1/chat/completions"})
	if err != nil || !slices.Equal(got.IDs, byteIDs(chat)) || replica.calls.Load() != 1 {
		t.Errorf("replicas: %v, %d calls", err, replica.calls.Load())
	}
	if !strings.Contains(tok2.Explain("m"), "replicas' render endpoints") {
		t.Errorf("explain: %s", tok2.Explain("m"))
	}
	if _, err := New(Config{Models: map[string]ModelConfig{"m": {Kind: KindRender}}}, Options{}); err == nil {
		t.Error("a render tokenizer with neither render_urls nor replicas was built")
	}
}

// TestParseRenderResponse: a GenerateRequest's token_ids, or the first of a
// list of them, whatever else the object holds; anything that is not such
// JSON is refused.
func TestParseRenderResponse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []uint32
	}{
		{`{"request_id":"x","token_ids":[1,2,3],"sampling_params":{"stop":["]}"],"n":1},"features":null}`, []uint32{1, 2, 3}},
		{` [ {"token_ids":[7]} , {"token_ids":[8,9]} ] `, []uint32{7}},
		{`{"t\u006fken_ids":[4294967295]}`, []uint32{4294967295}},
		{`{"token_ids":[1],"token_ids":[2]}`, []uint32{2}},
	} {
		got, err := parseRenderResponse([]byte(c.in))
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{``, `{}`, `[]`, `{"token_ids":[]}`, `{"token_ids":null}`, `{"token_ids":[-1]}`, `{"token_ids":[1.5]}`,
		`{"token_ids":[1]`, `{"token_ids":[1]} x`, `[{"token_ids":[1]},]`, `[{"token_ids":[1]}`, `[1]`, `{"a":tru,"token_ids":[1]}`, `"x"`} {
		if got, err := parseRenderResponse([]byte(bad)); err == nil {
			t.Errorf("%s: accepted, %v", bad, got)
		}
	}
}

// refRenderResponse reads a render answer with encoding/json, member by
// member as parseRenderResponse does: the first object of a list, keys
// matched exactly, the last of a repeated token_ids, a null one refused.
func refRenderResponse(b []byte) ([]uint32, error) {
	if !json.Valid(b) {
		return nil, errors.New("invalid JSON")
	}
	first := b
	var list []json.RawMessage
	if json.Unmarshal(b, &list) == nil {
		if len(list) == 0 {
			return nil, errors.New("no object")
		}
		first = list[0]
	}
	dec := json.NewDecoder(bytes.NewReader(first))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("not an object")
	}
	var ids []uint32
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		if tok == "token_ids" {
			if string(bytes.TrimSpace(raw)) == "null" {
				return nil, errors.New("token_ids is null")
			}
			if err := json.Unmarshal(raw, &ids); err != nil {
				return nil, err
			}
		}
	}
	if len(ids) == 0 {
		return nil, errors.New("no token_ids")
	}
	return ids, nil
}

// FuzzParseRenderResponse: the decoder accepts exactly what encoding/json
// reads as the first object's token_ids (keys matched exactly, as vLLM's
// JSON is read; the last of a repeated key), with the same ids.
func FuzzParseRenderResponse(f *testing.F) {
	for _, s := range []string{`{"token_ids":[1,2]}`, `[{"token_ids":[3]},{"x":1}]`, `{"a":{"b":[1,"]"]},"token_ids":[0]}`, `[]`, `{"Token_ids":[1],"token_ids":[2]}`,
		`{"a":{"\q":1},"token_ids":[1]}`, `[{"token_ids":[1]},{"\u12":1}]`, `{"token_ids":[1],"b":[[[]]],"c":-0.5e-7}`, `{"token_ids":null,"token_ids":[1]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := parseRenderResponse(b)
		want, werr := refRenderResponse(b)
		if (err == nil) != (werr == nil) {
			t.Fatalf("%q: parser err %v, encoding/json err %v", b, err, werr)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%q: got %v, encoding/json %v", b, got, want)
		}
	})
}

// TestRefusedInputKeepsTheBreakerClosed: a server that answers a body with
// a 4xx refuses that input, not every input: the next server is not asked
// (it would refuse it too), and however many such bodies come, the
// breaker stays closed, so the requests the server does take are still
// sent to it. A 5xx is the server's failure: the next one is asked.
func TestRefusedInputKeepsTheBreakerClosed(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	first, second := &fakeRender{}, &fakeRender{}
	s1, s2 := httptest.NewServer(first), httptest.NewServer(second)
	defer s1.Close()
	defer s2.Close()
	tok, reg := newRenderTokenizer(t, ModelConfig{Timeout: 10 * time.Second, CacheSize: -1, BreakerFailures: 3, RenderURLs: []string{s1.URL, s2.URL}}, nil)
	ctx := context.Background()
	first.status.Store(http.StatusNotFound) // e.g. previous_response_id the render server has no store for
	for i := range 10 {
		body := []byte(fmt.Sprintf(`{"model":"m","input":"x","previous_response_id":"resp_%d"}`, i))
		got, err := tok.Tokenize(ctx, "m", route.TokenizeInput{Body: body, API: "/v1/responses"})
		if err != nil || got.Source != "approximate:render_remote_error" {
			t.Fatalf("refused body %d: %s, %v", i, got.Source, err)
		}
	}
	if second.calls.Load() != 0 || first.calls.Load() != 10 {
		t.Errorf("calls: first %d, second %d; want 10 and 0", first.calls.Load(), second.calls.Load())
	}
	if n := counterValue(t, reg, "kvroute_tokenizer_breaker_transitions_total", "m", "open"); n != 0 {
		t.Errorf("the breaker opened %v times on refused inputs", n)
	}
	first.status.Store(0)
	if got, err := tok.Tokenize(ctx, "m", route.TokenizeInput{Body: []byte(`{"model":"m","input":"y"}`), API: "/v1/responses"}); err != nil || got.Source != SourceRender {
		t.Errorf("a body the server takes: %s, %v", got.Source, err)
	}
	// A server error: the next server answers.
	first.status.Store(http.StatusInternalServerError)
	if got, err := tok.Tokenize(ctx, "m", route.TokenizeInput{Body: []byte(`{"model":"m","input":"z"}`), API: "/v1/responses"}); err != nil || got.Source != SourceRender || second.calls.Load() != 1 {
		t.Errorf("after a 500: %s, %v, second asked %d times", got.Source, err, second.calls.Load())
	}
}
