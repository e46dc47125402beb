package extproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/openai"
	"github.com/kvroute/kvroute/pkg/respstore"
	"github.com/kvroute/kvroute/pkg/route"
	"github.com/kvroute/kvroute/pkg/tokenize/parsedchat"
)

// phase is where a stream is in the request/response exchange.
type phase uint8

const (
	phaseHeaders  phase = iota // waiting for the request headers
	phaseBody                  // accumulating the request body
	phaseRouted                // pick sent; request flowing upstream
	phaseResponse              // response headers seen
	phaseDone                  // answered by an immediate response, or finished
)

// procStream is the state of one ext_proc stream: one HTTP request as the
// proxy relays it (request headers, body, response). Not to be confused
// with an engine event stream (package events). The request side keeps
// only what routing needs; the decision and the lifecycle handle are the
// only things carried into the response side.
type procStream struct {
	s   *Server
	ctx context.Context

	phase      phase
	modesKnown bool
	reqMode    filterv3.ProcessingMode_BodySendMode
	respMode   filterv3.ProcessingMode_BodySendMode
	answered   bool // an immediate response is no longer possible

	// Request.
	path        string
	contentType string
	session     string
	strip       []string
	carrier     propagation.HeaderCarrier
	subset      []string
	subsetSet   bool
	body        []byte
	span        trace.Span
	spanCtx     context.Context

	// Decision and lifecycle: the router stream's flight (set by decide),
	// or the flight an observer stream claimed.
	fl       *flight
	commit   func()    // the decision's deferred index records (route.Decision.Commit)
	claimed  bool      // this stream observes fl's response
	observer bool      // an observability-mode stream: it never answers
	bodyless bool      // the request had no body to read (headers ended it)
	detached bool      // an observer that stopped at the first token
	stop     bool      // Process ends the stream after this message
	firstAt  time.Time // when the first output was seen

	// Response.
	echo       chunkEcho
	respStatus int
	sse        bool
	parser     openai.StreamParser
	ssePending bool // the last chunk fed to parser ended inside an event
	respBody   []byte
	respOver   bool
	idRead     bool   // the stored response's id was looked for (flight.stored.learn)
	idPrefix   []byte // the response's first bytes, while its id is not in them
	first      bool
	finished   bool
}

func newProcStream(s *Server, ctx context.Context) *procStream {
	return &procStream{
		s: s, ctx: ctx, spanCtx: ctx,
		reqMode: s.cfg.RequestBodyMode, respMode: s.cfg.ResponseBodyMode,
		carrier: propagation.HeaderCarrier{},
	}
}

// handle advances the state machine by one message and returns what to send.
func (st *procStream) handle(req *extprocv3.ProcessingRequest) []*extprocv3.ProcessingResponse {
	if pc := req.GetProtocolConfig(); pc != nil && !st.modesKnown {
		st.reqMode, st.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
	}
	st.modesKnown = true
	if req.GetObservabilityMode() || st.observer {
		st.observer, st.answered = true, true
		st.observe(req)
		return nil
	}
	st.readMetadata(req)
	return st.dispatch(req)
}

