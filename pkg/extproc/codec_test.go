package extproc

import (
	"bytes"
	"context"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// The constant answers go out as the bytes protobuf gives for equal fresh
// messages; anything else is marshaled normally.
func TestCodecMarshalsConstantAnswers(t *testing.T) {
	fresh := map[*extprocv3.ProcessingResponse]*extprocv3.ProcessingResponse{
		respHeadersContinue: {Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}},
		respBodyContinue:    {Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}},
		respTrailersContinue: {Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}},
		reqTrailersContinue: {Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}},
	}
	if len(fresh) != len(fixedWire) {
		t.Fatalf("%d constant answers, test covers %d", len(fixedWire), len(fresh))
	}
	for fixed, want := range fresh {
		got, err := codec{}.Marshal(fixed)
		if err != nil {
			t.Fatal(err)
		}
		wb, _ := proto.Marshal(want)
		if !bytes.Equal(got.Materialize(), wb) || len(wb) == 0 {
			t.Errorf("%v: codec wrote %x, protobuf %x", want, got.Materialize(), wb)
		}
		got.Free()
		// The stored bytes survive the transport freeing what it sent.
		again, _ := codec{}.Marshal(fixed)
		if !bytes.Equal(again.Materialize(), wb) {
			t.Errorf("%v: stored bytes changed after Free", want)
		}
	}
	// An equal message that is not one of the constants: protobuf's path.
	other := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{
		Response: &extprocv3.CommonResponse{ClearRouteCache: true}}}}
	got, err := codec{}.Marshal(other)
	if err != nil {
		t.Fatal(err)
	}
	var back extprocv3.ProcessingResponse
	if err := proto.Unmarshal(got.Materialize(), &back); err != nil || !proto.Equal(&back, other) {
		t.Fatalf("round trip: %v, %v", &back, err)
	}
}

func bodyRequest(request bool, body []byte, eos bool) *extprocv3.ProcessingRequest {
	hb := &extprocv3.HttpBody{Body: body, EndOfStream: eos}
	if request {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: hb}}
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: hb}}
}

// split cuts b into several buffers, as gRPC hands over a message that
// arrived in several HTTP/2 frames.
func split(b []byte, n int) mem.BufferSlice {
	var out mem.BufferSlice
	for len(b) > 0 {
		k := min(n, len(b))
		out = append(out, mem.SliceBuffer(bytes.Clone(b[:k])))
		b = b[k:]
	}
	return out
}

// Every message decodes as protobuf decodes it, whether or not it takes
// the aliasing path.
func TestCodecUnmarshalMatchesProtobuf(t *testing.T) {
	big := []byte(strings.Repeat(`{"role":"user","content":"hello"},`, 2000))
	withMeta := bodyRequest(true, big, true)
	withMeta.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		SubsetNamespace: {Fields: map[string]*structpb.Value{SubsetKey: structpb.NewStringValue("10.0.0.1:8000")}}}}
	withMeta.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED,
		ResponseBodyMode: filterv3.ProcessingMode_STREAMED}
	withMeta.ObservabilityMode = true
	headers := reqHeaders(false, ":path", "/v1/chat/completions", "x-big", string(big))
	cases := map[string]*extprocv3.ProcessingRequest{
		"request body":          bodyRequest(true, big, true),
		"response body":         bodyRequest(false, big, false),
		"body with metadata":    withMeta,
		"small body":            bodyRequest(false, []byte("data: x\n\n"), false),
		"observer chunk":        obs(bodyRequest(false, []byte("data: x\n\n"), false)),
		"empty body":            bodyRequest(true, nil, true),
		"large request headers": headers,
		"request headers, metadata and modes": withMode(withSubset(reqHeaders(false, ":path", "/v1/chat/completions",
			"content-type", "application/json", "x-session-id", "s1", "", ""), "10.0.0.1:8000"),
			filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_NONE),
		"observer request headers": obs(reqHeaders(false, DecisionHeader, "abc.1.xyz")),
		"response headers":         respHeaders(false, ":status", "200", "content-type", "text/event-stream"),
		"response headers, eos":    respHeaders(true, ":status", "204"),
		"no headers":               reqHeaders(true),
		"value field, not raw":     {Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: "a", Value: "b"}, {Key: "c", RawValue: []byte("d")}}}}}},
	}
	for name, msg := range cases {
		t.Run(name, func(t *testing.T) {
			wire, err := proto.Marshal(msg)
			if err != nil {
				t.Fatal(err)
			}
			want := new(extprocv3.ProcessingRequest)
			if err := proto.Unmarshal(wire, want); err != nil {
				t.Fatal(err)
			}
			// Decode into a message holding an earlier one: nothing of it may remain.
			got := reqHeaders(true, "stale", "header")
			got.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"stale": {}}}
			if err := (codec{}).Unmarshal(split(wire, 16384), got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("codec decoded\n%v\nprotobuf decoded\n%v", got, want)
			}
		})
	}
}

