package route

import (
	"math"
	"sync"
)

// outputs learns how many tokens requests generate against the max_tokens
// they carry. A benchmark client sends each request's exact output with
// ignore_eos, and there max_tokens is the output; most clients send a cap
// instead (an SDK's default, an agent harness's 32,000, a reasoning
// model's 32,768) or none, and the output is a small, unknown share of it.
// Taken as the output, such a cap made kvroute charge every request for KV
// blocks it never fills: on rl at 4 replicas, 0.8 utilization and half the
// KV cache, medians of seeds 1-5, its mean time to first token was 0.065 s
// with exact outputs and 0.121 s with clients capping at 32,000 (0.065 s
// with the cap learned as below; docs/benchmarks.md, "Clients that cap
// max_tokens").
//
// So the output a request is expected to generate is learned per
// max_tokens value, 0 standing for none: the mean output of the recent
// requests that carried the same value, once OutputMinSamples of them
// have finished, never more than the value itself; before that the value
// (for none: nothing, as before). A cap many requests share is learned
// within a few of them; an exact output repeats only when requests really
// generate that many, and then its mean is the value, so exact clients
// are priced as before. At most outputKeys values are kept, the least
// recently seen forgotten first.
type outputs struct {
	mu    sync.Mutex
	byMax map[int]*outputMean
	tick  uint64
}

type outputMean struct {
	mean float64
	n    int
	seen uint64
}

// Output learner constants (see outputs).
const (
	// OutputMinSamples finished requests of a max_tokens value make its
	// learned mean the expected output.
	OutputMinSamples = 8
	// OutputWeight is the exponential weight of a sample once that many
	// have been averaged (a plain mean before).
	OutputWeight = 1.0 / 32
	outputKeys   = 256
)

// observe learns that a request carrying maxTokens (0: none) generated
// out tokens. Negative values are ignored, and so is an output beyond a
// positive maxTokens (an engine never generates one).
func (o *outputs) observe(maxTokens, out int) {
	if maxTokens < 0 || out < 0 || (maxTokens > 0 && out > maxTokens) {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.tick++
	m := o.byMax[maxTokens]
	if m == nil {
		if o.byMax == nil {
			o.byMax = make(map[int]*outputMean)
		}
		if len(o.byMax) >= outputKeys {
			o.forgetOldest()
		}
		m = &outputMean{}
		o.byMax[maxTokens] = m
	}
	m.n++
	m.mean += max(1/float64(m.n), OutputWeight) * (float64(out) - m.mean)
	m.seen = o.tick
}

// forgetOldest drops the value seen least recently.
func (o *outputs) forgetOldest() {
	oldest, key := uint64(math.MaxUint64), 0
	for k, m := range o.byMax {
		if m.seen < oldest {
			oldest, key = m.seen, k
		}
	}
	delete(o.byMax, key)
}

// expect is the output a request carrying maxTokens (0: none) is expected
// to generate, in tokens (0: not known).
func (o *outputs) expect(maxTokens int) int {
	if maxTokens < 0 {
		return 0
	}
	o.mu.Lock()
	m := o.byMax[maxTokens]
	learned := m != nil && m.n >= OutputMinSamples
	mean := 0.0
	if learned {
		mean = m.mean
	}
	o.mu.Unlock()
	if !learned {
		return maxTokens
	}
	e := int(math.Ceil(mean))
	if maxTokens > 0 {
		e = min(e, maxTokens)
	}
	return e
}