func (st *procStream) dispatch(req *extprocv3.ProcessingRequest) []*extprocv3.ProcessingResponse {
	switch v := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.requestHeaders(v.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.requestBody(v.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.requestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return st.responseHeaders(v.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return st.responseBody(v.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.finish()
		return answerRespTrailers
	}
	st.s.metrics.streamErrs.WithLabelValues("protocol").Inc()
	return nil
}

// observe handles one message of an observer stream (Envoy's second
// ext_proc filter, in observability mode: it sends and never waits, and
// ignores answers, so none are sent). The request headers carry the
// decision id, which claims the router stream's flight; the response
// headers, body chunks and trailers then feed the accounting. A stream
// with nothing to observe (no id, a flight of another router replica or
// already claimed) is ended at once, and so is a stream whose response
// has ended: Envoy then sends it nothing more.
func (st *procStream) observe(req *extprocv3.ProcessingRequest) {
	switch v := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if st.fl != nil || st.phase != phaseHeaders {
			return
		}
		st.phase = phaseRouted
		id := headerValue(v.RequestHeaders, DecisionHeader)
		if st.fl = st.s.claimFlight(id); st.fl == nil {
			if id == "" {
				st.s.metrics.observed.WithLabelValues("no_id").Inc()
			} else {
				st.s.metrics.observed.WithLabelValues("unknown").Inc()
			}
			st.stop = true
			return
		}
		st.claimed = true
		st.s.metrics.observed.WithLabelValues("claimed").Inc()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		if !st.claimed {
			st.s.metrics.observed.WithLabelValues("no_id").Inc()
			st.stop = true
			return
		}
		st.responseHeaders(v.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		if st.claimed {
			st.observeBody(v.ResponseBody.GetBody())
			if v.ResponseBody.GetEndOfStream() {
				st.finish()
			} else if st.first && st.sse && st.fl.detach() {
				// Not sampled for usage (Config.UsageSampleEvery): the
				// first token was all this stream had to see; the router
				// stream's close ends the flight. Closing the stream stops
				// the rest of the chunks.
				st.detached, st.stop = true, true
				st.observePrefill()
				return
			}
		}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.finish()
	}
	if st.finished {
		st.stop = true
	}
}

// headerValue is the value of the (lower-case) header name in h, or "".
func headerValue(h *extprocv3.HttpHeaders, name string) string {
	for _, hv := range h.GetHeaders().GetHeaders() {
		if strings.EqualFold(hv.GetKey(), name) {
			if raw := hv.GetRawValue(); len(raw) > 0 {
				return string(raw)
			}
			return hv.GetValue()
		}
	}
	return ""
}

// readMetadata picks the subset hint (request side) and the served
// endpoint (response side) out of the message's metadata context.
func (st *procStream) readMetadata(req *extprocv3.ProcessingRequest) {
	md := req.GetMetadataContext().GetFilterMetadata()
	if md == nil {
		return
	}
	if st.phase < phaseRouted && !st.s.cfg.IgnoreSubsetHint {
		if ns, ok := md[SubsetNamespace]; ok {
			if v, ok := ns.GetFields()[SubsetKey]; ok {
				st.subset, st.subsetSet = subsetList(v), true
			}
		}
	}
	if st.span != nil {
		if v := md[MetadataNamespace].GetFields()[ServedKey]; v != nil {
			st.span.SetAttributes(attribute.String("kvroute.served_endpoint", v.GetStringValue()))
		}
	}
}

func (st *procStream) requestHeaders(h *extprocv3.HttpHeaders) []*extprocv3.ProcessingResponse {
	if st.phase != phaseHeaders {
		st.s.metrics.streamErrs.WithLabelValues("protocol").Inc()
		return nil
	}
	for _, hv := range h.GetHeaders().GetHeaders() {
		name := strings.ToLower(hv.GetKey())
		// The value is copied out of the message only for the headers
		// read below (Envoy sends values as raw bytes).
		val := func() string {
			if raw := hv.GetRawValue(); len(raw) > 0 {
				return string(raw)
			}
			return hv.GetValue()
		}
		switch {
		case name == ":path":
			st.path = val()
		case name == "content-type":
			st.contentType = strings.ToLower(val())
		case name == st.s.cfg.SessionHeader:
			st.session = val()
		}
		if st.s.cfg.isStripped(name) && !slices.Contains(st.strip, name) {
			st.strip = append(st.strip, name)
		}
		if st.s.propFields[name] {
			st.carrier.Set(name, val()) // only what the propagator reads
		}
	}
	slices.Sort(st.strip)
	parent := st.s.cfg.Propagator.Extract(st.ctx, st.carrier)
	st.spanCtx, st.span = st.s.tracer.Start(parent, "kvroute.request",
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("url.path", pathOnly(st.path))))

	noBody := h.GetEndOfStream() || st.reqMode == filterv3.ProcessingMode_NONE ||
		st.reqMode == filterv3.ProcessingMode_STREAMED || st.reqMode == filterv3.ProcessingMode_GRPC
	if noBody {
		// No body to read before the headers must go: route by load alone.
		st.bodyless = true
		p, rej := st.decide(nil)
		if rej != nil {
			return st.reject(*rej)
		}
		st.phase = phaseRouted
		return []*extprocv3.ProcessingResponse{requestHeadersResponse(p)}
	}
	st.phase = phaseBody
	if st.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return nil // hold the headers until the body has been read
	}
	// BUFFERED(_PARTIAL): the proxy waits for this answer before sending the
	// body; strip now, route in the body response.
	return []*extprocv3.ProcessingResponse{requestHeadersResponse(&pick{remove: st.strip})}
}

func (st *procStream) requestBody(b *extprocv3.HttpBody) []*extprocv3.ProcessingResponse {
	duplex := st.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if st.phase != phaseBody {
		// Body after a routing decision (the proxy streams it on): pass it.
		if duplex {
			return []*extprocv3.ProcessingResponse{streamedChunk(b.GetBody(), b.GetEndOfStream(), true)}
		}
		if st.phase == phaseDone {
			return nil
		}
		return []*extprocv3.ProcessingResponse{requestBodyResponse(nil)}
	}
	if len(st.body)+len(b.GetBody()) > st.s.cfg.MaxBodyBytes {
		return st.reject(rejection{code: http.StatusRequestEntityTooLarge, reason: ReasonTooLarge,
			message: fmt.Sprintf("request body exceeds %d bytes (the router's max_body_bytes)", st.s.cfg.MaxBodyBytes)})
	}
	if len(st.body) == 0 && (!duplex || b.GetEndOfStream()) {
		// The whole body in one message (BUFFERED): use the message's own
		// bytes, which nothing else holds, instead of copying them.
		st.body = b.GetBody()
	} else {
		st.body = append(st.body, b.GetBody()...)
	}
	if duplex && !b.GetEndOfStream() {
		return nil
	}
	p, rej := st.decide(st.body)
	if rej != nil {
		return st.reject(*rej)
	}
	st.phase = phaseRouted
	if !duplex {
		return []*extprocv3.ProcessingResponse{requestBodyResponse(p)}
	}
	out := []*extprocv3.ProcessingResponse{requestHeadersResponse(p)}
	out = append(out, streamedBody(st.body, true, true)...)
	st.body = nil
	return out
}

func (st *procStream) requestTrailers() []*extprocv3.ProcessingResponse {
	if st.phase != phaseBody || st.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		if st.phase == phaseDone {
			return nil
		}
		return answerReqTrailers
	}
	// The body ended with trailers instead of an end-of-stream chunk.
	p, rej := st.decide(st.body)
	if rej != nil {
		return st.reject(*rej)
	}
	st.phase = phaseRouted
	out := []*extprocv3.ProcessingResponse{requestHeadersResponse(p)}
	if len(st.body) > 0 {
		out = append(out, streamedBody(st.body, false, true)...)
	}
	st.body = nil
	return append(out, reqTrailersContinue)
}

