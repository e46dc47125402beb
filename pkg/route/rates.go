package route

import (
	"math"
	"sync"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
)

// Rates learns, per replica, how fast it prefills and how long its decode
// steps take, online, from what the router sees of the requests it sent
// there (RateSample: a response's time to first token, the prompt and
// cached tokens of its usage, its output tokens and its end). kvroute's
// prediction turns its block counts into time with them, so a replica
// that prefills at half the speed of the others is seen as twice as far
// behind with the same queue, and the per-request charge follows the
// replica's real step time. Nothing is a fixed constant once a replica has
// answered; before that, Get reports nothing and the policy falls back to
// the other candidates' figures or its defaults.
//
// Estimators, per replica:
//
//   - decode step: each request with at least two output tokens gives a
//     sample, its mean inter-token time (E2E − TTFT) / (output tokens − 1).
//     Prefill chunks of other requests scheduled into the same steps
//     (chunked prefill) only lengthen a sample, so the estimate follows
//     the samples' lower envelope: it sinks toward a lower sample with
//     weight RateFastWeight and rises toward a higher one with weight
//     RateSlowWeight. It is the time of a step that only decodes: the
//     fixed cost every step adds to a first token and to every running
//     request;
//   - token interval: the same samples' plain mean (weight
//     RateMeanWeight either way), prefill chunks included: how long a
//     running request takes per output token on the replica as it is
//     loaded, which says when the requests decoding there now will end
//     and free their KV blocks (kvroute's memory wait);
//   - prefill speed: each request with at least RateMinPrefillTokens
//     uncached tokens gives a sample (uncached + queued ahead) /
//     (TTFT − fastest step) tokens per second: its own prefill plus what
//     the router knew was queued ahead, over its time to first token less
//     the step that samples the token, counted as the shortest
//     inter-token time any replica has shown, outliers aside: a sample
//     below RateStepOutlier (half) of its replica's learned step (a
//     response whose tokens came bunched) is not a step, and one such
//     sample would otherwise lower every later prefill sample for the
//     router's life. Queueing the router did not
//     see (other routers, steps spent on decodes) only lowers a sample,
//     never raises it, so the estimate follows the samples' upper
//     envelope: it rises toward a higher sample with weight
//     RateFastWeight and sinks toward a lower one with weight
//     RateSlowWeight. The fleet's shortest step is itself learned: in a
//     fleet's first seconds it may be a step that carried a prefill
//     chunk (a trace opening with 20-50k-token prompts showed 0.22-0.52
//     s before any replica decoded alone), and a sample read against it
//     is too high (13,492 tokens over 0.90 s less 0.46 s: 30,872
//     tokens/s on a 16,000 replica). The envelope kept such readings for
//     hundreds of samples (the trace at 4 replicas, 0.8: learned
//     16,500-22,700 tokens/s at 12 s, still up to 17,700 at 200 s), and
//     the replica believed fastest wins the near-ties among idle
//     replicas. So when the fleet's shortest step falls, every replica's
//     estimate is held to what the sample that last raised it reads with
//     the new step. The replica's own learned decode step is not what
//     is subtracted: it is an inter-token time, which prefill chunks
//     sharing the steps lengthen (on a replica serving long prompts,
//     several times over), and subtracting a lengthened step from a short
//     time to first token raises the sample above the replica's speed,
//     which the upper envelope then keeps for hundreds of samples (such a
//     replica was seen up to 40% faster than its peers and drew the
//     fleet's long prompts, filling its cache first). The fleet's
//     shortest inter-token time is the step of some replica decoding
//     without prefill beside it: on a fleet of like replicas it is every
//     replica's step; a slower replica's samples it only lowers.
//
// Either way a replica that truly gets faster is followed within a few
// requests and one that gets a little slower within a few hundred (the
// slow weight halves the gap every 88 samples), and a burst of queueing or
// interference moves the estimate little. A replica that gets much slower
// (a GPU that throttles, a neighbour that takes a share of it) is followed
// at once instead: when RateShiftSamples prefill samples in a row all read
// below RateShiftRatio of the estimate, or at least RateShiftMinSamples of
// them whose first tokens came RateShiftSpan or more apart (a replica at
// light load, sending a sample a minute: a session homed on a GPU slowed
// to a twentieth kept going there for 350 s, 11 turns of 1.3-9.2 s,
// because its turns never made 10; agentic at 0.5, 4 replicas, each slowed
// in turn, seeds 1-5: 3.2 % of the requests 150 s or more into a run went
// to the slowed replica, 0.84 % with the span), the estimate is stale, not
// the samples, and it restarts at the best of them; likewise the decode
// step restarts at the least of RateShiftSteps inter-token times in a row
// that all read above the step over RateShiftRatio. Kept to the gradual
// weights, a replica slowed to a third of its speed (5,300 tokens/s) was
// still believed at 14,100-15,000 tokens/s 600 requests later and 12,900
// after 900 (kvbench sim -speed-change, the trace at 4 replicas, 0.8,
// seeds 1-3; agents at 0.5: 12,300-13,000 after 300), and it drew the
// prompts the prediction thought it would prefill soonest. A sample sent
// to a replica whose KV memory bound (RateSample.MemoryBound) breaks such
// a run instead: its request may have waited for blocks, and a healthy
// replica under preemption reads slow as well (restarts on such runs alone
// raised kvroute's mean time to first token 15-18% on grpo at 0.95 and 1.1
// with engines twice as fast, 4 replicas). On identical replicas under
// kvroute's routing, with such samples breaking runs, runs of far-slower
// prefill samples were at most 8 long (4, 8 and 16 replicas, the bar's ten
// workloads, utilization 0.5-1.1, seeds 1-3; likewise with half the KV
// cache or 16-token blocks at 4 and 8 replicas) but for one of 16 with
// engines twice as fast (8 replicas), and on a fleet of two speeds
// (-speeds 2,1) runs of 9-16 occurred. So 10 in a row restart the
// estimate: against 16, that moved no pass count of those grids (seeds
// 1-5) and cut a slowed replica's damage further (see docs/benchmarks.md).
// Such runs are short in time: a healthy replica under the load that makes
// unseen queueing sends many samples a second, and one of them reads
// normal. Runs of 3 or more far-slower samples spanned at most 36 s of
// first tokens there (the same grids with lost events and half the KV
// cache, seeds 1-3), 21 s for runs of 4 or more, so 3 in a row over a
// minute restart it too: on those grids nothing changed, and a replica
// slowed to a twentieth at light load was left within a few turns
// (docs/benchmarks.md, "a slowed replica at light load"). A sample without
// a time (RateSample.At zero) counts toward the run's length only. Runs of
// 32 inter-token times above twice the step came 1-6 times a grid, at
// overload, where the batch really does lengthen the step.
//
// A Rates also learns what requests generate against the max_tokens they
// carry (ExpectOutput, see outputs).
//
// A Rates is safe for concurrent use (a mutex for the speeds and one for
// the outputs, each held for a few float operations, or a scan of the
// 256 output keys when a new one displaces the oldest). It starts no
// goroutine.
type Rates struct {
	out      outputs // what requests generate against their max_tokens (ExpectOutput)
	mu       sync.Mutex
	replicas map[index.ReplicaID]*rateState
	observed int
	minStep  float64 // the shortest inter-token time any replica has shown, outliers aside (RateStepOutlier), seconds; 0 before one
}

