package extproc

import (
	"fmt"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the "proto" codec wrapped below
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// codec is the ext_proc server's gRPC codec: protobuf, as gRPC's own, with
// two shortcuts on the per-message path.
//
//   - The constant answers (fixedResponses: "continue" to response
//     headers, each streamed response chunk, trailers) are marshaled once;
//     sending one writes those bytes. A streamed answer sends one of them
//     per chunk.
//   - A large request or response body (aliasMinBytes and up) is read
//     from the received frames with one copy: the message is gathered into
//     a buffer of its own and the HttpBody's bytes point into it, instead
//     of gathering into a pooled buffer and copying the body out again.
//     Anything but a plain body message takes protobuf's path.
type codec struct{}

// Name is the content subtype; "proto" replaces the default codec.
func (codec) Name() string { return "proto" }

// protoCodec is gRPC's protobuf codec, for everything else.
var protoCodec = encoding.GetCodecV2("proto")

// aliasMinBytes: smaller messages take the pooled path (one small copy
// either way).
const aliasMinBytes = 8 << 10

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

// Marshal writes a constant answer's stored bytes, anything else through
// protobuf.
func (codec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*extprocv3.ProcessingResponse); ok {
		if b, ok := fixedWire[r]; ok {
			// SliceBuffer's Free is a no-op: the stored bytes stay ours.
			return mem.BufferSlice{mem.SliceBuffer(b)}, nil
		}
	}
	return protoCodec.Marshal(v)
}

// Unmarshal reads a large body message with one copy (see codec), anything
// else through protobuf.
func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*extprocv3.ProcessingRequest)
	if !ok || data.Len() < aliasMinBytes {
		return protoCodec.Unmarshal(data, v)
	}
	buf := data.Materialize() // a fresh slice nothing else holds
	if unmarshalBody(buf, req) {
		return nil
	}
	return proto.Unmarshal(buf, req)
}

// ProcessingRequest field numbers of the two body messages (the oneof's
// other members take protobuf's path).
const (
	fieldRequestBody  = 4
	fieldResponseBody = 5
)

// unmarshalBody decodes b into req when b is a request or response body
// message, whose HttpBody.body then aliases b; other top-level fields
// (metadata, attributes, protocol configuration) are merged in through
// protobuf. It reports false, leaving req to be decoded from scratch, for
// anything else: another oneof member, two bodies, an unknown HttpBody
// field, malformed bytes.
func unmarshalBody(b []byte, req *extprocv3.ProcessingRequest) bool {
	proto.Reset(req)
	var body *extprocv3.HttpBody
	request := false
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
		case num == fieldRequestBody || num == fieldResponseBody:
			if body != nil || typ != protowire.BytesType {
				return false
			}
			v, _ := protowire.ConsumeBytes(field[n:])
			hb, ok := httpBody(v)
			if !ok {
				return false
			}
			body, request = hb, num == fieldRequestBody
		case num >= 2 && num <= 7: // the oneof's other members
			return false
		default:
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(field, req); err != nil {
				return false
			}
		}
	}
	if body == nil {
		return false
	}
	if request {
		req.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: body}
	} else {
		req.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: body}
	}
	return true
}

// httpBody decodes an HttpBody whose only fields are body (1) and
// end_of_stream (2); body aliases b.
func httpBody(b []byte) (*extprocv3.HttpBody, bool) {
	hb := &extprocv3.HttpBody{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil, false
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
				return nil, false
			}
			hb.EndOfStream = v != 0
			b = b[m:]
		default:
			return nil, false
		}
	}
	return hb, true
}
