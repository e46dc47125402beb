package extproc

import (
	"fmt"
	"math"
	"unicode/utf8"
	"unsafe"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the "proto" codec wrapped below
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// codec is the ext_proc server's gRPC codec: protobuf's wire format, as
// gRPC's own codec, with shortcuts on the per-message path.
//
//   - The constant answers (fixedResponses: "continue" to response
//     headers, each streamed response chunk, trailers) are marshaled once;
//     sending one writes those bytes. A streamed answer sends one of them
//     per chunk.
//   - Other answers (the pick, an immediate response, a re-sent body
//     chunk) are encoded by go-control-plane's generated vtprotobuf code
//     when the build has it (the vtprotobuf build tag), without
//     protobuf's reflection.
//   - A request or response headers or body message is decoded by hand,
//     in one walk over its fields (go-control-plane generates no
//     vtprotobuf decoder). The message is gathered into a buffer of its
//     own, which nothing ever writes to; an HttpBody's bytes and the
//     header keys and values point into it (one copy of a large body
//     instead of two; a headers message's values are allocated together,
//     one array, not a message per header), and the stream's previous
//     body message's wrappers are reused. Anything else takes protobuf's
//     path.
type codec struct{}

// Name is the content subtype; "proto" replaces the default codec.
func (codec) Name() string { return "proto" }

// protoCodec is gRPC's protobuf codec, for everything else.
var protoCodec = encoding.GetCodecV2("proto")

// Constant answers, built once and never modified: handlers return them
// (in the fixed one-element slices) instead of new messages.
var (
	respHeadersContinue = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{},
	}}
	respBodyContinue = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
		ResponseBody: &extprocv3.BodyResponse{},
	}}
	respTrailersContinue = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
		ResponseTrailers: &extprocv3.TrailersResponse{},
	}}
	reqTrailersContinue = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
		RequestTrailers: &extprocv3.TrailersResponse{},
	}}

	// One-element answers; Process only ranges over them.
	answerRespHeaders  = []*extprocv3.ProcessingResponse{respHeadersContinue}
	answerRespBody     = []*extprocv3.ProcessingResponse{respBodyContinue}
	answerRespTrailers = []*extprocv3.ProcessingResponse{respTrailersContinue}
	answerReqTrailers  = []*extprocv3.ProcessingResponse{reqTrailersContinue}

	// fixedWire holds each constant answer's encoding.
	fixedWire = func() map[*extprocv3.ProcessingResponse][]byte {
		m := map[*extprocv3.ProcessingResponse][]byte{}
		for _, r := range []*extprocv3.ProcessingResponse{respHeadersContinue, respBodyContinue, respTrailersContinue, reqTrailersContinue} {
			b, err := proto.Marshal(r)
			if err != nil {
				panic(fmt.Sprintf("extproc: marshal constant answer: %v", err))
			}
			m[r] = b
		}
		return m
	}()
)

// Marshal writes a constant answer's stored bytes; anything else through
// the message's generated vtprotobuf marshaler when the build has it (the
// vtprotobuf build tag compiles go-control-plane's
// *_vtproto.pb.go files in; the Makefile, the image and the test bed build
// with it), else through protobuf. Both write the same wire format; the
// generated one needs no reflection and one allocation, not five, for a
// pick (BenchmarkMarshalAnswer).
func (codec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*extprocv3.ProcessingResponse); ok {
		if b, ok := fixedWire[r]; ok {
			// SliceBuffer's Free is a no-op: the stored bytes stay ours.
			return mem.BufferSlice{mem.SliceBuffer(b)}, nil
		}
	}
	if m, ok := v.(vtMarshaler); ok {
		return marshalVT(m)
	}
	return protoCodec.Marshal(v)
}

// vtMarshaler is what go-control-plane's generated vtprotobuf code adds to
// a message (it generates marshaling and sizing, no unmarshaling).
type vtMarshaler interface {
	SizeVT() int
	MarshalToSizedBufferVTStrict(dAtA []byte) (int, error)
}