// A large body aliases the decoded message's buffer; anything unusual
// falls back to protobuf's decoding.
func TestUnmarshalBodyAliasesAndFallsBack(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 20_000)
	wire, _ := proto.Marshal(bodyRequest(false, body, true))
	req := new(extprocv3.ProcessingRequest)
	if !unmarshalFast(wire, req) {
		t.Fatal("plain body message not decoded")
	}
	got := req.GetResponseBody().GetBody()
	if len(got) != len(body) || !req.GetResponseBody().GetEndOfStream() {
		t.Fatalf("body %d bytes eos %v", len(got), req.GetResponseBody().GetEndOfStream())
	}
	i := bytes.Index(wire, body)
	wire[i] = 'y'
	if got[0] != 'y' {
		t.Fatal("body was copied, not aliased")
	}
	if cap(got) != len(got) {
		t.Fatalf("aliased body has spare capacity %d: an append could overwrite the buffer", cap(got)-len(got))
	}

	// An observer's chunk (observability_mode set) takes the shortcut too.
	owire, _ := proto.Marshal(obs(bodyRequest(false, body, false)))
	oreq := new(extprocv3.ProcessingRequest)
	if !unmarshalFast(owire, oreq) || !oreq.GetObservabilityMode() || len(oreq.GetResponseBody().GetBody()) != len(body) {
		t.Fatalf("observer chunk not decoded by the shortcut: %v", oreq.GetObservabilityMode())
	}

	unknown := protowire.AppendTag(nil, 3, protowire.VarintType)
	unknown = protowire.AppendVarint(unknown, 1)
	hb := append(protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), body), unknown...)
	twoBodies, _ := proto.Marshal(bodyRequest(true, body, false))
	twoBodies = append(twoBodies, twoBodies...)
	headersAndBody, _ := proto.Marshal(reqHeaders(false, ":path", "/"))
	headersAndBody = append(headersAndBody, wire...)
	for name, b := range map[string][]byte{
		"unknown HttpBody field": protowire.AppendBytes(protowire.AppendTag(nil, fieldRequestBody, protowire.BytesType), hb),
		"two bodies":             twoBodies,
		"headers and body":       headersAndBody,
		"truncated":              wire[:len(wire)-10],
	} {
		if unmarshalFast(b, new(extprocv3.ProcessingRequest)) {
			t.Errorf("%s: decoded by the shortcut", name)
		}
		// The codec still decodes it exactly as protobuf does (or fails as it does).
		want, got := new(extprocv3.ProcessingRequest), new(extprocv3.ProcessingRequest)
		werr := proto.Unmarshal(b, want)
		gerr := codec{}.Unmarshal(split(b, 1<<20), got)
		if (werr == nil) != (gerr == nil) || (werr == nil && !proto.Equal(got, want)) {
			t.Errorf("%s: codec %v / %v, protobuf %v / %v", name, got, gerr, want, werr)
		}
	}
}

