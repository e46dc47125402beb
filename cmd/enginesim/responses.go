package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/kvroute/kvroute/pkg/openai"
)

// responses serves POST /v1/responses as vLLM does for a model without the
// harmony format: the body is converted into the chat request vLLM renders
// for it (openai.ParseResponsesTurn), which then runs exactly as a chat
// completion does (chat template, add_special_tokens true as vLLM
// tokenizes a Responses prompt, max_output_tokens or the rest of the
// context, sampling), and the answer is a Responses object or event stream
// named by the body's request_id (else "resp_" and 32 hex digits). With the
// response store (store.go) a request with store true is kept, one with
// previous_response_id continues a stored response, and one with
// background true runs in the background (background.go); without it
// previous_response_id is 404 and background 400.
func (s *server) responses(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, 64<<20))
	if err != nil {
		writeError(w, badRequest("", "invalid body: %v", err))
		return
	}
	p, err := openai.ParseResponsesTurn(body)
	if err != nil {
		writeError(w, badRequest("", "%s", strings.TrimPrefix(err.Error(), openai.ErrInvalidRequest.Error()+": ")))
		return
	}
	if p.Background && !p.Store {
		// vLLM's request model refuses it (validate_background).
		writeError(w, &apiError{status: http.StatusBadRequest, typ: "Bad Request", param: "background",
			msg: "background can only be used when `store` is true"})
		return
	}
	// The sampling fields the conversion does not carry.
	var sample struct {
		Temperature *float64 `json:"temperature"`
		Seed        *int64   `json:"seed"`
	}
	if err := json.Unmarshal(body, &sample); err != nil {
		writeError(w, badRequest("", "invalid JSON body: %v", err))
		return
	}
	model, lora, err := s.resolveModel(&p.Model)
	if err != nil {
		writeError(w, err)
		return
	}
	msgs, err := s.responsesPrompt(isRendering(r.Context()), &p)
	if err != nil {
		writeError(w, err)
		return
	}
	req := genRequest{
		Model: &p.Model, Messages: msgs, Stream: p.Stream, Temperature: sample.Temperature, Seed: sample.Seed,
		AddSpecialTokens: &p.AddSpecialTokens, AddGenerationPrompt: &p.AddGenerationPrompt,
		ContinueFinalMessage: p.ContinueFinalMessage, Tools: p.Tools, ChatTemplateKwargs: p.ChatTemplateKwargs,
		responseID: p.ResponseID, previousID: p.PreviousResponseID, keep: p.Store && s.store != nil,
		background: p.Background,
	}
	if p.ReasoningEffort != "" {
		req.ReasoningEffort = &p.ReasoningEffort
	}
	if p.MaxTokens > 0 {
		req.MaxCompletionTokens = &p.MaxTokens
	}
	if p.CacheSalt != "" {
		req.CacheSalt = &p.CacheSalt
	}
	s.run(w, r, &req, apiResponses, model, lora)
}

// responsesPrompt is the chat a parsed Responses request is rendered from,
// checked in vLLM's order: background mode without the store (refused),
// then the stored response previous_response_id names (404 when unknown;
// a queued background response is known, its output still empty), then
// the input's conversion (400 when vLLM refuses it). A render endpoint
// (rendering) refuses previous_response_id, as vLLM's stateless one does,
// and does not look at background.
func (s *server) responsesPrompt(rendering bool, p *openai.Request) ([]chatMessage, error) {
	switch {
	case rendering && p.PreviousResponseID != "":
		return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "previous_response_id",
			msg: "previous_response_id is not supported by the stateless render endpoint."}
	case !rendering && p.Background && s.store == nil:
		return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "background",
			msg: "This vLLM engine does not support `store=True` and therefore does not support the background mode. " +
				"To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server."}
	}
	convertErr := func() error {
		return badRequest("input", "%s", strings.TrimPrefix(p.Convert.Error(), openai.ErrResponsesUnsupported.Error()+": "))
	}
	if p.PreviousResponseID != "" {
		prev := s.store.get(p.PreviousResponseID)
		switch {
		case prev == nil:
			return nil, responseNotFound(p.PreviousResponseID)
		case p.Turn == nil:
			return nil, convertErr()
		}
		return continued(p.Turn, prev)
	}
	if p.Convert != nil {
		return nil, convertErr()
	}
	var msgs []chatMessage
	if err := json.Unmarshal(p.Messages, &msgs); err != nil {
		return nil, badRequest("input", "input converts to invalid chat messages: %v", err)
	}
	return msgs, nil
}

