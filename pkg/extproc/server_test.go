package extproc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/openai"
	"github.com/kvroute/kvroute/pkg/route"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	duplex   = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	buffered = filterv3.ProcessingMode_BUFFERED
	streamed = filterv3.ProcessingMode_STREAMED
)

const chatBody = `{"model":"llama","messages":[{"role":"user","content":"hi"}],"max_tokens":32,"stream":true,"stream_options":{"include_usage":true},"cache_salt":"s"}`

func set(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

func lbMetadata(v string) *structpb.Struct {
	s, _ := structpb.NewStruct(map[string]any{"envoy.lb": map[string]any{"x-gateway-destination-endpoint": v}})
	return s
}

// wantPickHeaders is the request-headers response carrying decision()'s pick.
func wantPickHeaders(remove ...string) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{
					SetHeaders: []*corev3.HeaderValueOption{
						set("x-gateway-destination-endpoint", "10.0.0.1:8000"),
						set(DecisionHeader, anyID),
						set("x-gateway-destination-endpoint-fallback", "10.0.0.2:8000,10.0.0.3:8000"),
					},
					RemoveHeaders: remove,
				},
				ClearRouteCache: true,
			},
		}},
		DynamicMetadata: lbMetadata("10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000"), // the pick, then the fallbacks
	}
}

func wantChunk(body string, eos bool) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
		Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
			Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: []byte(body), EndOfStream: eos}},
		}},
	}}}
}

// anyID stands for the decision id in expected answers: diff checks
// that each answer's id is set and distinct, then compares it as anyID.
const anyID = "<decision id>"

func diff(t *testing.T, want, got []*extprocv3.ProcessingResponse) {
	t.Helper()
	got = slices.Clone(got)
	seen := map[string]bool{}
	for i, r := range got {
		var hm *extprocv3.HeaderMutation
		switch {
		case r.GetRequestHeaders() != nil:
			hm = r.GetRequestHeaders().GetResponse().GetHeaderMutation()
		case r.GetRequestBody() != nil:
			hm = r.GetRequestBody().GetResponse().GetHeaderMutation()
		}
		for j, h := range hm.GetSetHeaders() {
			if h.GetHeader().GetKey() != DecisionHeader {
				continue
			}
			id := string(h.GetHeader().GetRawValue())
			if id == "" || seen[id] {
				t.Errorf("answer %d: decision id %q is empty or repeated", i, id)
			}
			seen[id] = true
			c := proto.Clone(r).(*extprocv3.ProcessingResponse)
			var chm *extprocv3.HeaderMutation
			if c.GetRequestHeaders() != nil {
				chm = c.GetRequestHeaders().GetResponse().GetHeaderMutation()
			} else {
				chm = c.GetRequestBody().GetResponse().GetHeaderMutation()
			}
			chm.SetHeaders[j].Header.RawValue = []byte(anyID)
			got[i] = c
		}
	}
	if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
		t.Errorf("responses mismatch (-want +got):\n%s", d)
	}
}

