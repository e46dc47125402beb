package bench

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Utilization
//
// A workload's offered prefill load is the prompt tokens it sends per
// second; the fleet's prefill capacity is Replicas × PrefillTokensPerSec.
// Their ratio is the offered utilization: every prompt token counts, as if
// nothing were cached, so it depends on the workload and the fleet only,
// never on a policy, and cache hits lower the prefill work actually done
// below it.
//
// The rate is the one a workload sets, its session starts: PromptTokens
// (every turn's prompt, a later turn's including the history it resends and
// the previous turn's output) over Span, the session starts' mean gap times
// the number of distinct start times (for n Poisson starts at rate λ that
// estimates n/λ; a group of sessions starting at once counts once). Think
// times and tool delays inside a session are not scaled: in a steady state
// a workload whose sessions start at rate λ offers λ × the mean prompt
// tokens per session per second, whatever their spacing within a session,
// so this is that steady-state figure. A run's realized figure (RunUtil:
// prompt tokens over the span of its actual arrivals) is lower when the
// sessions last long against Span (ramp-up and drain) and, with closed-loop
// sessions, when a slow fleet delays later turns.

// Offered is a workload's offered prefill load.
type Offered struct {
	Requests     int           `json:"requests"`
	PromptTokens int64         `json:"prompt_tokens"`
	Span         time.Duration `json:"span_ns"`
	// TokensPerSec is PromptTokens / Span (0 when Span is 0).
	TokensPerSec float64 `json:"tokens_per_s"`
}

// PromptLens returns the prompt length of each of s's turns as the
// simulator builds them (before any cut to the model's context): a trace
// turn's TraceLen; otherwise the previous prompt, the previous turn's
// output less its Hidden tokens, and this turn's segments.
func (s *Session) PromptLens() []int {
	out := make([]int, len(s.Turns))
	prev := 0
	for i, t := range s.Turns {
		if t.TraceIDs != nil {
			out[i] = t.TraceLen
		} else {
			n := prev
			for _, sg := range t.Append {
				n += sg.Len
			}
			out[i] = n
		}
		prev = out[i] + t.resentLen()
	}
	return out
}

// Offered returns w's offered prefill load (see Utilization).
func (w *Workload) Offered() Offered {
	var o Offered
	starts := make([]time.Duration, 0, len(w.Sessions))
	for i := range w.Sessions {
		s := &w.Sessions[i]
		if len(s.Turns) == 0 {
			continue
		}
		for _, n := range s.PromptLens() {
			o.PromptTokens += int64(n)
		}
		o.Requests += len(s.Turns)
		starts = append(starts, s.Start+s.Turns[0].Gap)
	}
	slices.Sort(starts)
	starts = slices.Compact(starts)
	if k := len(starts); k >= 2 {
		gap := float64(starts[k-1]-starts[0]) / float64(k-1)
		o.Span = time.Duration(gap * float64(k))
		o.TokensPerSec = float64(o.PromptTokens) / o.Span.Seconds()
	}
	return o
}

// PrefillCapacity is the fleet's prefill speed in tokens per second:
// Replicas × the engine's PrefillTokensPerSec × their mean speed (defaults
// applied).
func (c FleetConfig) PrefillCapacity() float64 {
	d, err := c.withDefaults()
	if err != nil {
		return math.NaN()
	}
	return float64(d.Replicas) * d.Engine.PrefillTokensPerSec * d.meanSpeed()
}

// OfferedUtil is w's offered prefill utilization on fleet: the prompt
// tokens of the requests arriving in the bulk of the workload (between the
// 10th and 90th percentile arrival, as Summary.RunUtil measures a run) per
// second of that window, over the fleet's prefill capacity, with every
// turn arriving as it would on a fleet that never queues (see
// Workload.Arrivals). Every prompt token counts, cached or not, so it does
// not depend on a policy. For open-loop requests (the trace, herding,
// fanout) it is the arrival rate's figure; for closed-loop sessions it
// accounts for the sessions' ramp-up and drain and for the time each turn
// takes, which the session start rate alone (Offered) does not.
func (w *Workload) OfferedUtil(fleet FleetConfig) float64 {
	at, lens := w.Arrivals(fleet)
	return bulkUtil(at, lens, fleet.PrefillCapacity())
}

// Arrivals returns every turn's arrival time and prompt length on a fleet
// that never queues: a session's first turn arrives at its start; a later
// turn arrives its think time after the previous turn's last token, which
// comes after the previous turn's new tokens (prompt less the history it
// resends, which an affine router finds cached) are prefilled and its
// other output tokens decoded one a step. A decode step takes the engine's
// StepTime plus StepTimePerSeq per sequence in the batch, stretched by the
// share of time the replicas spend prefilling new tokens; the batch and
// that share are the model's own averages over its bulk, found by a few
// rounds of fixed-point iteration. The fleet's real queueing can only make
// the realized load (RunUtil) lower.
func (w *Workload) Arrivals(fleet FleetConfig) (at []time.Duration, lens []int) {
	d, err := fleet.withDefaults()
	if err != nil {
		return nil, nil
	}
	e := d.Engine.AtSpeed(d.meanSpeed()) // a mixed fleet timed as one of its mean speed
	capacity := float64(d.Replicas) * e.PrefillTokensPerSec
	batch, share := 1.0, 0.0
	for range 4 {
		step := (e.StepTime.Seconds() + batch*e.StepTimePerSeq.Seconds()) / (1 - share)
		var fresh []float64
		var decode []float64 // per request: seconds spent decoding
		at, lens, fresh, decode = w.arrivalsWith(e.PrefillTokensPerSec, step, at[:0], lens[:0])
		lo, hi, ok := bulkWindow(at)
		if !ok {
			break
		}
		var newTokens, decoding float64
		for i, a := range at {
			if a >= lo && a <= hi {
				newTokens += fresh[i]
				decoding += decode[i]
			}
		}
		win := (hi - lo).Seconds()
		batch = max(1, decoding/win/float64(d.Replicas))
		share = min(0.9, newTokens/win/capacity)
	}
	return at, lens
}

