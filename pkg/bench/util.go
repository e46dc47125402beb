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
// output and this turn's segments.
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
		prev = out[i] + t.Output
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
// Replicas × the engine's PrefillTokensPerSec (defaults applied).
func (c FleetConfig) PrefillCapacity() float64 {
	d, err := c.withDefaults()
	if err != nil {
		return math.NaN()
	}
	return float64(d.Replicas) * d.Engine.PrefillTokensPerSec
}

// OfferedUtil is w's offered prefill load over fleet's prefill capacity.
func (w *Workload) OfferedUtil(fleet FleetConfig) float64 {
	return w.Offered().TokensPerSec / fleet.PrefillCapacity()
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
// utilization on fleet is util.
func (w *Workload) AtUtil(util float64, fleet FleetConfig) (*Workload, error) {
	now := w.OfferedUtil(fleet)
	if !(util > 0) || math.IsInf(util, 0) {
		return nil, fmt.Errorf("%w: utilization %v must be a positive number", ErrSim, util)
	}
	if !(now > 0) || math.IsInf(now, 0) {
		return nil, fmt.Errorf("%w: workload %s has no offered rate to scale (its sessions start at fewer than two distinct times)", ErrSim, w.Name)
	}
	return w.ScaleRate(util / now), nil
}