// Rate weights and thresholds (see Rates).
const (
	RateFastWeight       = 1.0 / 4
	RateSlowWeight       = 1.0 / 128
	RateMinPrefillTokens = 1024
	RateStepOutlier      = 0.5
	RateMeanWeight       = 1.0 / 16
	RateShiftRatio       = 0.5
	RateShiftSamples     = 10
	RateShiftMinSamples  = 3
	RateShiftSpan        = time.Minute
	RateShiftSteps       = 32
	RateProofWait        = 2 * time.Second
)

type rateState struct {
	prefill float64 // tokens per second; 0 before a sample
	step    float64 // seconds; 0 before a sample
	itl     float64 // mean inter-token time, seconds; 0 before a sample
	// The prefill sample that last raised prefill: its work (uncached
	// plus queued tokens) and time to first token.
	raiseWork, raiseTTFT float64
	// The run of prefill samples in a row below RateShiftRatio of prefill
	// (its length and its best sample: speed, work, time to first token),
	// and of inter-token times in a row above step over RateShiftRatio
	// (its length and least).
	lowRun                    int
	lowBest, lowWork, lowTTFT float64
	lowFirst, lowLast         time.Time // the run's earliest and latest first tokens (zero: none known)
	slowRun                   int
	slowLeast                 float64
}