func (st *procStream) reject(r rejection) []*extprocv3.ProcessingResponse {
	st.phase, st.answered = phaseDone, true
	st.body = nil
	st.s.metrics.rejected(r.code, r.reason)
	if st.span != nil {
		st.span.SetAttributes(attribute.Int("http.response.status_code", r.code), attribute.String("kvroute.reject_reason", r.reason))
		st.span.SetStatus(codes.Error, r.reason)
	}
	r.anthropic = openai.KindOf(st.path) == openai.KindMessages
	return []*extprocv3.ProcessingResponse{immediateResponse(r)}
}

// decide builds the protocol-free request, asks the Decider and turns the
// answer into a pick or a rejection. body is nil when there is none.
func (st *procStream) decide(body []byte) (*pick, *rejection) {
	if st.subsetSet && len(st.subset) == 0 {
		return nil, &rejection{code: http.StatusServiceUnavailable, reason: ReasonSubsetEmpty,
			message: "the proxy's endpoint subset is empty"}
	}
	req := route.Request{SessionKey: st.session}
	if st.subsetSet {
		req.Subset = st.subset
	}
	// A stored response's retrieval or cancellation names it in the path,
	// a continuation in the body (pinID). A Responses body the engine will
	// store (toStore) names the response ownID, or the engine does.
	pinID, _ := openai.StoredResponsePath(st.path)
	toStore, ownID := false, ""
	ctx, cancel := context.WithTimeout(st.spanCtx, st.s.cfg.DecideTimeout)
	defer cancel()
	if st.s.slots != nil && len(body) >= LargeBody {
		// A decision slot (Config.DecideConcurrency), waited for a quarter
		// of the decision's deadline at most: past that the decision goes
		// ahead without one (late beats refused).
		wait := time.NewTimer(st.s.cfg.DecideTimeout / 4)
		select {
		case st.s.slots <- struct{}{}:
			defer func() { <-st.s.slots }()
		case <-wait.C:
			st.s.metrics.slotWaits.Inc()
		case <-ctx.Done():
			wait.Stop()
			st.s.metrics.decideDur.Observe(st.s.cfg.DecideTimeout.Seconds())
			return nil, st.decideError(ctx.Err(), req)
		}
		wait.Stop()
	}
	if len(body) > 0 {
		kind := openai.KindOf(st.path)
		jsonish := st.contentType == "" || strings.Contains(st.contentType, "json")
		switch {
		case kind != openai.KindUnknown && jsonish:
			parsed, err := openai.Parse(st.path, body)
			if err != nil {
				return nil, &rejection{code: http.StatusBadRequest, reason: ReasonBadRequest, message: err.Error()}
			}
			FillRequest(&req, parsed, body)
			if parsed.Kind == openai.KindResponses {
				if parsed.PreviousResponseID != "" {
					pinID = parsed.PreviousResponseID
				}
				toStore, ownID = parsed.Store, parsed.ResponseID
			}
		case jsonish:
			req.Model = openai.Model(body)
		}
	}

	// The decision's time includes the holder's lookup, when it asks the
	// replicas.
	start := time.Now()
	rs := st.s.cfg.Responses
	if rs != nil && pinID != "" {
		var src respstore.Source
		req.Pin, src = rs.Holder(ctx, req.Model, pinID)
		st.span.SetAttributes(attribute.String("kvroute.stored_response.holder", string(src)))
	}

	ctx, span := st.s.tracer.Start(ctx, "kvroute.decide")
	dec, err := st.s.cfg.Decider.Decide(ctx, req)
	if err != nil && errors.Is(err, route.ErrPinUnhealthy) {
		// The holder is not healthy. Had the proxy retried the request that
		// stored the response on another replica, that one holds it.
		if addr, _ := rs.Elsewhere(ctx, req.Model, pinID, req.Pin); addr != "" {
			req.Pin = addr
			dec, err = st.s.cfg.Decider.Decide(ctx, req)
		}
	}
	elapsed := time.Since(start)
	st.s.metrics.decideDur.Observe(elapsed.Seconds())
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.End()
		return nil, st.decideError(err, req)
	}
	st.commit = dec.Commit
	if dec.TokenSource != "" {
		st.s.metrics.tokenize.WithLabelValues(dec.TokenSource).Observe(dec.TokenizeTime.Seconds())
	}
	annotate(span, dec, elapsed)
	span.End()
	st.s.history.add(start, dec)

	replica := string(dec.Replica)
	st.s.metrics.decisions.WithLabelValues(replica, dec.Policy, dec.Reason, dec.Degraded).Inc()
	if v := dec.VouchedBlocks(); v > 0 {
		st.s.metrics.vouched.WithLabelValues(replica).Inc()
	}
	st.span.SetAttributes(attribute.String("kvroute.replica", replica), attribute.String("kvroute.endpoint", dec.Address))
	var life *load.Handle
	switch {
	case dec.Hold != nil: // the router charged its pick (route.Options.Tracker)
		life = dec.Hold
	case st.s.cfg.Tracker != nil:
		life = st.s.cfg.Tracker.Start(replica, dec.PrefillBlocks, dec.PromptBlocks)
	}
	buffered := st.reqMode == filterv3.ProcessingMode_BUFFERED || st.reqMode == filterv3.ProcessingMode_BUFFERED_PARTIAL
	var stored storedResponse
	if rs != nil {
		if dec.Pin != "" {
			stored.pin = pinID
			st.span.SetAttributes(attribute.Bool("kvroute.stored_response.pinned", true))
		}
		if toStore && ownID != "" {
			rs.Stored(ownID, dec.Address) // the engine stores it under the body's request_id
		}
		stored.learn = toStore && ownID == ""
	}
	st.fl = st.s.startFlight(dec, life, st.span, buffered && !st.bodyless, stored)
	return st.pickFor(dec), nil
}