// marshalVT encodes m into a buffer of its exact size: a plain slice below
// gRPC's pooling threshold, a pooled one (returned when gRPC has written
// it) above, as gRPC's own protobuf codec does.
func marshalVT(m vtMarshaler) (mem.BufferSlice, error) {
	size := m.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(size) {
		buf := make([]byte, size)
		if _, err := m.MarshalToSizedBufferVTStrict(buf); err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(buf)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if _, err := m.MarshalToSizedBufferVTStrict((*buf)[:size]); err != nil {
		pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// Unmarshal decodes a body or headers message by hand (see codec),
// anything else through protobuf.
func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*extprocv3.ProcessingRequest)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	// A fresh slice nothing else holds: the decoded body and header
	// strings alias it, and gRPC's pooled buffers go back to their pool
	// when Unmarshal returns (TestDecodedMessageOutlivesPooledBuffers).
	buf := data.Materialize()
	if unmarshalFast(buf, req) {
		return nil
	}
	return proto.Unmarshal(buf, req)
}

// ProcessingRequest field numbers of the header and body messages (the
// oneof's trailer members take protobuf's path).
const (
	fieldRequestHeaders  = 2
	fieldResponseHeaders = 3
	fieldRequestBody     = 4
	fieldResponseBody    = 5
	// The trailers members take protobuf's path.
	fieldRequestTrailers  = 6
	fieldResponseTrailers = 7
	// fieldObservabilityMode is ProcessingRequest.observability_mode.
	fieldObservabilityMode = 10
	// fieldProtocolConfig is ProcessingRequest.protocol_config.
	fieldProtocolConfig = 11
)

// unmarshalFast decodes b into req, in one walk over its fields, when b
// is a request or response headers or body message; other top-level
// fields (metadata, attributes, flow control) are merged in through
// protobuf. It reports false, leaving req to be decoded from scratch, for
// anything else: another oneof member, two members, an HttpHeaders,
// HeaderValue or HttpBody field it does not know (the deprecated
// per-message attributes included), malformed bytes.
//
// Strings and bytes alias b (Unmarshal's buffer, fresh for each message
// and never written to): a body costs no copy, a header no allocation of
// its own (the HeaderValue messages of one message share one array).
// The wrappers of req's previous body message, when it held one, are
// reused: a stream decodes each message into the same request and its
// handler keeps nothing of a message but the body bytes, which are new
// each time.
func unmarshalFast(b []byte, req *extprocv3.ProcessingRequest) bool {
	prev := req.Request
	proto.Reset(req)
	var (
		hh     *headersMessage
		body   *extprocv3.HttpBody
		member protowire.Number // the oneof member seen
	)
	for rest := b; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 {
			return false
		}
		m := protowire.ConsumeFieldValue(num, typ, rest[n:])
		if m < 0 {
			return false
		}
		field := rest[:n+m]
		rest = rest[n+m:]
		switch {
		case num >= fieldRequestHeaders && num <= fieldResponseBody:
			if member != 0 || typ != protowire.BytesType {
				return false
			}
			member = num
			v, _ := protowire.ConsumeBytes(field[n:])
			if num <= fieldResponseHeaders {
				if hh = decodeHTTPHeaders(v); hh == nil {
					return false
				}
			} else {
				body = reusedBody(prev, num == fieldRequestBody)
				if !decodeHTTPBody(v, body) {
					return false
				}
			}
		case num == fieldRequestTrailers || num == fieldResponseTrailers:
			return false
		case num == fieldObservabilityMode && typ == protowire.VarintType:
			// Every message of an observer stream carries it.
			v, _ := protowire.ConsumeVarint(field[n:])
			req.ObservabilityMode = v != 0
		case num == fieldProtocolConfig && typ == protowire.BytesType && req.ProtocolConfig == nil:
			// The first message of every stream carries it.
			v, _ := protowire.ConsumeBytes(field[n:])
			if pc, ok := decodeProtocolConfig(v); ok {
				req.ProtocolConfig = pc
				break
			}
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(field, req); err != nil {
				return false
			}
		default:
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(field, req); err != nil {
				return false
			}
		}
	}
	if req.Request != nil {
		return false // a oneof member this decoder does not know, merged above
	}
	switch member {
	case fieldRequestHeaders:
		hh.reqWrap.RequestHeaders = &hh.hh
		req.Request = &hh.reqWrap
	case fieldResponseHeaders:
		hh.respWrap.ResponseHeaders = &hh.hh
		req.Request = &hh.respWrap
	case fieldRequestBody:
		if p, ok := prev.(*extprocv3.ProcessingRequest_RequestBody); ok && p.RequestBody == body {
			req.Request = p
		} else {
			req.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: body}
		}
	case fieldResponseBody:
		if p, ok := prev.(*extprocv3.ProcessingRequest_ResponseBody); ok && p.ResponseBody == body {
			req.Request = p
		} else {
			req.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: body}
		}
	default:
		return false
	}
	return true
}