// shiftPrefill counts a prefill sample x (work tokens over ttft seconds,
// its first token at at) against the run of samples far below the
// estimate, and restarts the estimate at the run's best when the run is
// RateShiftSamples long, or RateShiftMinSamples long over RateShiftSpan.
// It reports whether it did.
func (st *rateState) shiftPrefill(x, work, ttft float64, at time.Time) bool {
	if x >= RateShiftRatio*st.prefill {
		st.lowRun = 0
		return false
	}
	if st.lowRun == 0 {
		st.lowFirst, st.lowLast = time.Time{}, time.Time{}
	}
	if st.lowRun == 0 || x > st.lowBest {
		st.lowBest, st.lowWork, st.lowTTFT = x, work, ttft
	}
	if !at.IsZero() {
		// Samples come in the order their requests finish, not their
		// first tokens'.
		if st.lowFirst.IsZero() || at.Before(st.lowFirst) {
			st.lowFirst = at
		}
		if at.After(st.lowLast) {
			st.lowLast = at
		}
	}
	st.lowRun++
	long := st.lowRun >= RateShiftMinSamples && st.lowLast.Sub(st.lowFirst) >= RateShiftSpan
	if st.lowRun < RateShiftSamples && !long {
		return false
	}
	st.prefill, st.raiseWork, st.raiseTTFT = st.lowBest, st.lowWork, st.lowTTFT
	st.lowRun = 0
	return true
}

// shiftStep is shiftPrefill for the decode step: inter-token times far
// above it, RateShiftSteps in a row, restart it at their least.
func (st *rateState) shiftStep(itl float64) bool {
	if itl*RateShiftRatio <= st.step {
		st.slowRun = 0
		return false
	}
	if st.slowRun == 0 || itl < st.slowLeast {
		st.slowLeast = itl
	}
	if st.slowRun++; st.slowRun < RateShiftSteps {
		return false
	}
	st.step, st.slowRun = st.slowLeast, 0
	return true
}

// capPrefill holds st's prefill speed to what the sample that last raised
// it reads with the fleet's shortest step now (see Rates).
func (st *rateState) capPrefill(minStep float64) {
	if d := st.raiseTTFT - minStep; st.raiseWork > 0 && d > 0 {
		st.prefill = math.Min(st.prefill, st.raiseWork/d)
	}
}

// RateSample is one finished request as the router saw it.
type RateSample struct {
	// Uncached are the prompt tokens the engine computed: the prompt less
	// the cached tokens it reported.
	Uncached int
	// Queued are the uncached prompt tokens the router knew were queued
	// ahead of the request on its replica when it was sent (0 when not
	// known).
	Queued int
	// TTFT is the time from sending the request to its first token; E2E
	// to its last.
	TTFT, E2E time.Duration
	// Output is the number of tokens generated.
	Output int
	// MaxTokens is the max_tokens the request carried, 0 when none: the
	// output is learned against it (ExpectOutput).
	MaxTokens int
	// MemoryBound is the replica's load.Load.MemoryBound when the request
	// was sent: its engine was preempting or its cache nearly full, so the
	// request may have waited for KV memory, and a slow first token is no
	// sign of a slower replica. Such a sample still moves the estimate at
	// the slow weight, but it breaks a run of far-slower samples
	// (RateShiftSamples).
	MemoryBound bool
	// At is when the first token came; zero when not known (the sample
	// then counts toward a run of far-slower samples by number only, not
	// by its span, RateShiftSpan).
	At time.Time
}

// NewRates returns a learner that knows nothing yet.
func NewRates() *Rates { return &Rates{replicas: make(map[index.ReplicaID]*rateState)} }

// Rate is a replica's learned speeds; a zero field is not known yet.
type Rate struct {
	// PrefillTokensPerSec is the replica's prefill speed for uncached
	// prompt tokens.
	PrefillTokensPerSec float64
	// DecodeStep is the duration of one decode step (the inter-token time
	// its running requests see).
	DecodeStep time.Duration
	// TokenInterval is the mean inter-token time of its requests, steps
	// lengthened by other requests' prefill chunks included.
	TokenInterval time.Duration
}

