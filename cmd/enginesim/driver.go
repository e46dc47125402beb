package main

import (
	"context"
	"sync"
	"time"

	"github.com/kvroute/kvroute/pkg/engine"
)

// item is one thing delivered to an HTTP request: a token or a finish of
// one of its prompts (idx).
type item struct {
	idx int
	tok *engine.Token
	fin *engine.Finished
}

// sink collects one HTTP request's tokens; its channel is sized for every
// token and finish it can receive, so delivery never blocks.
type sink struct {
	ch chan item
}

type subscription struct {
	s   *sink
	idx int
}

// driver runs the engine in real time: simulated time is wall time since
// start multiplied by speed. It owns one goroutine (run); HTTP handlers
// call submit and abort.
type driver struct {
	speed   float64
	start   time.Time
	publish func([]engine.Event)
	// onFinish, if set before run starts, sees every finished request.
	onFinish func(engine.Finished)
	// slow, if set before run starts, is the configuration the engine is
	// retimed to at the first step from simulated time slowAt on
	// (--slow-after); run clears it then.
	slowAt time.Duration
	slow   *engine.Config

	mu   sync.Mutex
	eng  *engine.Engine
	subs map[engine.ReqID]subscription
	wake chan struct{}
}

func newDriver(eng *engine.Engine, speed float64, publish func([]engine.Event)) *driver {
	return &driver{
		speed: speed, start: time.Now(), publish: publish, eng: eng,
		subs: make(map[engine.ReqID]subscription), wake: make(chan struct{}, 1),
	}
}

func (d *driver) simNow() time.Duration {
	return time.Duration(float64(time.Since(d.start)) * d.speed)
}

func (d *driver) wall(sim time.Duration) time.Time {
	return d.start.Add(time.Duration(float64(sim) / d.speed))
}

// submit queues the prompts of one HTTP request; they all report to s. On
// error nothing stays queued.
func (d *driver) submit(reqs []engine.Request, s *sink) ([]engine.ReqID, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.simNow()
	ids := make([]engine.ReqID, 0, len(reqs))
	for i, r := range reqs {
		id, err := d.eng.Submit(now, r)
		if err != nil {
			for _, x := range ids {
				d.eng.Abort(x)
				delete(d.subs, x)
			}
			return nil, err
		}
		ids = append(ids, id)
		d.subs[id] = subscription{s, i}
	}
	select {
	case d.wake <- struct{}{}:
	default:
	}
	return ids, nil
}

// abort drops requests whose client went away.
func (d *driver) abort(ids []engine.ReqID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, id := range ids {
		if _, ok := d.subs[id]; ok {
			d.eng.Abort(id)
			delete(d.subs, id)
		}
	}
}

func (d *driver) stats() engine.Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.eng.Stats()
}

func (d *driver) resetPrefixCache() bool {
	d.mu.Lock()
	evs, ok := d.eng.ResetPrefixCache()
	d.mu.Unlock()
	if ok {
		d.publish(evs)
	}
	return ok
}

// sleepUntil waits until the wall-clock image of simulated time t.
func (d *driver) sleepUntil(ctx context.Context, t time.Duration) bool {
	wait := time.Until(d.wall(t))
	if wait <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// run steps the engine until ctx ends: each step is computed at its start
// and its tokens, finishes and events are delivered at its end.
func (d *driver) run(ctx context.Context) {
	for {
		d.mu.Lock()
		at, busy := d.eng.NextEventTime()
		d.mu.Unlock()
		if !busy {
			select {
			case <-d.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		if !d.sleepUntil(ctx, at) {
			return
		}
		d.mu.Lock()
		now := max(d.simNow(), at)
		if d.slow != nil && now >= d.slowAt {
			_ = d.eng.Retime(*d.slow) // validated against the engine at startup
			d.slow = nil
		}
		res := d.eng.Step(now)
		d.mu.Unlock()
		if !d.sleepUntil(ctx, res.End) {
			return
		}
		d.deliver(res)
	}
}

func (d *driver) deliver(res engine.StepResult) {
	if len(res.Events) > 0 {
		d.publish(res.Events)
	}
	if d.onFinish != nil {
		for _, f := range res.Finished {
			d.onFinish(f)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range res.Tokens {
		if sub, ok := d.subs[res.Tokens[i].ID]; ok {
			sub.s.ch <- item{idx: sub.idx, tok: &res.Tokens[i]}
		}
	}
	for i := range res.Finished {
		id := res.Finished[i].ID
		if sub, ok := d.subs[id]; ok {
			sub.s.ch <- item{idx: sub.idx, fin: &res.Finished[i]}
			delete(d.subs, id)
		}
	}
}