// commitRecords writes the decision's index records, once its answer is
// sent (or the stream ends).
func (st *procStream) commitRecords() {
	if st.commit != nil {
		st.commit()
		st.commit = nil
	}
}

func (st *procStream) decideError(err error, req route.Request) *rejection {
	switch {
	case errors.Is(err, route.ErrPinUnhealthy):
		return &rejection{code: http.StatusServiceUnavailable, reason: ReasonNoReplica, message: "the replica storing the response this request names is not healthy"}
	case errors.Is(err, route.ErrNoReplica):
		if req.Subset != nil {
			return &rejection{code: http.StatusServiceUnavailable, reason: ReasonNoReplica, message: "no eligible replica in the proxy's endpoint subset"}
		}
		return &rejection{code: http.StatusServiceUnavailable, reason: ReasonNoReplica, message: "no healthy replica serves the model"}
	case errors.Is(err, route.ErrUnknownModel):
		return &rejection{code: http.StatusNotFound, reason: ReasonUnknownModel, message: fmt.Sprintf("the model %s does not exist", quoteTruncated(req.Model))}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return &rejection{code: http.StatusServiceUnavailable, reason: ReasonTimeout, message: "routing decision timed out"}
	}
	st.s.cfg.Logger.Error("routing decision failed", "error", err)
	return &rejection{code: http.StatusInternalServerError, reason: ReasonInternal, message: "internal router error"}
}