// After the first token, chunks of whole quiet events are not parsed, and
// the usage that follows them (whole, or split across chunks) is still read.
func TestQuietChunksSkippedUsageStillRead(t *testing.T) {
	srv, err := New(Config{Decider: &fakeDecider{dec: decision()}})
	if err != nil {
		t.Fatal(err)
	}
	token := `data: {"choices":[{"index":0,"delta":{"content":" tok"}}]}` + "\n\n"
	usage := `data: {"choices":[],"usage":{"prompt_tokens":80,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":48}}}` + "\n\n"
	for name, chunks := range map[string][]string{
		"whole":                 {token, token + token, token, usage, "data: [DONE]\n\n"},
		"split after usage key": {token, token, usage[:40], usage[40:] + "data: [DONE]\n\n"},
		"split before usage":    {token, token[:20], token[20:] + usage[:10], usage[10:], "data: [DONE]\n\n"},
		"usage key then quiet":  {token, token + usage[:len(usage)-20], usage[len(usage)-20:], token},
	} {
		t.Run(name, func(t *testing.T) {
			st := newProcStream(srv, context.Background())
			defer st.close()
			st.handle(withMode(reqHeaders(true, ":path", "/v1/chat/completions"), filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED))
			st.handle(respHeaders(false, ":status", "200", "content-type", "text/event-stream"))
			events := 0
			for _, c := range chunks {
				if out := st.handle(respBody(c, false)); len(out) != 1 || out[0] != respBodyContinue {
					t.Fatalf("chunk %q answered %v", c, out)
				}
				events += strings.Count(c, "\n\n")
			}
			u, ok := st.parser.Usage()
			if !ok || u.PromptTokens != 80 || u.CompletionTokens != 3 || u.CachedTokens != 48 {
				t.Fatalf("usage %+v %v", u, ok)
			}
			if !st.first {
				t.Fatal("first token not seen")
			}
			if name == "whole" && st.parser.Events() >= events {
				t.Fatalf("parser saw %d of %d events: quiet chunks were parsed", st.parser.Events(), events)
			}
		})
	}
}

// A stream decodes every message into one request: consecutive body
// messages reuse its wrappers, and the earlier bodies' bytes stay intact.
func TestCodecReusesBodyWrappers(t *testing.T) {
	req := new(extprocv3.ProcessingRequest)
	decode := func(m *extprocv3.ProcessingRequest) {
		t.Helper()
		wire, _ := proto.Marshal(m)
		if err := (codec{}).Unmarshal(split(wire, 7), req); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(req, m) {
			t.Fatalf("decoded %v, want %v", req, m)
		}
	}
	decode(bodyRequest(false, []byte("data: one\n\n"), false))
	first, wrapper := req.GetResponseBody().GetBody(), req.Request
	decode(bodyRequest(false, []byte("data: two\n\n"), true))
	if req.Request != wrapper {
		t.Error("the second chunk's wrappers were not reused")
	}
	if string(first) != "data: one\n\n" {
		t.Fatalf("the first chunk's bytes changed to %q", first)
	}
	decode(bodyRequest(true, []byte("{}"), true)) // the other direction: new wrappers
	if req.Request == wrapper {
		t.Error("a request body reused a response body's wrapper")
	}
	decode(respHeaders(false, ":status", "200"))
	decode(bodyRequest(false, nil, true))
}

