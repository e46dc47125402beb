package main

import (
	"context"
	"net/http"
	"sync"

	"github.com/kvroute/kvroute/pkg/engine"
)

// vLLM 0.33's Responses API background mode (entrypoints/openai/responses/
// serving.py), with the response store on: a request with background true
// (and store true) is stored as a "queued" response (no output, usage
// null) and run by a task of the server's, not the request's. Not
// streamed, the queued response is the answer, at once; streamed, the
// task keeps the response's events (its event_store) and the answer is
// those events, replayed from the first and followed until the response
// ends. The client going away stops only its replay: the request runs on.
// The stored response stays queued while the request runs (vLLM stores
// no in_progress status; its stream's events say in_progress) and is
// replaced by the final response when it ends (status incomplete with
// the simulator, which always stops on length), unless it was cancelled:
// POST /v1/responses/{id}/cancel marks a queued response cancelled,
// cancels the task (the request is aborted in the engine, its KV blocks
// freed as a client's disconnect frees them) and answers the cancelled
// response. GET /v1/responses/{id}?stream=true replays a streamed
// background response's events after starting_after and follows them.
//
// Differences from vLLM: a replay (POST or GET) of a cancelled streamed
// response ends after the events made until the cancellation, and one
// that starts after the last event of a finished response ends at once
// (vLLM's waits for events that never come). A failed background request
// (vLLM's status "failed") cannot happen: the simulated engine does not
// fail. On shutdown every background request is aborted.

// backgroundRuns owns the goroutines of background responses (vLLM's
// background_tasks): each one's run is registered (prepare) and then
// started (launch); it ends when its request ends or its context is
// cancelled (the response's cancel, its store entry dropped or replaced,
// or close). close cancels them all and joins them.
type backgroundRuns struct {
	ctx    context.Context
	stop   context.CancelFunc
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// bgRun is one background response's run: cancel ends its context, done
// is closed when its goroutine has ended (its request then finished or
// aborted in the engine).
type bgRun struct {
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

func newBackgroundRuns() *backgroundRuns {
	ctx, stop := context.WithCancel(context.Background())
	return &backgroundRuns{ctx: ctx, stop: stop}
}

// prepare registers a run, which the caller must then launch; false once
// the runs are closed.
func (b *backgroundRuns) prepare() (*bgRun, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, false
	}
	ctx, cancel := context.WithCancel(b.ctx)
	b.wg.Add(1)
	return &bgRun{ctx: ctx, cancel: cancel, done: make(chan struct{})}, true
}

// launch runs f with r's context in a goroutine of its own.
func (b *backgroundRuns) launch(r *bgRun, f func(context.Context)) {
	go func() {
		defer b.wg.Done()
		defer close(r.done)
		defer r.cancel()
		f(r.ctx)
	}()
}

// close refuses new runs, cancels the running ones and waits until they
// have ended.
func (b *backgroundRuns) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.stop()
	b.wg.Wait()
}

// eventLog is a streamed background response's events as sent ("event:
// T\ndata: {...}\n\n" each), kept for the request's own answer and for
// later GETs with stream=true (vLLM's event_store). It is safe for
// concurrent use: one writer appends, then ends it; followers read.
type eventLog struct {
	mu      sync.Mutex
	events  [][]byte
	ended   bool
	changed chan struct{} // closed at the next append or end
}

func newEventLog() *eventLog { return &eventLog{changed: make(chan struct{})} }

// append adds one event; always true (the writer of responseEvents).
func (l *eventLog) append(ev []byte) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, ev)
	close(l.changed)
	l.changed = make(chan struct{})
	return true
}

// end marks the log complete: no event follows.
func (l *eventLog) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ended {
		l.ended = true
		close(l.changed)
	}
}

// since returns the events from index from on, whether the log has ended
// (then they are the last), and a channel closed at the next change.
func (l *eventLog) since(from int) (evs [][]byte, ended bool, changed <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if from < len(l.events) {
		evs = l.events[from:len(l.events):len(l.events)]
	}
	return evs, l.ended, l.changed
}

// follow answers with an event stream: the log's events from index from
// on, as they come, until the log ends or the client goes away.
func follow(w http.ResponseWriter, r *http.Request, l *eventLog, from int) {
	flush := startEvents(w)
	flush()
	for {
		evs, ended, changed := l.since(from)
		for _, ev := range evs {
			if _, err := w.Write(ev); err != nil {
				return
			}
		}
		from += len(evs)
		if len(evs) > 0 {
			flush()
		}
		if ended {
			return
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		}
	}
}

// errShuttingDown answers a background request that comes while the
// server shuts down.
var errShuttingDown = &apiError{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError",
	msg: "The server is shutting down."}

// runBackground submits a background Responses request (prepared reqs,
// one prompt), stores its queued response with the chat it was rendered
// from and starts its run; it answers the queued response or, streamed,
// the run's events.
func (s *server) runBackground(w http.ResponseWriter, r *http.Request, req *genRequest, reqs []engine.Request, model string) {
	sk, ids, err := s.submitAll(reqs)
	if err != nil {
		writeError(w, badRequest("", "%v", err))
		return
	}
	run, ok := s.bg.prepare()
	if !ok {
		s.d.abort(ids)
		writeError(w, errShuttingDown)
		return
	}
	g := s.newGeneration(run.ctx, nil, apiResponses, model, reqs, sk)
	g.startResponse(req)
	queued := g.responseObject()
	queued.Status = "queued"
	var events *eventLog
	if req.Stream {
		events = newEventLog()
	}
	el := s.store.add(&storeEntry{id: g.id, storedResponse: storedResponse{resp: queued, messages: req.Messages, events: events}, run: run})
	g.keep = func(o *responseObject) { s.store.finish(el, o) }
	s.bg.launch(run, func(context.Context) {
		var done bool
		if events != nil {
			defer events.end()
			done = g.responseEvents(events.append, func() {})
		} else if done = g.gather(); done {
			g.finalResponse()
		}
		if !done {
			s.d.abort(ids)
		}
	})
	if events == nil {
		writeJSON(w, http.StatusOK, queued)
		return
	}
	follow(w, r, events, 0)
}