// FillRequest copies a parsed OpenAI request into the routing request, as
// every ext_proc stream does; the admin explain API uses it too, so that
// explain reproduces real decisions. Batched prompts route by their first
// element. body is the JSON body p was parsed from, which the tokenize
// input carries for an engine's render endpoint (route.TokenizeInput.Body).
func FillRequest(req *route.Request, p openai.Request, body []byte) {
	req.Model, req.CacheSalt, req.MaxTokens, req.Streams = p.Model, p.CacheSalt, p.MaxTokens, p.Stream
	req.BodySession, req.CacheKey, req.User = p.SessionID, p.PromptCacheKey, p.User
	switch p.Kind {
	case openai.KindChat:
		req.Input = route.TokenizeInput{
			Chat: true, Messages: p.Messages, Tools: p.Tools, ChatTemplateKwargs: p.ChatTemplateKwargs,
			AddGenerationPrompt: p.AddGenerationPrompt, ContinueFinalMessage: p.ContinueFinalMessage,
			AddSpecialTokens: p.AddSpecialTokens, ChatMessages: parsedchat.Messages(p.ChatMessages), Documents: p.Documents,
			ReasoningEffort: p.ReasoningEffort, ToolChoice: p.ToolChoice,
		}
	case openai.KindResponses, openai.KindMessages:
		// Converted to the chat request vLLM renders; a body whose prompt
		// cannot be reproduced (p.Convert) routes by its session and load.
		if p.Convert == nil {
			req.Input = route.TokenizeInput{
				Chat: true, Messages: p.Messages, Tools: p.Tools, ChatTemplateKwargs: p.ChatTemplateKwargs,
				AddGenerationPrompt: p.AddGenerationPrompt, ContinueFinalMessage: p.ContinueFinalMessage,
				AddSpecialTokens: p.AddSpecialTokens, SystemFirst: p.SystemFirstMessages, ThinkingDisabled: p.ThinkingDisabled,
				ReasoningEffort: p.ReasoningEffort, ToolChoice: p.ToolChoice,
			}
		}
	case openai.KindCompletion:
		switch {
		case len(p.Prompt.TokenIDs) > 0:
			req.Tokens = p.Prompt.TokenIDs[0]
		case len(p.Prompt.Texts) > 0:
			req.Input = route.TokenizeInput{Prompt: p.Prompt.Texts[0], AddSpecialTokens: p.AddSpecialTokens}
		}
	}
	if req.Tokens == nil {
		req.Input.Body, req.Input.API = body, p.Kind.Path()
	}
}

// pickFor turns a decision into the header mutation and metadata.
func (st *procStream) pickFor(dec route.Decision) *pick {
	cfg := &st.s.cfg
	// The metadata always carries the ordered list (pick first): Envoy's
	// override_host load balancer reads it and moves to the next address on
	// a retry. The header carries the list only when configured, since an
	// ORIGINAL_DST cluster needs a single address there.
	all := dec.Address
	if len(dec.Fallbacks) > 0 {
		all = strings.Join(append([]string{dec.Address}, dec.Fallbacks...), ",")
	}
	dest := dec.Address
	if cfg.FallbacksInDestination {
		dest = all
	}
	p := &pick{remove: st.strip, metadata: destinationMetadata(all)}
	p.set = append(p.set, setHeader(cfg.DestinationHeader, dest), setHeader(DecisionHeader, st.fl.id))
	if !cfg.FallbacksInDestination && len(dec.Fallbacks) > 0 {
		p.set = append(p.set, setHeader(cfg.FallbackHeader, strings.Join(dec.Fallbacks, ",")))
	}
	if sc := trace.SpanContextFromContext(st.spanCtx); sc.IsValid() {
		out := propagation.MapCarrier{}
		cfg.Propagator.Inject(st.spanCtx, out)
		keys := out.Keys()
		slices.Sort(keys)
		for _, k := range keys {
			p.set = append(p.set, setHeader(k, out[k]))
		}
	}
	return p
}