// Whatever bytes arrive, the codec decodes them exactly as protobuf does,
// or fails where protobuf fails; decoding into a message that held an
// earlier body (the stream's reused wrappers) changes nothing.
func FuzzCodecUnmarshal(f *testing.F) {
	body := []byte(`data: {"choices":[{"delta":{"content":"x"}}]}` + "\n\n")
	for _, m := range []*extprocv3.ProcessingRequest{
		bodyRequest(true, body, true),
		bodyRequest(false, body, false),
		bodyRequest(false, nil, true),
		reqHeaders(false, ":path", "/v1/chat/completions"),
		withMode(obs(reqHeaders(true, DecisionHeader, "a.1.b", "", "")), filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED),
		respHeaders(false, ":status", "200", "content-type", "text/event-stream"),
		withSubset(reqHeaders(false, ":path", "/", "x-session-id", "s"), "10.0.0.1:8000"),
		{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		// The same message with a field this decoder does not know.
		f.Add(protowire.AppendVarint(protowire.AppendTag(bytes.Clone(b), 99, protowire.VarintType), 7))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want := new(extprocv3.ProcessingRequest)
		werr := proto.Unmarshal(b, want)
		for _, into := range []*extprocv3.ProcessingRequest{new(extprocv3.ProcessingRequest), bodyRequest(false, []byte("stale"), false), bodyRequest(true, []byte("stale"), true), reqHeaders(true, "stale", "h")} {
			gerr := codec{}.Unmarshal(split(bytes.Clone(b), 7), into)
			if (werr == nil) != (gerr == nil) {
				t.Fatalf("codec error %v, protobuf error %v", gerr, werr)
			}
			if werr == nil && !proto.Equal(into, want) {
				t.Fatalf("codec decoded\n%v\nprotobuf decoded\n%v", into, want)
			}
		}
	})
}

// A plain headers message takes the shortcut: its header values alias the
// message's buffer; anything unusual falls back to protobuf's decoding
// (and decodes exactly as protobuf decodes it, or fails as it does).
func TestUnmarshalHeadersAliasesAndFallsBack(t *testing.T) {
	msg := withMode(reqHeaders(false, ":path", "/v1/chat/completions", "content-type", "application/json"),
		filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_NONE)
	wire, _ := proto.Marshal(msg)
	req := new(extprocv3.ProcessingRequest)
	if !unmarshalFast(wire, req) {
		t.Fatal("plain headers message not decoded")
	}
	if !proto.Equal(req, msg) {
		t.Fatalf("decoded %v, want %v", req, msg)
	}
	raw := req.GetRequestHeaders().GetHeaders().GetHeaders()[0].GetRawValue()
	wire[bytes.Index(wire, []byte("/v1/chat"))] = '!'
	if raw[0] != '!' {
		t.Fatal("raw value was copied, not aliased")
	}
	if cap(raw) != len(raw) {
		t.Fatalf("aliased value has spare capacity %d", cap(raw)-len(raw))
	}

	// A top-level field it does not know (a newer Envoy's) is merged in
	// through protobuf, kept as unknown, and the shortcut still applies.
	newer := protowire.AppendVarint(protowire.AppendTag(bytes.Clone(wire), 99, protowire.VarintType), 7)
	nreq := new(extprocv3.ProcessingRequest)
	if !unmarshalFast(newer, nreq) {
		t.Fatal("headers message with an unknown top-level field not decoded by the shortcut")
	}
	if nwant := new(extprocv3.ProcessingRequest); proto.Unmarshal(newer, nwant) != nil || !proto.Equal(nreq, nwant) {
		t.Fatalf("decoded %v, protobuf decodes %v", nreq, nwant)
	}

	hv := func(fields ...byte) []byte { // a HeaderMap with one HeaderValue of the given raw fields
		return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), fields)
	}
	inHeaders := func(hhFields []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, fieldRequestHeaders, protowire.BytesType), hhFields)
	}
	headerMapField := func(m []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), m)
	}
	keyA := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "a")
	unknownHV := append(append([]byte{}, keyA...), protowire.AppendVarint(protowire.AppendTag(nil, 4, protowire.VarintType), 1)...)
	badKey := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte{0xff, 0xfe})
	// HttpHeaders' deprecated attributes map (field 2): one entry "x" -> {}.
	entry := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "x")
	entry = protowire.AppendBytes(protowire.AppendTag(entry, 2, protowire.BytesType), nil)
	attrs := inHeaders(protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), entry))
	twoHeaders := append(append([]byte{}, wire...), wire...)
	body, _ := proto.Marshal(bodyRequest(true, []byte("{}"), true))
	trailers, _ := proto.Marshal(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
		RequestTrailers: &extprocv3.HttpTrailers{}}})
	for name, b := range map[string][]byte{
		"unknown HeaderValue field": inHeaders(headerMapField(hv(unknownHV...))),
		"invalid UTF-8 key":         inHeaders(headerMapField(hv(badKey...))),
		"per-message attributes":    attrs,
		"two headers members":       twoHeaders,
		"headers and body":          append(append([]byte{}, wire...), body...),
		"trailers":                  trailers,
		"truncated":                 wire[:len(wire)-3],
	} {
		if unmarshalFast(b, new(extprocv3.ProcessingRequest)) {
			t.Errorf("%s: decoded by the shortcut", name)
		}
		want, got := new(extprocv3.ProcessingRequest), new(extprocv3.ProcessingRequest)
		werr := proto.Unmarshal(b, want)
		gerr := codec{}.Unmarshal(split(b, 1<<20), got)
		if (werr == nil) != (gerr == nil) || (werr == nil && !proto.Equal(got, want)) {
			t.Errorf("%s: codec %v / %v, protobuf %v / %v", name, got, gerr, want, werr)
		}
	}
}