// reusedBody is the HttpBody of prev (the request's previous message)
// when it was a body of the same direction, cleared; else a new one.
func reusedBody(prev any, request bool) *extprocv3.HttpBody {
	var hb *extprocv3.HttpBody
	switch p := prev.(type) {
	case *extprocv3.ProcessingRequest_RequestBody:
		if request {
			hb = p.RequestBody
		}
	case *extprocv3.ProcessingRequest_ResponseBody:
		if !request {
			hb = p.ResponseBody
		}
	}
	if hb == nil {
		return &extprocv3.HttpBody{}
	}
	proto.Reset(hb)
	return hb
}

// decodeHTTPBody decodes into hb an HttpBody whose only fields are body
// (1) and end_of_stream (2); the body aliases b.
func decodeHTTPBody(b []byte, hb *extprocv3.HttpBody) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return false
			}
			if len(v) > 0 {
				hb.Body = v[:len(v):len(v)]
			} else {
				hb.Body = nil
			}
			b = b[m:]
		case num == 2 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return false
			}
			hb.EndOfStream = v != 0
			b = b[m:]
		default:
			return false
		}
	}
	return true
}

// headersMessage is a decoded headers message's wrappers, allocated
// together.
type headersMessage struct {
	hh       extprocv3.HttpHeaders
	hm       corev3.HeaderMap
	reqWrap  extprocv3.ProcessingRequest_RequestHeaders
	respWrap extprocv3.ProcessingRequest_ResponseHeaders
}

// decodeProtocolConfig decodes a ProtocolConfiguration (its three varint
// fields); ok is false for anything else.
func decodeProtocolConfig(b []byte) (*extprocv3.ProtocolConfiguration, bool) {
	pc := &extprocv3.ProtocolConfiguration{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.VarintType || num < 1 || num > 3 {
			return nil, false
		}
		v, m := protowire.ConsumeVarint(b[n:])
		if m < 0 || v > math.MaxInt32 {
			return nil, false
		}
		b = b[n+m:]
		switch num {
		case 1:
			pc.RequestBodyMode = filterv3.ProcessingMode_BodySendMode(v)
		case 2:
			pc.ResponseBodyMode = filterv3.ProcessingMode_BodySendMode(v)
		case 3:
			pc.SendBodyWithoutWaitingForHeaderResponse = v != 0
		}
	}
	return pc, true
}

// decodeHTTPHeaders decodes an HttpHeaders whose fields are headers (1, a
// HeaderMap of HeaderValues: key 1, value 2, raw_value 3) and
// end_of_stream (3); nil for anything else. Strings alias b.
func decodeHTTPHeaders(b []byte) *headersMessage {
	msg := &headersMessage{}
	hh := &msg.hh
	var mapBytes []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType && mapBytes == nil:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil
			}
			mapBytes = v[:len(v):len(v)]
			b = b[m:]
		case num == 3 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return nil
			}
			hh.EndOfStream = v != 0
			b = b[m:]
		default:
			return nil
		}
	}
	if mapBytes == nil {
		return msg
	}
	// Count the HeaderValues first, to allocate them at once.
	count := 0
	for rest := mapBytes; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 || num != 1 || typ != protowire.BytesType {
			return nil
		}
		_, m := protowire.ConsumeBytes(rest[n:])
		if m < 0 {
			return nil
		}
		rest = rest[n+m:]
		count++
	}
	values := make([]corev3.HeaderValue, count)
	hm := &msg.hm
	hm.Headers = make([]*corev3.HeaderValue, count)
	for i, rest := 0, mapBytes; len(rest) > 0; i++ {
		_, _, n := protowire.ConsumeTag(rest)
		v, m := protowire.ConsumeBytes(rest[n:])
		rest = rest[n+m:]
		hv := &values[i]
		if !decodeHeaderValue(v, hv) {
			return nil
		}
		hm.Headers[i] = hv
	}
	hh.Headers = hm
	return msg
}

// decodeHeaderValue decodes a HeaderValue (key 1, value 2, raw_value 3)
// into hv, its strings and bytes aliasing b.
func decodeHeaderValue(b []byte, hv *corev3.HeaderValue) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType || num < 1 || num > 3 {
			return false
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return false
		}
		b = b[n+m:]
		switch num {
		case 1:
			if !utf8.Valid(v) {
				return false // protobuf's decoder refuses it too
			}
			hv.Key = unsafe.String(unsafe.SliceData(v), len(v))
		case 2:
			if !utf8.Valid(v) {
				return false
			}
			hv.Value = unsafe.String(unsafe.SliceData(v), len(v))
		case 3:
			if len(v) > 0 {
				hv.RawValue = v[:len(v):len(v)]
			} else {
				hv.RawValue = nil
			}
		}
	}
	return true
}