func TestRequestTranscripts(t *testing.T) {
	chatHeaders := []string{":method", "POST", ":path", "/v1/chat/completions", "content-type", "application/json", "x-session-id", "sess-1"}
	tests := []struct {
		name     string
		cfg      func(*Config)
		msgs     []*extprocv3.ProcessingRequest
		want     []*extprocv3.ProcessingResponse
		wantReqs []route.Request
	}{
		{
			name: "full duplex holds headers until body end",
			msgs: []*extprocv3.ProcessingRequest{
				withMode(reqHeaders(false, chatHeaders...), duplex, duplex),
				reqBody(chatBody[:20], false),
				reqBody(chatBody[20:], true),
			},
			want: []*extprocv3.ProcessingResponse{wantPickHeaders(), wantChunk(chatBody, true)},
			wantReqs: []route.Request{{
				Model: "llama", CacheSalt: "s", MaxTokens: 32, Streams: true, SessionKey: "sess-1",
				Input: route.TokenizeInput{Chat: true, Messages: json.RawMessage(`[{"role":"user","content":"hi"}]`), AddGenerationPrompt: true,
					ChatMessages: []route.ChatMessage{{Role: "user", Content: "hi", Raw: json.RawMessage(`{"role":"user","content":"hi"}`)}}},
			}},
		},
		{
			// The body's identity fields reach the router: the user field,
			// prompt_cache_key and a conversation the body names, from
			// which route.SessionKey derives a key when no header is sent.
			name: "the body's identity fields are routed on",
			msgs: []*extprocv3.ProcessingRequest{
				reqHeaders(false, ":path", "/v1/completions"),
				reqBody(`{"model":"m","prompt":[1,2,3],"user":"alice","prompt_cache_key":"thread-9","metadata":{"conversation_id":"c-4"}}`, true),
			},
			want: []*extprocv3.ProcessingResponse{wantPickHeaders(),
				wantChunk(`{"model":"m","prompt":[1,2,3],"user":"alice","prompt_cache_key":"thread-9","metadata":{"conversation_id":"c-4"}}`, true)},
			wantReqs: []route.Request{{Model: "m", Tokens: []uint32{1, 2, 3}, User: "alice", CacheKey: "thread-9", BodySession: "c-4"}},
		},
		{
			// An assistant turn to continue: the tokenizer cuts the prompt
			// inside it, as the engine does.
			name: "a chat continuing its final message",
			msgs: []*extprocv3.ProcessingRequest{
				reqHeaders(false, ":path", "/v1/chat/completions"),
				reqBody(`{"model":"m","messages":[{"role":"assistant","content":"Sure,"}],"add_generation_prompt":false,"continue_final_message":true}`, true),
			},
			want: []*extprocv3.ProcessingResponse{wantPickHeaders(),
				wantChunk(`{"model":"m","messages":[{"role":"assistant","content":"Sure,"}],"add_generation_prompt":false,"continue_final_message":true}`, true)},
			wantReqs: []route.Request{{Model: "m",
				Input: route.TokenizeInput{Chat: true, ContinueFinalMessage: true,
					Messages:     json.RawMessage(`[{"role":"assistant","content":"Sure,"}]`),
					ChatMessages: []route.ChatMessage{{Role: "assistant", Content: "Sure,", Raw: json.RawMessage(`{"role":"assistant","content":"Sure,"}`)}}}}},
		},
		{
			// A Responses body reaches the router as the chat request vLLM
			// renders for it, with its identity fields.
			name: "a responses body is routed as its chat request",
			msgs: []*extprocv3.ProcessingRequest{
				reqHeaders(false, ":path", "/v1/responses"),
				reqBody(`{"model":"m","instructions":"Be brief.","input":"hi","prompt_cache_key":"thread-9","stream":true,"max_output_tokens":8}`, true),
			},
			want: []*extprocv3.ProcessingResponse{wantPickHeaders(),
				wantChunk(`{"model":"m","instructions":"Be brief.","input":"hi","prompt_cache_key":"thread-9","stream":true,"max_output_tokens":8}`, true)},
			wantReqs: []route.Request{{Model: "m", CacheKey: "thread-9", Streams: true, MaxTokens: 8,
				Input: route.TokenizeInput{Chat: true, AddGenerationPrompt: true, AddSpecialTokens: true,
					Messages: json.RawMessage(`[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}]`)}}},
		},
		{
			// An Anthropic Messages body (Claude Code's shape) reaches the
			// router as the chat request vLLM renders for it: the billing
			// block dropped, Claude Code's session in metadata.user_id a
			// first turn's key (as prompt_cache_key is), the
			// inline system message kept and, for templates that require
			// it, merged; thinking disabled left for the template.
			name: "a messages body is routed as its chat request",
			msgs: []*extprocv3.ProcessingRequest{
				reqHeaders(false, ":path", "/v1/messages"),
				reqBody(`{"model":"m","max_tokens":64,"stream":true,"metadata":{"user_id":"user_ab_account_cd_session_s-1"},"thinking":{"type":"disabled"},`+
					`"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1"},{"type":"text","text":"Be brief."}],`+
					`"messages":[{"role":"user","content":"hi"},{"role":"system","content":"Reminder."},{"role":"user","content":[{"type":"text","text":"go"}]}]}`, true),
			},
			want: []*extprocv3.ProcessingResponse{wantPickHeaders(),
				wantChunk(`{"model":"m","max_tokens":64,"stream":true,"metadata":{"user_id":"user_ab_account_cd_session_s-1"},"thinking":{"type":"disabled"},`+
					`"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1"},{"type":"text","text":"Be brief."}],`+
					`"messages":[{"role":"user","content":"hi"},{"role":"system","content":"Reminder."},{"role":"user","content":[{"type":"text","text":"go"}]}]}`, true)},
			wantReqs: []route.Request{{Model: "m", CacheKey: "s-1", Streams: true, MaxTokens: 64,
				Input: route.TokenizeInput{Chat: true, AddGenerationPrompt: true, ThinkingDisabled: true,
					Messages:    json.RawMessage(`[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"},{"role":"system","content":"Reminder."},{"role":"user","content":"go"}]`),
					SystemFirst: json.RawMessage(`[{"role":"system","content":"Be brief.Reminder."},{"role":"user","content":"hi"},{"role":"user","content":"go"}]`)}}},
		},
		{
			// History stored by the engine: routed by the session alone.
			name: "a responses body continuing stored history has no prompt",
			msgs: []*extprocv3.ProcessingRequest{
				reqHeaders(false, ":path", "/v1/responses"),
				reqBody(`{"model":"m","input":"next","previous_response_id":"resp_1","user":"bob"}`, true),
			},
			want: []*extprocv3.ProcessingResponse{wantPickHeaders(),
				wantChunk(`{"model":"m","input":"next","previous_response_id":"resp_1","user":"bob"}`, true)},
			wantReqs: []route.Request{{Model: "m", User: "bob"}},
		},
		{
			name: "full duplex assumed when the proxy does not announce modes",
			msgs: []*extprocv3.ProcessingRequest{
				reqHeaders(false, ":path", "/v1/completions"),
				reqBody(`{"model":"m","prompt":[1,2,3]}`, true),
			},
			want:     []*extprocv3.ProcessingResponse{wantPickHeaders(), wantChunk(`{"model":"m","prompt":[1,2,3]}`, true)},
			wantReqs: []route.Request{{Model: "m", Tokens: []uint32{1, 2, 3}}},
		},
		{
			name: "buffered answers headers at once and routes in the body response",
			msgs: []*extprocv3.ProcessingRequest{
				withMode(reqHeaders(false, ":path", "/v1/completions", "X-Gateway-Destination-Endpoint", "6.6.6.6:1"), buffered, streamed),
				reqBody(`{"model":"m","prompt":"hello"}`, true),
			},
			want: []*extprocv3.ProcessingResponse{
				{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
					Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{RemoveHeaders: []string{"x-gateway-destination-endpoint"}}},
				}}},
				{
					Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
						Response: &extprocv3.CommonResponse{
							HeaderMutation: &extprocv3.HeaderMutation{
								SetHeaders: []*corev3.HeaderValueOption{
									set("x-gateway-destination-endpoint", "10.0.0.1:8000"),
									set(DecisionHeader, anyID),
									set("x-gateway-destination-endpoint-fallback", "10.0.0.2:8000,10.0.0.3:8000"),
								},
								RemoveHeaders: []string{"x-gateway-destination-endpoint"},
							},
							ClearRouteCache: true,
						},
					}},
					DynamicMetadata: lbMetadata("10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000"), // the pick, then the fallbacks
				},
			},
			wantReqs: []route.Request{{Model: "m", Input: route.TokenizeInput{Prompt: "hello", AddSpecialTokens: true}}},
		},
		{
			name: "client destination headers are removed even when we set the same one",
			msgs: []*extprocv3.ProcessingRequest{
				reqHeaders(false, ":path", "/v1/completions",
					"x-gateway-destination-endpoint", "6.6.6.6:1",
					"X-Gateway-Destination-Endpoint-Fallback", "6.6.6.6:2",
					"x-gateway-destination-endpoint-served", "6.6.6.6:3",
					"x-other", "kept"),
				reqBody(`{"model":"m","prompt":"x"}`, true),
			},
			want: []*extprocv3.ProcessingResponse{
				wantPickHeaders("x-gateway-destination-endpoint", "x-gateway-destination-endpoint-fallback", "x-gateway-destination-endpoint-served"),
				wantChunk(`{"model":"m","prompt":"x"}`, true),
			},
			wantReqs: []route.Request{{Model: "m", Input: route.TokenizeInput{Prompt: "x", AddSpecialTokens: true}}},
		},
		{
			name: "fallbacks folded into the destination value",
			cfg:  func(c *Config) { c.FallbacksInDestination = true; c.DestinationHeader = "X-Pick" },
			msgs: []*extprocv3.ProcessingRequest{reqHeaders(true, ":method", "GET", ":path", "/v1/models")},
			want: []*extprocv3.ProcessingResponse{{
				Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
					Response: &extprocv3.CommonResponse{
						HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
							set("x-pick", "10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000"),
							set(DecisionHeader, anyID),
						}},
						ClearRouteCache: true,
					},
				}},
				DynamicMetadata: lbMetadata("10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000"),
			}},
			wantReqs: []route.Request{{}},
		},
		{
			name: "unknown path routes by load alone, model read leniently",
			msgs: []*extprocv3.ProcessingRequest{
				reqHeaders(false, ":path", "/v1/embeddings", "x-session-id", "abc"),
				reqBody(`{"model":"emb","input":"x"}`, true),
			},
			want:     []*extprocv3.ProcessingResponse{wantPickHeaders(), wantChunk(`{"model":"emb","input":"x"}`, true)},
			wantReqs: []route.Request{{Model: "emb", SessionKey: "abc"}},
		},
		{
			name: "non-JSON body on an inference path routes by load alone",
			msgs: []*extprocv3.ProcessingRequest{
				reqHeaders(false, ":path", "/v1/completions", "content-type", "multipart/form-data; boundary=x"),
				reqBody(`--x--`, true),
			},
			want:     []*extprocv3.ProcessingResponse{wantPickHeaders(), wantChunk(`--x--`, true)},
			wantReqs: []route.Request{{}},
		},
		{
			name:     "request without a body routes at the headers",
			msgs:     []*extprocv3.ProcessingRequest{reqHeaders(true, ":method", "GET", ":path", "/v1/completions")},
			want:     []*extprocv3.ProcessingResponse{wantPickHeaders()},
			wantReqs: []route.Request{{}},
		},
		{
			name: "subset hint restricts the pick",
			msgs: []*extprocv3.ProcessingRequest{
				withSubset(reqHeaders(false, ":path", "/v1/completions"), "10.0.0.1:8000", "10.0.0.3:8000"),
				reqBody(`{"model":"m","prompt":"x"}`, true),
			},
			want:     []*extprocv3.ProcessingResponse{wantPickHeaders(), wantChunk(`{"model":"m","prompt":"x"}`, true)},
			wantReqs: []route.Request{{Model: "m", Input: route.TokenizeInput{Prompt: "x", AddSpecialTokens: true}, Subset: []string{"10.0.0.1:8000", "10.0.0.3:8000"}}},
		},
		{
			name: "subset hint on the body message counts too",
			msgs: []*extprocv3.ProcessingRequest{
				reqHeaders(false, ":path", "/v1/completions"),
				withSubset(reqBody(`{"model":"m","prompt":"x"}`, true), "10.0.0.1:8000"),
			},
			want:     []*extprocv3.ProcessingResponse{wantPickHeaders(), wantChunk(`{"model":"m","prompt":"x"}`, true)},
			wantReqs: []route.Request{{Model: "m", Input: route.TokenizeInput{Prompt: "x", AddSpecialTokens: true}, Subset: []string{"10.0.0.1:8000"}}},
		},
		{
			name: "subset hint ignored when configured",
			cfg:  func(c *Config) { c.IgnoreSubsetHint = true },
			msgs: []*extprocv3.ProcessingRequest{
				withSubset(reqHeaders(true, ":path", "/v1/models")),
			},
			want:     []*extprocv3.ProcessingResponse{wantPickHeaders()},
			wantReqs: []route.Request{{}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fd := &fakeDecider{dec: decision()}
			cfg := Config{Decider: fd}
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			h := newHarness(t, cfg)
			got := h.exchange(tc.msgs...)
			diff(t, tc.want, got)
			reqs := fd.requests()
			checkRenderInput(t, tc.msgs, reqs)
			if d := cmp.Diff(tc.wantReqs, reqs); d != "" {
				t.Errorf("decider requests mismatch (-want +got):\n%s", d)
			}
		})
	}
}