// arrivalsWith is one round of Arrivals with a fixed decode step (seconds
// a token): arrival times, prompt lengths, new tokens and decode seconds of
// every turn.
func (w *Workload) arrivalsWith(prefillTPS, step float64, at []time.Duration, lens []int) ([]time.Duration, []int, []float64, []float64) {
	var fresh, decode []float64
	for i := range w.Sessions {
		s := &w.Sessions[i]
		if len(s.Turns) == 0 {
			continue
		}
		pl := s.PromptLens()
		t := s.Start + s.Turns[0].Gap
		prev := 0
		for k, turn := range s.Turns {
			if k > 0 {
				t += turn.Gap
			}
			n := max(1, pl[k]-prev)
			if turn.TraceIDs != nil {
				n = pl[k]
			}
			dec := float64(max(0, turn.Output-1)) * step
			at = append(at, t)
			lens = append(lens, pl[k])
			fresh = append(fresh, float64(n))
			decode = append(decode, dec)
			t += time.Duration((float64(n)/prefillTPS + step + dec) * float64(time.Second))
			prev = pl[k] + turn.resentLen()
		}
	}
	return at, lens, fresh, decode
}

// bulkWindow returns the 10th and 90th percentile of arrival times at.
func bulkWindow(at []time.Duration) (lo, hi time.Duration, ok bool) {
	if len(at) < 2 {
		return 0, 0, false
	}
	sorted := slices.Clone(at)
	slices.Sort(sorted)
	n := len(sorted) - 1
	lo, hi = sorted[n/10], sorted[n-n/10]
	return lo, hi, hi > lo
}

// bulkUtil is the prompt tokens of the arrivals in the bulk window per
// second of it, over capacity (0 without a window).
func bulkUtil(at []time.Duration, lens []int, capacity float64) float64 {
	lo, hi, ok := bulkWindow(at)
	if !ok || !(capacity > 0) {
		return 0
	}
	var tokens int64
	for i, a := range at {
		if a >= lo && a <= hi {
			tokens += int64(lens[i])
		}
	}
	return float64(tokens) / (hi - lo).Seconds() / capacity
}

// ScaleRate returns a copy of w whose session starts (and first-turn
// offsets) come x times as fast: every time before a session's first turn
// is divided by x. Turns and think times are shared with w, unchanged.
func (w *Workload) ScaleRate(x float64) *Workload {
	out := &Workload{Name: w.Name, Sessions: slices.Clone(w.Sessions)}
	for i := range out.Sessions {
		s := &out.Sessions[i]
		s.Start = time.Duration(float64(s.Start) / x)
		if len(s.Turns) > 0 && s.Turns[0].Gap != 0 {
			s.Turns = slices.Clone(s.Turns)
			s.Turns[0].Gap = time.Duration(float64(s.Turns[0].Gap) / x)
		}
	}
	return out
}

// AtUtil returns a copy of w rescaled (ScaleRate) so that its offered
// utilization on fleet (OfferedUtil) is util, within 0.5%, found by
// bisection on the scale. A closed-loop workload whose sessions outlast
// their starts may not reach util at any start rate (its bulk is then all
// sessions at once): AtUtil then returns it at the highest utilization it
// reaches, which the result's OfferedUtil reports; callers compare (a
// bigger workload reaches more). Errors are for a bad util or a workload
// with no rate to scale.
func (w *Workload) AtUtil(util float64, fleet FleetConfig) (*Workload, error) {
	if !(util > 0) || math.IsInf(util, 0) {
		return nil, fmt.Errorf("%w: utilization %v must be a positive number", ErrSim, util)
	}
	now := w.OfferedUtil(fleet)
	if !(now > 0) || math.IsInf(now, 0) || w.Offered().Span <= 0 {
		return nil, fmt.Errorf("%w: workload %s has no offered rate to scale (its sessions start at fewer than two distinct times)", ErrSim, w.Name)
	}
	at := func(x float64) float64 { return w.ScaleRate(x).OfferedUtil(fleet) }
	// Bracket the target around the first-order guess util/now, doubling
	// outwards; remember the best scale seen for an unreachable target.
	x0 := util / now
	lo, hi := x0, x0
	ulo := at(x0)
	for i := 0; i < 30 && ulo > util; i++ {
		lo /= 2
		ulo = at(lo)
	}
	uhi := ulo
	if hi == lo {
		uhi = at(hi)
	}
	bestX, bestU := hi, uhi
	for i := 0; i < 30 && uhi < util; i++ {
		hi *= 2
		uhi = at(hi)
		if uhi > bestU {
			bestX, bestU = hi, uhi
		}
	}
	if uhi < util {
		return w.ScaleRate(bestX), nil
	}
	if lo == hi {
		return w.ScaleRate(hi), nil
	}
	for range 40 {
		mid := math.Sqrt(lo * hi)
		u := at(mid)
		if math.Abs(u-util) <= util*0.002 {
			return w.ScaleRate(mid), nil
		}
		if u < util {
			lo = mid
		} else {
			hi = mid
		}
	}
	return w.ScaleRate(math.Sqrt(lo * hi)), nil
}
