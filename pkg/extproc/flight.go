package extproc

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/route"
)

// flight is one routed request from its decision to the end of its
// response: what the response side needs (the decision, the load charge,
// the request span, the pick time). The router stream makes it and
// registers it under its decision id (DecisionHeader); the stream that
// sees the response claims it, once: the observer stream (a second,
// observability-mode ext_proc filter that Envoy never waits for) or, with
// a proxy that sends the response on the router stream itself, that
// stream. The claimer ends the flight at the response's end or its own
// end. A flight nobody claims ends ObserverWait after the decision, once
// the router stream has ended (its charge is released as soon as the
// router stream ends when that marks the request's end: a buffered request
// body keeps the router stream open until Envoy is done with the request).
// A flight also stops counting as load at MaxRequestLifetime.
type flight struct {
	s        *Server
	id       string
	decision route.Decision
	life     *load.Handle
	span     trace.Span // the request span, ended with the flight; may be nil
	pickedAt time.Time
	timer    *time.Timer // lifetime, then the unclaimed deadline
	expired  atomic.Bool // MaxRequestLifetime passed: no feedback any more

	// stored tells the response side of the Responses API's store: see
	// storedResponse.
	stored storedResponse

	// endsWithRouter: Envoy closes the router stream only when it is done
	// with the request (a buffered body), so that close is the request's
	// end. full: the observer follows this response to its end (usage,
	// cached tokens, learned speeds); otherwise, with endsWithRouter, it
	// stops at the first token (Config.UsageSampleEvery).
	endsWithRouter, full bool

	mu         sync.Mutex
	claimed    bool
	detached   bool // the observer stopped at the first token
	routerDone bool
	routerEnd  time.Time // when the router stream ended
	ended      bool
}

// storedResponse is what a flight's response side does for the Responses
// API's store (Config.Responses): learn reads the id the engine names the
// response with from its first bytes and records the pick as its holder;
// pin is the stored response the request was pinned for, forgotten at the
// holder when it answers 404 for it.
type storedResponse struct {
	learn bool
	pin   string
}

// flights is the registry of a server's flights, by decision id. A
// sync.Map: streams insert and delete disjoint keys concurrently, which
// it serves without a common lock.
type flights struct {
	m      sync.Map // id -> *flight
	prefix string   // this process's id prefix
	seq    atomic.Uint64
	n      atomic.Int64
	// lastFull: per replica (index.ReplicaID), when its last flight
	// sampled in full started (unix nanoseconds, *atomic.Int64); one entry
	// per replica ever routed to.
	lastFull sync.Map
}

// sampleFull reports whether the flight numbered n, routed to replica at
// now, is observed to its end (Config.UsageSampleEvery and
// UsageSampleInterval): every one when every is 1, else one in every by
// count, and one whenever none of the replica's started in the last
// interval. A replica's first flight starts its interval (it is not sampled
// for being first).
func (f *flights) sampleFull(replica index.ReplicaID, now time.Time, n uint64, every int, interval time.Duration) bool {
	if every <= 1 {
		return true
	}
	t := now.UnixNano()
	v, ok := f.lastFull.Load(replica)
	if !ok {
		v, ok = f.lastFull.LoadOrStore(replica, new(atomic.Int64))
		if !ok {
			v.(*atomic.Int64).Store(t)
		}
	}
	last := v.(*atomic.Int64)
	if n%uint64(every) == 0 {
		last.Store(t)
		return true
	}
	prev := last.Load()
	return t-prev >= int64(interval) && last.CompareAndSwap(prev, t)
}

func newFlights() *flights {
	return &flights{prefix: strconv.FormatUint(rand.Uint64()&0xffffffff, 36) + "."}
}

// nextID is a decision id unique in this process (a counter) and not
// guessable by a client (a random part): an observer stream naming a
// flight it did not see routed cannot release another request's charge.
func (f *flights) nextID() (string, uint64) {
	n := f.seq.Add(1)
	b := make([]byte, 0, 32)
	b = append(b, f.prefix...)
	b = strconv.AppendUint(b, n, 36)
	b = append(b, '.')
	b = strconv.AppendUint(b, rand.Uint64(), 36)
	return string(b), n
}