// BenchmarkDecodeHeaders decodes the request headers message a router
// stream gets from Envoy (a dozen headers), with the codec and with
// protobuf's decoder.
func BenchmarkDecodeHeaders(b *testing.B) {
	msg := withMode(reqHeaders(false, ":authority", "127.0.0.1:10000", ":path", "/v1/chat/completions", ":method", "POST",
		":scheme", "http", "user-agent", "Go-http-client/1.1", "content-length", "1024", "content-type", "application/json",
		"accept-encoding", "gzip", "x-forwarded-proto", "http", "x-request-id", "6f1c6b52-62a4-4b9e-9a4c-2b1f2d8c0e11",
		"x-envoy-expected-rq-timeout-ms", "15000", "x-session-id", "session-42"),
		filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_NONE)
	wire, _ := proto.Marshal(msg)
	b.Run("codec", func(b *testing.B) {
		b.ReportAllocs()
		req := new(extprocv3.ProcessingRequest)
		for b.Loop() {
			if err := (codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("protobuf", func(b *testing.B) {
		b.ReportAllocs()
		req := new(extprocv3.ProcessingRequest)
		for b.Loop() {
			if err := proto.Unmarshal(bytes.Clone(wire), req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// poisonPool is a mem.BufferPool that overwrites every buffer returned to
// it, as reuse by another message would.
type poisonPool struct{}

func (poisonPool) Get(n int) *[]byte { b := make([]byte, n); return &b }
func (poisonPool) Put(b *[]byte) {
	for i := range *b {
		(*b)[i] = 0xAA
	}
}

// The decoded body and header strings alias the codec's own copy of the
// message, never gRPC's pooled receive buffers: after gRPC frees them
// (Unmarshal has returned) and they are overwritten, while another
// goroutine reads the decoded message (the race detector watches), the
// request still reads what was sent.
func TestDecodedMessageOutlivesPooledBuffers(t *testing.T) {
	body := []byte(strings.Repeat(`{"role":"user","content":"hello"},`, 500))
	for name, msg := range map[string]*extprocv3.ProcessingRequest{
		"body":    bodyRequest(true, body, true),
		"headers": reqHeaders(false, ":path", "/v1/chat/completions", "x-session-id", "session-42"),
	} {
		t.Run(name, func(t *testing.T) {
			wire, _ := proto.Marshal(msg)
			var data mem.BufferSlice
			for rest := wire; len(rest) > 0; {
				k := min(4096, len(rest))
				buf := poisonPool{}.Get(k)
				copy(*buf, rest[:k])
				data = append(data, mem.NewBuffer(buf, poisonPool{}))
				rest = rest[k:]
			}
			got := new(extprocv3.ProcessingRequest)
			if err := (codec{}).Unmarshal(data, got); err != nil {
				t.Fatal(err)
			}
			done := make(chan bool)
			go func() { done <- proto.Equal(got, msg) }()
			data.Free() // gRPC's recv does this once Unmarshal returns
			if !<-done || !proto.Equal(got, msg) {
				t.Fatalf("decoded message changed when gRPC's buffers were reused: %v", got)
			}
		})
	}
}