func (st *procStream) responseHeaders(h *extprocv3.HttpHeaders) []*extprocv3.ProcessingResponse {
	st.phase, st.answered = phaseResponse, true
	if !st.claimed && !st.observer {
		// The proxy sends the response on the router stream (a single
		// ext_proc filter): observe it here, unless an observer stream
		// already has.
		st.claimed = st.fl.claim()
	}
	if !st.claimed {
		if h.GetEndOfStream() {
			st.finish()
		}
		return answerRespHeaders
	}
	for _, hv := range h.GetHeaders().GetHeaders() {
		key := hv.GetKey()
		if key != ":status" && !strings.EqualFold(key, "content-type") {
			continue
		}
		val := hv.GetValue()
		if len(hv.GetRawValue()) > 0 {
			val = string(hv.GetRawValue())
		}
		if key == ":status" {
			st.respStatus, _ = strconv.Atoi(val)
		} else {
			st.sse = strings.HasPrefix(strings.ToLower(strings.TrimSpace(val)), "text/event-stream")
		}
	}
	if st.fl.span != nil && st.respStatus != 0 {
		st.fl.span.SetAttributes(attribute.Int("http.response.status_code", st.respStatus))
	}
	if st.respStatus == http.StatusNotFound && st.fl.stored.pin != "" {
		// The holder no longer has it (its engine restarted).
		st.s.cfg.Responses.Lost(st.fl.stored.pin, st.fl.decision.Address)
	}
	if h.GetEndOfStream() {
		st.finish()
	}
	return answerRespHeaders
}

func (st *procStream) responseBody(b *extprocv3.HttpBody) []*extprocv3.ProcessingResponse {
	if st.claimed {
		st.observeBody(b.GetBody())
	}
	if b.GetEndOfStream() {
		st.finish()
	}
	if st.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return st.echo.set(b.GetBody(), b.GetEndOfStream())
	}
	return answerRespBody
}

// chunkEcho is the one response-body answer of a stream in full-duplex
// mode, reused for every chunk: a streamed response is answered chunk by
// chunk, and Process sends (marshals) each answer before it reads the next
// message, so the answer never outlives its chunk. It saves the five
// allocations of a fresh answer per streamed chunk.
type chunkEcho struct {
	out  [1]*extprocv3.ProcessingResponse
	resp extprocv3.ProcessingResponse
	body extprocv3.ProcessingResponse_ResponseBody
	br   extprocv3.BodyResponse
	cr   extprocv3.CommonResponse
	bm   extprocv3.BodyMutation
	sr   extprocv3.BodyMutation_StreamedResponse
	sbr  extprocv3.StreamedBodyResponse
}

func (e *chunkEcho) set(chunk []byte, eos bool) []*extprocv3.ProcessingResponse {
	if e.out[0] == nil {
		e.sr.StreamedResponse = &e.sbr
		e.bm.Mutation = &e.sr
		e.cr.BodyMutation = &e.bm
		e.br.Response = &e.cr
		e.body.ResponseBody = &e.br
		e.resp.Response = &e.body
		e.out[0] = &e.resp
	}
	e.sbr.Body, e.sbr.EndOfStream = chunk, eos
	return e.out[:]
}

// observeBody feeds response bytes to the usage readers and moves the
// request from prefill to decode at its first output.
func (st *procStream) observeBody(chunk []byte) {
	if len(chunk) == 0 || st.finished {
		return
	}
	ok := st.respStatus == 0 || (st.respStatus >= 200 && st.respStatus < 300)
	switch {
	case !ok:
	case st.sse:
		if st.first && !st.ssePending && quietEvents(chunk) {
			break // nothing in it can change what the parser reports
		}
		_, _ = st.parser.Write(chunk)
		st.ssePending = !bytes.HasSuffix(chunk, eventEnd)
	case !st.respOver:
		if len(st.respBody)+len(chunk) > st.s.cfg.MaxResponseBodyBytes {
			st.respOver, st.respBody = true, nil
		} else {
			st.respBody = append(st.respBody, chunk...)
		}
	}
	if ok && st.fl.stored.learn && !st.idRead {
		st.readResponseID(chunk)
	}
	if !st.first && (!st.sse || st.parser.SawContent() || !ok) {
		st.first = true
		st.firstAt = time.Now()
		st.fl.life.FirstToken()
		if st.fl.span != nil {
			st.fl.span.AddEvent("first_token")
		}
	}
}

// maxIDPrefix bounds the response bytes kept while looking for its id.
const maxIDPrefix = 64 << 10

// readResponseID looks for the id the engine stores the response under in
// its first bytes (openai.ResponseID), and records the pick as its holder
// (Config.Responses) once found. A JSON answer's bytes so far are the ones
// observeBody keeps for its usage (respBody); an event stream's, which the
// stream parser does not keep, are kept here until the id is in them.
func (st *procStream) readResponseID(chunk []byte) {
	buf := chunk
	switch {
	case !st.sse:
		buf = st.respBody // chunk included; nil past MaxResponseBodyBytes
	case len(st.idPrefix) > 0:
		st.idPrefix = append(st.idPrefix, chunk...)
		buf = st.idPrefix
	}
	id, more := openai.ResponseID(buf, st.sse)
	if more && len(buf) > 0 && len(buf) < maxIDPrefix {
		if st.sse && len(st.idPrefix) == 0 {
			st.idPrefix = append([]byte(nil), chunk...)
		}
		return
	}
	st.idRead, st.idPrefix = true, nil
	if id != "" {
		st.s.cfg.Responses.Stored(id, st.fl.decision.Address)
	}
}