// startResponse names a Responses generation (its id the request's
// request_id, else a new one; its message item's id) and, when the request
// is to be stored, has it keep the response with the chat it was rendered
// from.
func (g *generation) startResponse(req *genRequest) {
	g.id, g.msgID, g.previousID = req.responseID, randomID("msg_"), req.previousID
	if g.id == "" {
		g.id = randomID("resp_")
	}
	if req.keep {
		msgs := req.Messages
		g.keep = func(o *responseObject) { g.s.store.put(o, msgs) }
	}
}

// finalResponse is the finished response, kept in the store first when the
// request is to be stored (as vLLM stores it before it answers).
func (g *generation) finalResponse() *responseObject {
	o := g.responseObject()
	if g.keep != nil {
		g.keep(o)
	}
	return o
}

// responseObject is a Responses API response.
type responseObject struct {
	ID                 string             `json:"id"`
	Object             string             `json:"object"`
	CreatedAt          int64              `json:"created_at"`
	Model              string             `json:"model"`
	Status             string             `json:"status"`
	IncompleteDetails  *incompleteDetails `json:"incomplete_details"`
	Output             []outputMessage    `json:"output"`
	ParallelToolCalls  bool               `json:"parallel_tool_calls"`
	ToolChoice         string             `json:"tool_choice"`
	Tools              []any              `json:"tools"`
	MaxOutputTokens    int                `json:"max_output_tokens"`
	PreviousResponseID *string            `json:"previous_response_id"`
	Usage              *responsesUsage    `json:"usage"`
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

type outputMessage struct {
	ID      string       `json:"id"`
	Type    string       `json:"type"`
	Role    string       `json:"role"`
	Status  string       `json:"status"`
	Content []outputText `json:"content"`
}

type outputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

type responsesUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// responseObject is the request's response: in progress (nothing out yet)
// until its prompt has finished, then complete with its output and usage.
// The cached tokens are always reported, as vLLM reports them here.
func (g *generation) responseObject() *responseObject {
	o := &responseObject{
		ID: g.id, Object: "response", CreatedAt: g.created, Model: g.model, Status: "in_progress",
		Output: []outputMessage{}, ParallelToolCalls: true, ToolChoice: "auto", Tools: []any{},
		MaxOutputTokens: g.reqs[0].MaxTokens,
	}
	if g.previousID != "" {
		o.PreviousResponseID = &g.previousID
	}
	f := g.fins[0]
	if f == nil {
		return o
	}
	o.Status = "completed"
	if f.Reason == "length" {
		o.Status = "incomplete"
		o.IncompleteDetails = &incompleteDetails{Reason: "max_output_tokens"}
	}
	o.Output = []outputMessage{g.outputMessage("completed")}
	u := &responsesUsage{InputTokens: len(g.reqs[0].Prompt), OutputTokens: f.OutputTokens}
	u.InputTokensDetails.CachedTokens = f.CachedTokens
	u.TotalTokens = u.InputTokens + u.OutputTokens
	o.Usage = u
	return o
}

// outputMessage is the answer's message item: empty while in progress,
// with the whole text once completed.
func (g *generation) outputMessage(status string) outputMessage {
	m := outputMessage{ID: g.msgID, Type: "message", Role: "assistant", Status: status, Content: []outputText{}}
	if status == "completed" {
		m.Content = []outputText{g.outputText()}
	}
	return m
}

func (g *generation) outputText() outputText {
	return outputText{Type: "output_text", Text: string(g.texts[0]), Annotations: []any{}}
}

// Streamed events: every one has its type and sequence number; those about
// the message item name it, and those about its text the content part.
type (
	eventHeader struct {
		Type           string `json:"type"`
		SequenceNumber int    `json:"sequence_number"`
	}
	responseEvent struct {
		eventHeader
		Response *responseObject `json:"response"`
	}
	itemEvent struct {
		eventHeader
		OutputIndex int           `json:"output_index"`
		Item        outputMessage `json:"item"`
	}
	partRef struct {
		ItemID       string `json:"item_id"`
		OutputIndex  int    `json:"output_index"`
		ContentIndex int    `json:"content_index"`
	}
	partEvent struct {
		eventHeader
		partRef
		Part outputText `json:"part"`
	}
	deltaEvent struct {
		eventHeader
		partRef
		Delta    string `json:"delta"`
		Logprobs []any  `json:"logprobs"`
	}
	textDoneEvent struct {
		eventHeader
		partRef
		Text     string `json:"text"`
		Logprobs []any  `json:"logprobs"`
	}
)

// nextText waits for the next token of a one-sequence generation (the
// Responses and Messages streams) and returns its text, kept in g.texts;
// done when the sequence finished (g.fins[0] then set), ok false when the
// client went away.
func (g *generation) nextText() (text string, done, ok bool) {
	it, ok := g.next()
	if !ok {
		return "", false, false
	}
	if it.fin != nil {
		g.fins[0] = it.fin
		return "", true, true
	}
	g.emitted++
	text = g.s.tokenText(it.tok.Token)
	g.texts[0] = append(g.texts[0], text...)
	return text, false, true
}

// startEvents answers 200 with an event stream's headers and returns the
// writer's flush (a no-op on a writer that cannot flush).
func startEvents(w http.ResponseWriter) func() {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	return func() {
		if fl != nil {
			fl.Flush()
		}
	}
}

// streamResponse streams the Responses events (responseEvents) to the
// client. False when the client went away.
func (g *generation) streamResponse() bool {
	flush := startEvents(g.w)
	write := func(ev []byte) bool {
		_, err := g.w.Write(ev)
		return err == nil
	}
	return g.responseEvents(write, flush)
}

// responseEvents makes the Responses events, each "event: T\ndata:
// {...}\n\n" passed to write: response.created and response.in_progress
// at once; the message item and its text part when the first token exists
// (a client times the first token from them); a response.output_text.delta
// per token; then the done events of the text, part and item, and
// response.completed with the whole response (response.incomplete for one
// cut short, as vLLM 0.33 ends it). The stream has no [DONE] line. flush
// is called when the events so far should reach the client (after a token
// only when no other is waiting). False when write failed or the
// generation's context ended before the request did.
func (g *generation) responseEvents(write func([]byte) bool, flush func()) bool {
	seq := 0
	header := func(typ string) eventHeader {
		seq++
		return eventHeader{Type: typ, SequenceNumber: seq - 1}
	}
	send := func(typ string, ev func(eventHeader) any) bool {
		b, err := json.Marshal(ev(header(typ)))
		if err != nil {
			return false
		}
		return write(fmt.Appendf(nil, "event: %s\ndata: %s\n\n", typ, b))
	}
	ref := partRef{ItemID: g.msgID}
	started := false
	start := func() bool {
		started = true
		return send("response.output_item.added", func(h eventHeader) any {
			return itemEvent{eventHeader: h, Item: g.outputMessage("in_progress")}
		}) && send("response.content_part.added", func(h eventHeader) any {
			return partEvent{eventHeader: h, partRef: ref, Part: outputText{Type: "output_text", Annotations: []any{}}}
		})
	}
	for _, typ := range []string{"response.created", "response.in_progress"} {
		if !send(typ, func(h eventHeader) any { return responseEvent{eventHeader: h, Response: g.responseObject()} }) {
			return false
		}
	}
	flush()
	for {
		text, done, ok := g.nextText()
		if !ok {
			return false
		}
		if done {
			break
		}
		if !started && !start() {
			return false
		}
		if !send("response.output_text.delta", func(h eventHeader) any {
			return deltaEvent{eventHeader: h, partRef: ref, Delta: text, Logprobs: []any{}}
		}) {
			return false
		}
		if len(g.sink.ch) == 0 {
			flush()
		}
	}
	// The request is done in the engine: a client that goes away from here
	// on has nothing left to abort.
	if !started && !start() {
		return true
	}
	// The response is stored (finalResponse) once the events before the
	// last are out, as vLLM stores it after its processor's events and
	// before response.completed.
	_ = send("response.output_text.done", func(h eventHeader) any {
		return textDoneEvent{eventHeader: h, partRef: ref, Text: string(g.texts[0]), Logprobs: []any{}}
	}) && send("response.content_part.done", func(h eventHeader) any {
		return partEvent{eventHeader: h, partRef: ref, Part: g.outputText()}
	}) && send("response.output_item.done", func(h eventHeader) any {
		return itemEvent{eventHeader: h, Item: g.outputMessage("completed")}
	}) && func() bool {
		// vLLM ends a response cut short (max_output_tokens, the context's
		// end) with response.incomplete, any other with response.completed.
		final := g.finalResponse()
		terminal := "response.completed"
		if final.Status == "incomplete" {
			terminal = "response.incomplete"
		}
		return send(terminal, func(h eventHeader) any { return responseEvent{eventHeader: h, Response: final} })
	}()
	flush()
	return true
}
