package extproc

import (
	"encoding/json"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Builders for the ProcessingResponses the server sends. They are pure and
// deterministic: the same inputs give byte-identical messages.

func setHeader(name, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: name, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// pick is what the request-phase response carries.
type pick struct {
	remove   []string // client headers to strip (sorted)
	set      []*corev3.HeaderValueOption
	metadata *structpb.Struct // envoy.lb destination, nil without a pick
}

func (p *pick) mutation() *extprocv3.HeaderMutation {
	if len(p.remove) == 0 && len(p.set) == 0 {
		return nil
	}
	return &extprocv3.HeaderMutation{SetHeaders: p.set, RemoveHeaders: p.remove}
}

func destinationMetadata(value string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			MetadataDestinationKey: structpb.NewStringValue(value),
		}}),
	}}
}

// requestHeadersResponse answers the request headers, carrying the pick
// when it is known (p.metadata set) or only the stripping otherwise.
func requestHeadersResponse(p *pick) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{
				HeaderMutation:  p.mutation(),
				ClearRouteCache: p.metadata != nil,
			},
		}},
		DynamicMetadata: p.metadata,
	}
}

// requestBodyResponse answers a buffered request body, carrying the pick's
// header mutation (the headers are still held by the proxy in that mode).
func requestBodyResponse(p *pick) *extprocv3.ProcessingResponse {
	r := &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{},
		}},
	}
	if p != nil {
		r.GetRequestBody().Response.HeaderMutation = p.mutation()
		r.GetRequestBody().Response.ClearRouteCache = p.metadata != nil
		r.DynamicMetadata = p.metadata
	}
	return r
}

// streamedBody re-sends body as streamed body mutations of at most
// MaxStreamedChunk bytes; the last carries eos. An empty body is one empty
// chunk.
func streamedBody(body []byte, eos bool, request bool) []*extprocv3.ProcessingResponse {
	var out []*extprocv3.ProcessingResponse
	for first := true; first || len(body) > 0; first = false {
		n := min(len(body), MaxStreamedChunk)
		chunk := body[:n:n]
		body = body[n:]
		out = append(out, streamedChunk(chunk, eos && len(body) == 0, request))
	}
	return out
}

func streamedChunk(chunk []byte, eos bool, request bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: chunk, EndOfStream: eos},
		}},
	}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

// rejection is a request the router answers itself.
type rejection struct {
	code    int
	reason  string
	message string
	// anthropic: the request came on the Anthropic Messages path, whose
	// clients read errors in that API's shape.
	anthropic bool
}

type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

// anthropicErrorBody is the Anthropic Messages API's error shape.
type anthropicErrorBody struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// anthropicErrorType is the Anthropic API's error type for an HTTP status,
// as vLLM's Messages route names them.
func anthropicErrorType(code int) string {
	switch code {
	case 400:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 413:
		return "request_too_large"
	case 429:
		return "rate_limit_error"
	case 503:
		return "overloaded_error"
	}
	if code >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// immediateResponse renders r as a JSON error: OpenAI's shape, or the
// Anthropic API's for a request on its path.
func immediateResponse(r rejection) *extprocv3.ProcessingResponse {
	var body []byte
	if r.anthropic {
		b := anthropicErrorBody{Type: "error"}
		b.Error.Type, b.Error.Message = anthropicErrorType(r.code), r.message
		body, _ = json.Marshal(b) // a struct of strings always marshals
	} else {
		var b errorBody
		b.Error.Message, b.Error.Type, b.Error.Code = r.message, statusText(r.code), r.reason
		body, _ = json.Marshal(b)
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode(r.code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				setHeader("content-type", "application/json"),
				setHeader(ReasonHeader, r.reason),
			}},
			Body:    body,
			Details: "kvroute_" + r.reason + "_" + strconv.Itoa(r.code),
		},
	}}
}