// eventEnd ends a server-sent event (the blank line after its last field).
var eventEnd = []byte("\n\n")

// quietEvents reports a chunk of whole server-sent events, after the first
// output token, that cannot change the stream parser's answers: it ends on
// an event boundary and carries no usage, no [DONE] and no '\r' (whose
// line endings the parser must see). Given a parser with no partial event
// pending, skipping such a chunk leaves it exactly as feeding it would
// (less its event count). Streamed token chunks are all of this kind, so
// after the first token only the final usage chunk is parsed.
func quietEvents(chunk []byte) bool {
	return bytes.HasSuffix(chunk, eventEnd) && bytes.IndexByte(chunk, '\r') < 0 &&
		!bytes.Contains(chunk, usageKey) && !bytes.Contains(chunk, doneMarker)
}

var (
	// usageKey is the tail of the "usage" key: a rarer first byte than the
	// quote keeps the search on its fast path.
	usageKey   = []byte(`usage"`)
	doneMarker = []byte("[DONE]")
)

// finish ends the response: usage is compared with the prediction and the
// lifecycle released. It runs once.
func (st *procStream) finish() {
	if st.finished {
		return
	}
	st.finished = true
	st.phase = phaseDone
	if !st.claimed {
		return
	}
	defer st.fl.end()
	if st.fl.expired.Load() || (st.respStatus != 0 && (st.respStatus < 200 || st.respStatus > 299)) {
		return
	}
	var (
		u  openai.Usage
		ok bool
	)
	if st.sse {
		st.parser.Flush()
		u, ok = st.parser.Usage()
	} else if len(st.respBody) > 0 {
		u, ok, _ = openai.ParseUsage(st.respBody)
	}
	st.respBody = nil
	if !ok {
		return
	}
	predicted := st.predictedCachedTokens(u.PromptTokens)
	if span := st.fl.span; span != nil {
		span.SetAttributes(
			attribute.Int("kvroute.usage.prompt_tokens", u.PromptTokens),
			attribute.Int("kvroute.usage.completion_tokens", u.CompletionTokens),
			attribute.Int("kvroute.cached_tokens.predicted", predicted))
		if u.HasCachedTokens {
			span.SetAttributes(attribute.Int("kvroute.cached_tokens.served", u.CachedTokens))
		}
	}
	if u.HasCachedTokens && st.s.cfg.Fidelity != nil {
		st.s.cfg.Fidelity.Observe(string(st.fl.decision.Replica), predicted, u.CachedTokens)
	}
	st.observeRates(u, predicted)
}

// observeRates feeds Config.Rates one finished response: its time from
// the pick to the first content token and to the end, and the prompt
// tokens the engine computed (the prompt less the cached tokens it
// reported, or less kvroute's prediction when it reported none). A stream
// that never showed content feeds nothing. A JSON answer arrives whole at
// the end of its generation, so its first bytes time the prefill only
// when it generated at most one token (prefill and that token's step, as a
// stream's first token): only such an answer feeds a sample (its
// prefill, no decode step); a longer one's prefill time is not observable
// (subtracting its output times a learned step would charge the prefill
// with every error of that step, tens of times over).
func (st *procStream) observeRates(u openai.Usage, predicted int) {
	if st.s.cfg.Rates == nil || st.firstAt.IsZero() || (!st.sse && u.CompletionTokens > 1) {
		return
	}
	cached := predicted
	if u.HasCachedTokens {
		cached = u.CachedTokens
	}
	ttft, e2e := st.firstAt.Sub(st.fl.pickedAt), time.Since(st.fl.pickedAt)
	if !st.sse {
		e2e = ttft
	}
	st.s.cfg.Rates.Observe(st.fl.decision.Replica, route.RateSample{
		Uncached:  max(u.PromptTokens-cached, 0),
		Queued:    st.fl.decision.QueuedTokens,
		TTFT:      ttft,
		E2E:       e2e,
		Output:    u.CompletionTokens,
		MaxTokens: st.fl.decision.MaxTokens,
		// A late first token may be a wait for memory.
		MemoryBound: st.fl.decision.Picked().Load.MemoryBound(),
		At:          st.firstAt,
	})
}