// Observe learns from one finished request on replica. Samples with a
// non-positive TTFT, negative counts or an end before the first token are
// ignored (they still count in Observed).
func (r *Rates) Observe(replica index.ReplicaID, s RateSample) {
	if s.E2E >= s.TTFT && s.TTFT > 0 {
		r.out.observe(s.MaxTokens, s.Output)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.observed++
	if s.TTFT <= 0 || s.Uncached < 0 || s.Queued < 0 || s.Output < 0 || s.E2E < s.TTFT {
		return
	}
	st := r.replicas[replica]
	if st == nil {
		st = &rateState{}
		r.replicas[replica] = st
	}
	if s.Output >= 2 && s.E2E > s.TTFT {
		itl := (s.E2E - s.TTFT).Seconds() / float64(s.Output-1)
		// A sample below RateStepOutlier of the replica's own learned
		// step (the lower envelope of its samples) is not a step, and
		// does not set the fleet's shortest.
		if (r.minStep == 0 || itl < r.minStep) && itl >= RateStepOutlier*st.step {
			r.minStep = itl
			for _, o := range r.replicas {
				o.capPrefill(itl)
			}
		}
		if st.itl == 0 {
			st.itl = itl
		} else {
			st.itl += RateMeanWeight * (itl - st.itl)
		}
		switch {
		case st.step == 0:
			st.step = itl
		case st.shiftStep(itl):
		case itl < st.step:
			st.step += RateFastWeight * (itl - st.step)
		default:
			st.step += RateSlowWeight * (itl - st.step)
		}
	}
	if s.Uncached < RateMinPrefillTokens {
		return
	}
	d := s.TTFT.Seconds() - r.minStep
	if d <= 0 {
		return
	}
	x := float64(s.Uncached+s.Queued) / d
	if s.MemoryBound {
		st.lowRun = 0 // a wait for memory, perhaps: not a slower replica
	}
	switch {
	case st.prefill == 0:
		st.prefill = x
	case !s.MemoryBound && st.shiftPrefill(x, float64(s.Uncached+s.Queued), s.TTFT.Seconds(), s.At):
		return
	case x > st.prefill:
		st.prefill += RateFastWeight * (x - st.prefill)
	default:
		st.prefill += RateSlowWeight * (x - st.prefill)
		return
	}
	st.raiseWork, st.raiseTTFT = float64(s.Uncached+s.Queued), s.TTFT.Seconds()
}

// ExpectOutput is the output, in tokens, a request carrying maxTokens (0:
// none) is expected to generate: the mean output of recent requests that
// carried the same max_tokens once enough have finished, never more than
// it; before that maxTokens itself (see outputs). 0 means not known.
func (r *Rates) ExpectOutput(maxTokens int) int { return r.out.expect(maxTokens) }

// Get returns the replica's learned speeds; ok is false when nothing was
// learned for it.
func (r *Rates) Get(replica index.ReplicaID) (Rate, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.replicas[replica]
	if st == nil || (st.prefill == 0 && st.step == 0) {
		return Rate{}, false
	}
	return Rate{
		PrefillTokensPerSec: st.prefill, DecodeStep: time.Duration(st.step * float64(time.Second)),
		TokenInterval: time.Duration(st.itl * float64(time.Second)),
	}, true
}

// Forget drops what was learned for a replica (it left the fleet; the
// router calls it when the replica is gone from its State). A replica that
// comes back is learned afresh.
func (r *Rates) Forget(replica index.ReplicaID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.replicas, replica)
}

// Observed counts the samples Observe was given, usable or not: a feeder
// that replays a list of finished requests resumes where it stopped.
func (r *Rates) Observed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.observed
}

// provenRate is l's prefill speed held to what its oldest streamed request
// still waiting for a first token proves (load.Load.OldestPrefillWait):
// every request sent there before it has had its first token, so in its
// wait the replica prefilled fewer tokens than the blocks ahead of it at
// its start and its own (at least one block) hold, but for the step under
// way when it came and the step that samples its token (two of the
// replica's token intervals, steps with their prefill chunks, are taken
// off the wait). Rates learns from first tokens, which a replica that
// slows sends back late: a GPU slowed to a third drew requests at its old
// speed until 16 of its slow first tokens had come back, 20-30 s each by
// then on a busy trace. The bound replaces the learned speed only when
// below RateShiftRatio of it, and only once the request has waited
// RateProofWait: the blocks ahead are the router's charges, not the
// engine's work (other requests' chunks share the steps, a preempted
// request is computed again), and across the bar's grid on identical
// replicas (4 and 16 replicas, every workload, utilization 0.5-1.1, seeds
// 1-2) the bound read below half the learned speed 1,333 times with waits
// up to 1.8 s. Past 2 s it did so 60 times in seeds 1-3 at 4, 8 and 16
// replicas, each on a replica whose KV cache was 81-99 % full: a long
// prompt waiting for memory, not prefilling, as the bound says. So the
// bound is not used where the replica's memory binds (load.Load.
// MemoryBound: preempting, or at least MemoryBoundUsage full). A speed
// not learned yet (0) stays unknown.
func provenRate(l load.Load, blockTokens int) float64 {
	step := l.TokenInterval
	if step <= 0 {
		step = l.DecodeStep
	}
	d := (l.OldestPrefillWait - 2*step).Seconds()
	if !(l.PrefillRate > 0) || l.MemoryBound() || l.OldestPrefillWait < RateProofWait || !(d > 0) {
		return l.PrefillRate
	}
	if bound := math.Max(l.OldestPrefillBlocks, 1) * float64(blockTokens) / d; bound < RateShiftRatio*l.PrefillRate {
		return bound
	}
	return l.PrefillRate
}