// start registers a new flight and arms its lifetime.
func (s *Server) startFlight(dec route.Decision, life *load.Handle, span trace.Span, endsWithRouter bool, stored storedResponse) *flight {
	id, n := s.flights.nextID()
	now := time.Now()
	fl := &flight{s: s, id: id, decision: dec, life: life, span: span, pickedAt: now, endsWithRouter: endsWithRouter, stored: stored,
		full: s.flights.sampleFull(dec.Replica, now, n, s.cfg.UsageSampleEvery, s.cfg.UsageSampleInterval)}
	s.flights.m.Store(fl.id, fl)
	s.flights.n.Add(1)
	s.metrics.flights.Inc()
	fl.mu.Lock() // the timer's function reads fl.timer under the lock
	fl.timer = time.AfterFunc(s.cfg.MaxRequestLifetime, fl.onTimer)
	fl.mu.Unlock()
	return fl
}

// claimFlight takes the flight of a decision id for the response side, or
// nil when there is none in this process (another router replica's, one
// already claimed or ended, a forged id).
func (s *Server) claimFlight(id string) *flight {
	v, ok := s.flights.m.Load(id)
	if !ok {
		return nil
	}
	fl := v.(*flight)
	if !fl.claim() {
		return nil
	}
	return fl
}

func (fl *flight) claim() bool {
	if fl == nil {
		return false
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.claimed || fl.ended {
		return false
	}
	fl.claimed = true
	return true
}

// routerClosed runs when the router stream ends. requestEnded says that
// its end is the request's end (Envoy closes a stream with a buffered
// request body only when it is done with the request).
func (fl *flight) routerClosed(requestEnded bool) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.routerDone || fl.ended {
		return
	}
	fl.routerDone, fl.routerEnd = true, time.Now()
	if fl.claimed {
		if fl.detached {
			fl.endLocked(false) // the request's end; its observer stopped at the first token
		}
		return // else the claimer ends it
	}
	if requestEnded {
		fl.life.Done()
	}
	wait := fl.s.cfg.ObserverWait - time.Since(fl.pickedAt)
	if wait <= 0 {
		fl.endLocked(true)
		return
	}
	fl.timer.Reset(wait)
}

// detach lets the claiming observer stop after the first token, when the
// flight is not sampled for its usage and its router stream's close will
// mark the request's end; it reports whether the observer may stop.
func (fl *flight) detach() bool {
	if fl.full || !fl.endsWithRouter {
		return false
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.ended {
		return true
	}
	fl.detached = true
	fl.s.metrics.detached.Inc()
	if fl.routerDone {
		fl.endLocked(false)
	}
	return true
}

// onTimer is the flight's timer: the unclaimed deadline after the router
// stream ended, else MaxRequestLifetime.
func (fl *flight) onTimer() {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.ended {
		return
	}
	if !fl.claimed && fl.routerDone && time.Since(fl.pickedAt) < fl.s.cfg.MaxRequestLifetime {
		fl.endLocked(true)
		return
	}
	// The request's deadline: it no longer counts as load and its usage,
	// if it ever comes, is ignored.
	fl.expired.Store(true)
	fl.life.Done()
	if !fl.claimed {
		fl.endLocked(true)
	}
}

// end ends a claimed flight (its response ended, or its claimer's stream).
func (fl *flight) end() {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	fl.endLocked(false)
}

func (fl *flight) endLocked(unclaimed bool) {
	if fl.ended {
		return
	}
	fl.ended = true
	fl.timer.Stop()
	fl.life.Done()
	fl.s.flights.m.Delete(fl.id)
	fl.s.flights.n.Add(-1)
	fl.s.metrics.flights.Dec()
	if unclaimed {
		fl.s.metrics.unobserved.Inc()
	}
	if fl.span != nil {
		if unclaimed {
			fl.span.SetAttributes(attribute.Bool("kvroute.response_unobserved", true))
			if !fl.routerEnd.IsZero() {
				fl.span.End(trace.WithTimestamp(fl.routerEnd))
				return
			}
		}
		fl.span.End()
	}
}