// observePrefill feeds Config.Rates the first-token time of a streamed
// response not observed to its end (sampling, Config.UsageSampleEvery), so
// that the learned prefill speed follows every request: its uncached
// prompt tokens are the decision's prompt less the cached tokens kvroute
// predicted (the engine's own count comes only with the usage, at the
// end), and it carries no output, so the decode step is left alone. A
// decision without exact prompt tokens, an error status or an expired
// flight feeds nothing.
func (st *procStream) observePrefill() {
	dec := st.fl.decision
	if st.s.cfg.Rates == nil || st.firstAt.IsZero() || st.fl.expired.Load() || dec.PromptTokens <= 0 ||
		!exactTokens(dec.Degraded) || (st.respStatus != 0 && (st.respStatus < 200 || st.respStatus > 299)) {
		return
	}
	ttft := st.firstAt.Sub(st.fl.pickedAt)
	st.s.cfg.Rates.Observe(dec.Replica, route.RateSample{
		Uncached:    max(dec.PromptTokens-st.predictedCachedTokens(dec.PromptTokens), 0),
		Queued:      dec.QueuedTokens,
		TTFT:        ttft,
		E2E:         ttft,
		MemoryBound: dec.Picked().Load.MemoryBound(),
		At:          st.firstAt,
	})
}

// exactTokens reports whether a decision with this Degraded value counted
// its prompt with the model's tokenizer (not an estimate).
func exactTokens(degraded string) bool {
	switch degraded {
	case route.DegradedTokenizeError, route.DegradedTokenizeTimeout, route.DegradedNoTokenizer,
		route.DegradedApproximate, route.DegradedApproximateIndex:
		return false
	}
	return true
}

// predictedCachedTokens converts the picked replica's matched blocks into
// the cached tokens the engine should report. Engines always recompute
// the prompt's last token, so a full match of a block-aligned prompt shows
// one block less; the prediction is capped accordingly.
func (st *procStream) predictedCachedTokens(promptTokens int) int {
	dec := st.fl.decision
	bs := 0
	if st.s.cfg.BlockSize != nil {
		bs = st.s.cfg.BlockSize(dec.Replica)
	}
	if bs <= 0 && dec.PromptBlocks > 0 {
		bs = dec.PromptTokens / dec.PromptBlocks
	}
	if bs <= 0 {
		return 0
	}
	// Vouched blocks are predicted too (route.ViewGaps): where a replica
	// no longer holds what the router sent it, served hits fall short and
	// the closed loop lowers its credit.
	predicted := (dec.MatchedBlocks() + dec.VouchedBlocks()) * bs
	if promptTokens > 0 {
		predicted = min(predicted, (promptTokens-1)/bs*bs)
	}
	return max(predicted, 0)
}

// close runs when the stream ends on any path. A stream that observed a
// response ends its flight (a no-op when finish already did), marking the
// request span aborted when the response did not end. The router stream
// hands its flight over (flight.routerClosed) and ends the request span
// itself only when there was no decision.
func (st *procStream) close() {
	st.commitRecords()
	if st.claimed && !st.finished && !st.detached {
		if st.fl.span != nil {
			st.fl.span.SetAttributes(attribute.Bool("kvroute.stream_aborted", true))
		}
		st.fl.end()
	}
	if st.observer {
		return
	}
	if st.fl != nil {
		// Envoy keeps a router stream with a buffered request body open
		// until it is done with the request; a body-less or streamed
		// request's stream may be closed as soon as it is routed.
		buffered := st.reqMode == filterv3.ProcessingMode_BUFFERED || st.reqMode == filterv3.ProcessingMode_BUFFERED_PARTIAL
		st.fl.routerClosed(buffered && !st.bodyless)
		return
	}
	if st.span != nil {
		if !st.finished && st.phase != phaseDone {
			st.span.SetAttributes(attribute.Bool("kvroute.stream_aborted", true))
		}
		st.span.End()
	}
}

func pathOnly(p string) string {
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		return p[:i]
	}
	return p
}

// maxEchoBytes bounds a request value quoted back in an error body.
const maxEchoBytes = 128

// quoteTruncated quotes v for an error message, cut to maxEchoBytes (on a
// rune boundary) with its full length noted: a client's 1 MiB model name
// is not sent back whole.
func quoteTruncated(v string) string {
	if len(v) <= maxEchoBytes {
		return fmt.Sprintf("%q", v)
	}
	cut := v[:maxEchoBytes]
	for len(cut) > 0 && !utf8.ValidString(cut) {
		cut = cut[:len(cut)-1]
	}
	return fmt.Sprintf("%q... (%d bytes)", cut, len(v))
}