// checkRenderInput checks, and then clears, what each decided request
// carries for a render endpoint: the body as the client sent it and its
// API's path, on every JSON body parsed from an OpenAI-compatible path but
// one routed on the body's token ids (no tokenization).
func checkRenderInput(t *testing.T, msgs []*extprocv3.ProcessingRequest, reqs []route.Request) {
	t.Helper()
	var body []byte
	path, ctype := "", ""
	for _, m := range msgs {
		body = append(body, m.GetRequestBody().GetBody()...)
		for _, h := range m.GetRequestHeaders().GetHeaders().GetHeaders() {
			switch h.GetKey() {
			case ":path":
				path = string(h.GetRawValue()) + h.GetValue()
			case "content-type":
				ctype = string(h.GetRawValue()) + h.GetValue()
			}
		}
	}
	api := openai.KindOf(path).Path()
	isJSON := ctype == "" || strings.Contains(ctype, "json")
	for i := range reqs {
		in := &reqs[i].Input
		want := api != "" && isJSON && len(body) > 0 && reqs[i].Tokens == nil
		if want != (in.Body != nil) || (want && (!bytes.Equal(in.Body, body) || in.API != api)) {
			t.Errorf("request %d (%s): render input %q at %q, want the body at %q: %v", i, path, in.Body, in.API, api, want)
		}
		in.Body, in.API = nil, ""
	}
}

func TestFullDuplexRechunksLargeBody(t *testing.T) {
	prompt := strings.Repeat("abcdefghij", 15_000) // 150,000 bytes
	body := `{"model":"m","prompt":"` + prompt + `"}`
	fd := &fakeDecider{dec: decision()}
	h := newHarness(t, Config{Decider: fd})
	// Arrival chunking unrelated to the 62,000-byte output chunking.
	got := h.exchange(
		reqHeaders(false, ":path", "/v1/completions"),
		reqBody(body[:70_000], false), reqBody(body[70_000:71_000], false), reqBody(body[71_000:], true),
	)
	if len(got) != 4 {
		t.Fatalf("got %d responses, want headers + 3 chunks", len(got))
	}
	diff(t, []*extprocv3.ProcessingResponse{wantPickHeaders()}, got[:1])
	var rebuilt bytes.Buffer
	for i, r := range got[1:] {
		sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			t.Fatalf("chunk %d is not a streamed body mutation: %v", i, r)
		}
		if len(sr.GetBody()) > MaxStreamedChunk {
			t.Errorf("chunk %d has %d bytes > %d", i, len(sr.GetBody()), MaxStreamedChunk)
		}
		if sr.GetEndOfStream() != (i == 2) {
			t.Errorf("chunk %d end_of_stream = %v", i, sr.GetEndOfStream())
		}
		rebuilt.Write(sr.GetBody())
	}
	if rebuilt.String() != body {
		t.Errorf("re-sent body differs from the original (%d vs %d bytes)", rebuilt.Len(), len(body))
	}
	if reqs := fd.requests(); len(reqs) != 1 || reqs[0].Input.Prompt != prompt {
		t.Errorf("decider did not get the whole prompt")
	}
}

func TestFullDuplexBodyEndingWithTrailers(t *testing.T) {
	fd := &fakeDecider{dec: decision()}
	h := newHarness(t, Config{Decider: fd})
	got := h.exchange(
		reqHeaders(false, ":path", "/v1/completions"),
		reqBody(`{"model":"m","prompt":"x"}`, false),
		&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}},
	)
	diff(t, []*extprocv3.ProcessingResponse{
		wantPickHeaders(),
		wantChunk(`{"model":"m","prompt":"x"}`, false),
		{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}},
	}, got)
}

type errorJSON struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

func TestImmediateResponses(t *testing.T) {
	tests := []struct {
		name       string
		cfg        func(*Config)
		decErr     error
		msgs       []*extprocv3.ProcessingRequest
		wantCode   int
		wantReason string
		wantMsg    string
		wantCalls  int
		// anthropic is the error type of an Anthropic-shaped body ("":
		// OpenAI's shape).
		anthropic string
	}{
		{
			name:     "malformed JSON on an inference path",
			msgs:     []*extprocv3.ProcessingRequest{reqHeaders(false, ":path", "/v1/chat/completions"), reqBody(`{"model":`, true)},
			wantCode: 400, wantReason: ReasonBadRequest, wantMsg: "malformed JSON",
		},
		{
			name:     "wrong type on an inference path",
			msgs:     []*extprocv3.ProcessingRequest{reqHeaders(false, ":path", "/v1/completions"), reqBody(`{"model":"m","prompt":"x","max_tokens":"9"}`, true)},
			wantCode: 400, wantReason: ReasonBadRequest, wantMsg: `"max_tokens"`,
		},
		{
			name:     "a responses body without input",
			msgs:     []*extprocv3.ProcessingRequest{reqHeaders(false, ":path", "/v1/responses"), reqBody(`{"model":"m","stream":true}`, true)},
			wantCode: 400, wantReason: ReasonBadRequest, wantMsg: "input is required",
		},
		{
			name:     "malformed JSON on the messages path",
			msgs:     []*extprocv3.ProcessingRequest{reqHeaders(false, ":path", "/v1/messages"), reqBody(`{"model":`, true)},
			wantCode: 400, wantReason: ReasonBadRequest, wantMsg: "malformed JSON", anthropic: "invalid_request_error",
		},
		{
			name:     "no healthy replica on the messages path",
			decErr:   fmt.Errorf("decide: %w", route.ErrNoReplica),
			msgs:     []*extprocv3.ProcessingRequest{reqHeaders(false, ":path", "/v1/messages"), reqBody(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"x"}]}`, true)},
			wantCode: 503, wantReason: ReasonNoReplica, wantMsg: "no healthy replica", wantCalls: 1, anthropic: "overloaded_error",
		},
		{
			name:     "body over the limit",
			cfg:      func(c *Config) { c.MaxBodyBytes = 10 },
			msgs:     []*extprocv3.ProcessingRequest{reqHeaders(false, ":path", "/v1/completions"), reqBody(`{"model":`, false), reqBody(`"m","prompt":"x"}`, true)},
			wantCode: 413, wantReason: ReasonTooLarge, wantMsg: "exceeds 10 bytes",
		},
		{
			name:     "empty subset hint",
			msgs:     []*extprocv3.ProcessingRequest{withSubset(reqHeaders(false, ":path", "/v1/completions")), reqBody(`{"model":"m","prompt":"x"}`, true)},
			wantCode: 503, wantReason: ReasonSubsetEmpty, wantMsg: "subset is empty",
		},
		{
			name:     "no eligible replica in the subset",
			decErr:   fmt.Errorf("decide: %w", route.ErrNoReplica),
			msgs:     []*extprocv3.ProcessingRequest{withSubset(reqHeaders(true, ":path", "/x"), "9.9.9.9:1")},
			wantCode: 503, wantReason: ReasonNoReplica, wantMsg: "subset", wantCalls: 1,
		},
		{
			name:     "no healthy replica",
			decErr:   fmt.Errorf("decide: %w", route.ErrNoReplica),
			msgs:     []*extprocv3.ProcessingRequest{reqHeaders(false, ":path", "/v1/completions"), reqBody(`{"model":"m","prompt":"x"}`, true)},
			wantCode: 503, wantReason: ReasonNoReplica, wantMsg: "no healthy replica", wantCalls: 1,
		},
		{
			name:     "unknown model",
			decErr:   route.ErrUnknownModel,
			msgs:     []*extprocv3.ProcessingRequest{reqHeaders(false, ":path", "/v1/completions"), reqBody(`{"model":"nope","prompt":"x"}`, true)},
			wantCode: 404, wantReason: ReasonUnknownModel, wantMsg: `"nope"`, wantCalls: 1,
		},
		{
			name:     "unexpected decider error",
			decErr:   errors.New("boom"),
			msgs:     []*extprocv3.ProcessingRequest{reqHeaders(true, ":path", "/v1/completions")},
			wantCode: 500, wantReason: ReasonInternal, wantMsg: "internal", wantCalls: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fd := &fakeDecider{dec: decision(), err: tc.decErr}
			cfg := Config{Decider: fd}
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			h := newHarness(t, cfg)
			got := h.exchange(tc.msgs...)
			if len(got) != 1 {
				t.Fatalf("got %d responses, want one immediate response: %v", len(got), got)
			}
			ir := got[0].GetImmediateResponse()
			if ir == nil {
				t.Fatalf("not an immediate response: %v", got[0])
			}
			if ir.GetStatus().GetCode() != typev3.StatusCode(tc.wantCode) {
				t.Errorf("status %v, want %d", ir.GetStatus().GetCode(), tc.wantCode)
			}
			wantHeaders := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				set("content-type", "application/json"), set("x-kvroute-reason", tc.wantReason),
			}}
			if d := cmp.Diff(wantHeaders, ir.GetHeaders(), protocmp.Transform()); d != "" {
				t.Errorf("headers mismatch (-want +got):\n%s", d)
			}
			if tc.anthropic != "" {
				// The Anthropic API's shape, which its SDKs read.
				var body struct {
					Type  string `json:"type"`
					Error struct {
						Type    string `json:"type"`
						Message string `json:"message"`
					} `json:"error"`
				}
				if err := json.Unmarshal(ir.GetBody(), &body); err != nil {
					t.Fatalf("body %q is not JSON: %v", ir.GetBody(), err)
				}
				if body.Type != "error" || body.Error.Type != tc.anthropic || !strings.Contains(body.Error.Message, tc.wantMsg) {
					t.Errorf("error body %s, want type error, error.type %q and message containing %q", ir.GetBody(), tc.anthropic, tc.wantMsg)
				}
			} else {
				var body errorJSON
				if err := json.Unmarshal(ir.GetBody(), &body); err != nil {
					t.Fatalf("body %q is not JSON: %v", ir.GetBody(), err)
				}
				if body.Error.Code != tc.wantReason || body.Error.Type == "" || !strings.Contains(body.Error.Message, tc.wantMsg) {
					t.Errorf("error body %+v, want code %q and message containing %q", body.Error, tc.wantReason, tc.wantMsg)
				}
			}
			if n := len(fd.requests()); n != tc.wantCalls {
				t.Errorf("decider called %d times, want %d", n, tc.wantCalls)
			}
			if v, ok := metricValue(t, h.reg, "kvroute_extproc_immediate_responses_total", map[string]string{"code": fmt.Sprint(tc.wantCode), "reason": tc.wantReason}); !ok || v != 1 {
				t.Errorf("rejection metric = %v (present %v), want 1", v, ok)
			}
		})
	}
}

func TestDecideTimeout(t *testing.T) {
	fd := &fakeDecider{block: true}
	h := newHarness(t, Config{Decider: fd, DecideTimeout: 20_000_000}) // 20ms
	got := h.exchange(reqHeaders(true, ":path", "/v1/completions"))
	if len(got) != 1 || got[0].GetImmediateResponse().GetStatus().GetCode() != 503 {
		t.Fatalf("want a 503 immediate response, got %v", got)
	}
}

func TestPanicIsContained(t *testing.T) {
	fd := &fakeDecider{dec: decision(), panic: true}
	tr, _ := load.NewTracker(nil)
	// A body-less request's router stream may end while the request is in
	// flight: its charge waits for an observer stream, at most ObserverWait.
	h := newHarness(t, Config{Decider: fd, Tracker: tr, ObserverWait: 50 * time.Millisecond})
	got := h.exchange(reqHeaders(false, ":path", "/v1/completions"), reqBody(`{"model":"m","prompt":"x"}`, true))
	if len(got) != 1 || got[0].GetImmediateResponse().GetStatus().GetCode() != 500 {
		t.Fatalf("want one 500 immediate response, got %v", got)
	}
	if v, _ := metricValue(t, h.reg, "kvroute_extproc_stream_errors_total", map[string]string{"kind": "panic"}); v != 1 {
		t.Errorf("panic counter = %v, want 1", v)
	}
	// The server keeps serving.
	fd.mu.Lock()
	fd.panic = false
	fd.mu.Unlock()
	got = h.exchange(reqHeaders(true, ":path", "/v1/models"))
	diff(t, []*extprocv3.ProcessingResponse{wantPickHeaders()}, got)
	eventually(t, "streams closed", func() bool {
		v, _ := metricValue(t, h.reg, "kvroute_extproc_streams_active", nil)
		return v == 0
	})
	eventually(t, "unobserved request released", func() bool { return tr.Get("r1") == (load.InFlight{}) })
	if v, _ := metricValue(t, h.reg, "kvroute_extproc_unobserved_total", nil); v != 1 {
		t.Errorf("unobserved = %v, want 1", v)
	}
}

func TestConfigErrors(t *testing.T) {
	fd := &fakeDecider{}
	for name, cfg := range map[string]Config{
		"no decider":         {},
		"bad header name":    {Decider: fd, DestinationHeader: "x bad"},
		"pseudo header":      {Decider: fd, SessionHeader: ":path"},
		"same headers":       {Decider: fd, DestinationHeader: "a", FallbackHeader: "A"},
		"negative body size": {Decider: fd, MaxBodyBytes: -1},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := New(cfg); err == nil {
				t.Fatal("New accepted a bad config")
			}
		})
	}
}

var _ = context.Background
