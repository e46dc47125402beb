package route

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
)

// replicaSample is what a replica prefilling at rate tokens/s with decode
// step step answers for a request of uncached tokens and output tokens,
// after queue of extra waiting.
func replicaSample(rate float64, step time.Duration, uncached, output int, queue time.Duration) RateSample {
	prefill := time.Duration(float64(uncached) / rate * float64(time.Second))
	ttft := queue + prefill + step
	return RateSample{Uncached: uncached, TTFT: ttft, E2E: ttft + time.Duration(output-1)*step, Output: output}
}

func TestRatesLearnEachReplica(t *testing.T) {
	r := NewRates()
	if _, ok := r.Get("a"); ok {
		t.Fatal("a replica never observed has learned rates")
	}
	maxN := 0
	for i := range 200 {
		n := 500 + 37*i%3000
		maxN = max(maxN, n)
		r.Observe("fast", replicaSample(16000, 10*time.Millisecond, n, 100, 0))
		r.Observe("slow", replicaSample(4000, 25*time.Millisecond, n, 100, 0))
	}
	for _, tt := range []struct {
		id   index.ReplicaID
		rate float64
		step time.Duration
	}{{"fast", 16000, 10 * time.Millisecond}, {"slow", 4000, 25 * time.Millisecond}} {
		got, ok := r.Get(tt.id)
		if !ok {
			t.Fatalf("%s: nothing learned", tt.id)
		}
		// The envelope: the longest prompt's prefill over its time to
		// first token less the fleet's shortest step (fast's 10 ms): the
		// slow replica's longer step is left in its samples.
		prefill := float64(maxN) / tt.rate
		if want := tt.rate * prefill / (prefill + tt.step.Seconds() - 0.010); math.Abs(got.PrefillTokensPerSec-want)/want > 0.005 || got.PrefillTokensPerSec > tt.rate*1.001 {
			t.Errorf("%s: prefill rate %.0f, want %.0f (at most %.0f)", tt.id, got.PrefillTokensPerSec, want, tt.rate)
		}
		if d := got.DecodeStep - tt.step; d > tt.step/50 || d < -tt.step/50 {
			t.Errorf("%s: decode step %v, want %v", tt.id, got.DecodeStep, tt.step)
		}
	}
	if got := r.Observed(); got != 400 {
		t.Errorf("Observed = %d, want 400", got)
	}
}

// Queueing the router did not see lowers a sample's apparent speed; the
// estimate follows the upper envelope, so bursts of queueing barely move
// it, while a replica that really slows down is followed.
func TestRatesPrefillIsUpperEnvelope(t *testing.T) {
	r := NewRates()
	step := 10 * time.Millisecond
	for i := range 100 {
		queue := time.Duration(0)
		if i%3 != 0 {
			queue = time.Duration(i%7) * 100 * time.Millisecond // two thirds of the requests queued
		}
		r.Observe("a", replicaSample(16000, step, 2000, 50, queue))
	}
	got, _ := r.Get("a")
	if got.PrefillTokensPerSec < 0.85*16000 || got.PrefillTokensPerSec > 16000*1.01 {
		t.Fatalf("with unseen queueing the prefill rate is %.0f, want near 16000", got.PrefillTokensPerSec)
	}
	// The replica slows to a quarter of its speed (say, a noisy neighbour).
	for range 600 {
		r.Observe("a", replicaSample(4000, step, 2000, 50, 0))
	}
	got, _ = r.Get("a")
	if got.PrefillTokensPerSec > 4000*1.1 {
		t.Fatalf("after slowing to 4000 tokens/s the learned rate is still %.0f", got.PrefillTokensPerSec)
	}
}

// What the router knew was queued ahead counts as work done before the
// first token.
func TestRatesCountKnownQueue(t *testing.T) {
	r := NewRates()
	for range 50 {
		s := replicaSample(10000, 10*time.Millisecond, 2000, 20, 300*time.Millisecond)
		s.Queued = 3000 // 0.3 s at 10000 tokens/s: the whole queue was seen
		r.Observe("a", s)
	}
	got, _ := r.Get("a")
	if math.Abs(got.PrefillTokensPerSec-10000) > 100 {
		t.Fatalf("prefill rate %.0f, want 10000", got.PrefillTokensPerSec)
	}
}

// A replica whose answers decode beside long prefills learns a long
// decode step (prefill chunks share its steps); its prefill samples must
// still not exceed its speed, or it looks faster than its peers and draws
// their long prompts. The step subtracted from its times to first token
// is the fleet's shortest: a peer that decodes without prefill beside it.
func TestRatesPrefillNotRaisedByALongStep(t *testing.T) {
	r := NewRates()
	const rate = 16000.0
	for i := range 50 {
		n := 1024 + 97*i%4000
		// The peer decodes alone: 8 ms steps.
		r.Observe("clean", replicaSample(rate, 8*time.Millisecond, n, 100, 0))
		s := replicaSample(rate, 8*time.Millisecond, n, 4, 0)
		// Three output tokens, each step shared with a 512-token prefill
		// chunk of another request (32 ms).
		s.E2E = s.TTFT + 3*40*time.Millisecond
		r.Observe("busy", s)
		got, _ := r.Get("busy")
		if got.PrefillTokensPerSec > rate*1.001 {
			t.Fatalf("after %d samples the prefill rate is %.0f, above the replica's %.0f (its step %v)", i+1, got.PrefillTokensPerSec, rate, got.DecodeStep)
		}
		if i == 49 && (got.PrefillTokensPerSec < rate*0.99 || got.DecodeStep < 39*time.Millisecond) {
			t.Fatalf("learned %.0f tokens/s and a %v step, want %.0f and the lengthened 40 ms", got.PrefillTokensPerSec, got.DecodeStep, rate)
		}
	}
}

func TestRatesIgnoreUnusableSamples(t *testing.T) {
	r := NewRates()
	for _, s := range []RateSample{
		{Uncached: 1000, TTFT: 0, E2E: time.Second, Output: 10},                              // no first token time
		{Uncached: -5, TTFT: time.Second, E2E: 2 * time.Second, Output: 10},                  // negative count
		{Uncached: 1000, TTFT: time.Second, E2E: time.Second / 2, Output: 10},                // ends before its first token
		{Uncached: RateMinPrefillTokens - 1, TTFT: time.Second, E2E: time.Second, Output: 1}, // too small to time a prefill, one token
	} {
		r.Observe("a", s)
	}
	if got, ok := r.Get("a"); ok {
		t.Fatalf("learned %+v from unusable samples", got)
	}
	if r.Observed() != 4 {
		t.Fatalf("Observed = %d, want 4", r.Observed())
	}
	// A one-token answer teaches no step; a small prompt teaches no prefill
	// rate but its decode step counts.
	r.Observe("a", RateSample{Uncached: 10, TTFT: 20 * time.Millisecond, E2E: 20*time.Millisecond + 9*12*time.Millisecond, Output: 10})
	got, ok := r.Get("a")
	if !ok || got.PrefillTokensPerSec != 0 || got.DecodeStep != 12*time.Millisecond {
		t.Fatalf("got %+v %v, want only a 12ms step", got, ok)
	}
}

// The router hands each candidate's learned speeds to the policy: with the
// same queue everywhere, kvroute sends the request to the replica that
// answered fastest, and a State's own figures take precedence.
func TestDecideUsesLearnedRates(t *testing.T) {
	st := fleet(3)
	for _, r := range st.reps {
		st.loads[r.ID] = load.Load{Healthy: true, ActivePrefillBlocks: 100}
	}
	rt := New(Options{State: st, Seed: 1}) // kvroute, its own Rates
	for range 20 {
		rt.Rates().Observe("r0", replicaSample(4000, 20*time.Millisecond, 4000, 50, 0))
		rt.Rates().Observe("r1", replicaSample(16000, 10*time.Millisecond, 4000, 50, 0))
		rt.Rates().Observe("r2", replicaSample(8000, 10*time.Millisecond, 4000, 50, 0))
	}
	req := Request{Model: model, Tokens: seq(64*16, 7)}
	d, err := rt.Decide(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if d.Replica != "r1" {
		t.Fatalf("picked %s, want the fastest learner r1; candidates %+v", d.Replica, d.Candidates)
	}
	if l := d.Candidates[0].Load; math.Abs(l.PrefillRate-4000/1.01) > 40 || l.DecodeStep < 19*time.Millisecond || l.DecodeStep > 21*time.Millisecond {
		t.Fatalf("r0's load %+v, want its learned 4000 tokens/s and 20 ms", l)
	}
	// A State that reports a speed of its own wins over the learner.
	st.loads["r0"] = load.Load{Healthy: true, ActivePrefillBlocks: 100, PrefillRate: 64000, DecodeStep: time.Millisecond}
	if d, err = rt.Decide(t.Context(), req); err != nil || d.Replica != "r0" {
		t.Fatalf("picked %s (%v), want r0 at the State's 64000 tokens/s", d.Replica, err)
	}
}

// One response whose tokens came bunched (a 1 ms inter-token time on a
// replica stepping at 8 ms) must not lower, for good, the step every
// prefill sample subtracts: below half the replica's learned step it is
// not a step.
func TestRatesIgnoreAStepOutlier(t *testing.T) {
	r := NewRates()
	const rate = 16000.0
	for i := range 400 {
		n := 1024 + 97*i%2000
		s := replicaSample(rate, 8*time.Millisecond, n, 50, 0)
		if i == 20 {
			s.E2E = s.TTFT + time.Millisecond
			s.Output = 2
		}
		r.Observe("a", s)
	}
	got, _ := r.Get("a")
	if got.PrefillTokensPerSec < rate*0.99 || got.PrefillTokensPerSec > rate*1.001 {
		t.Fatalf("learned %.0f tokens/s after a step outlier, want %.0f", got.PrefillTokensPerSec, rate)
	}
}

// A fleet's first answers can decode beside long prefills: the shortest
// step seen so far is then a step that carried a prefill chunk, and a
// prefill sample read against it is far above the replica's speed (a
// trace opening with 20-50k-token prompts: 0.52 s taken off 1.56 s, 22,850
// tokens/s read on a 16,000 replica). The upper envelope kept it for
// hundreds of samples; once a replica shows a step that only decodes, the
// estimate is held to what that sample reads with it.
func TestRatesFirstSamplesAgainstALongStep(t *testing.T) {
	const rate = 16000.0
	r := NewRates()
	// r0's first answer decoded beside a long prefill: 0.5 s steps, the
	// fleet's shortest so far.
	s := replicaSample(rate, 8*time.Millisecond, 24000, 4, 0)
	s.E2E = s.TTFT + 3*500*time.Millisecond
	r.Observe("r0", s)
	if got, _ := r.Get("r0"); got.PrefillTokensPerSec < 1.3*rate {
		t.Fatalf("setup: the first sample read %.0f tokens/s; the case needs it read against the 0.5 s step", got.PrefillTokensPerSec)
	}
	// r1 answers a short prompt and decodes alone: 8 ms steps.
	r.Observe("r1", replicaSample(rate, 8*time.Millisecond, 500, 50, 0))
	if got, _ := r.Get("r0"); got.PrefillTokensPerSec > rate*1.001 || got.PrefillTokensPerSec < rate*0.99 {
		t.Errorf("after the fleet showed an 8 ms step r0's prefill rate is %.0f, want its %.0f", got.PrefillTokensPerSec, rate)
	}
	// Later samples, queued or not, keep it there.
	for i := range 50 {
		r.Observe("r0", replicaSample(rate, 8*time.Millisecond, 4000+100*i, 20, time.Duration(i%3)*50*time.Millisecond))
	}
	if got, _ := r.Get("r0"); got.PrefillTokensPerSec > rate*1.001 || got.PrefillTokensPerSec < rate*0.98 {
		t.Errorf("after 50 more samples r0's prefill rate is %.0f, want %.0f", got.PrefillTokensPerSec, rate)
	}
}

// The token interval is the samples' plain mean, prefill chunks included,
// where the decode step keeps their lower envelope: half the requests
// decoding beside prefill at 30 ms a token, half alone at 10 ms.
func TestRatesTokenIntervalIsTheMean(t *testing.T) {
	r := NewRates()
	for i := range 400 {
		itl := 10 * time.Millisecond
		if i%2 == 1 {
			itl = 30 * time.Millisecond
		}
		r.Observe("a", RateSample{Uncached: 2000, TTFT: 150 * time.Millisecond, E2E: 150*time.Millisecond + 100*itl, Output: 101})
	}
	got, ok := r.Get("a")
	if !ok {
		t.Fatal("nothing learned")
	}
	if d := got.TokenInterval - 20*time.Millisecond; d > 2*time.Millisecond || d < -2*time.Millisecond {
		t.Errorf("token interval %v, want about 20ms (the mean of 10 and 30)", got.TokenInterval)
	}
	if got.DecodeStep > 15*time.Millisecond {
		t.Errorf("decode step %v, want near the lower envelope's 10ms", got.DecodeStep)
	}
}

// warmRates is a learner that has seen 50 requests on replica "a", which
// prefills 15,000 tokens/s and steps every 8 ms.
func warmRates() *Rates {
	r := NewRates()
	for range 50 {
		r.Observe("a", replicaSample(15000, 8*time.Millisecond, 3000, 40, 0))
	}
	return r
}

// A replica that becomes three times slower (a GPU that throttles) is
// followed within RateShiftSamples prefill samples and RateShiftSteps
// inter-token times, not hundreds: each sample reads it far below the
// estimate.
func TestRatesFollowASharpSlowdown(t *testing.T) {
	r := warmRates()
	before, _ := r.Get("a")
	if before.PrefillTokensPerSec < 14000 || before.DecodeStep > 9*time.Millisecond {
		t.Fatalf("before: %+v, want about 15000 tokens/s and 8 ms", before)
	}
	// Requests of alternating size, so that the run's best sample is
	// the one the estimate restarts at.
	for i := range RateShiftSamples - 1 {
		r.Observe("a", replicaSample(5000, 24*time.Millisecond, 2000+1000*(i%2), 40, 0))
	}
	mid, _ := r.Get("a")
	if mid.PrefillTokensPerSec < 0.9*before.PrefillTokensPerSec {
		t.Fatalf("after %d slow samples the estimate moved to %.0f: the run of %d restarts it, no fewer", RateShiftSamples-1, mid.PrefillTokensPerSec, RateShiftSamples)
	}
	r.Observe("a", replicaSample(5000, 24*time.Millisecond, 3000, 40, 0))
	got, _ := r.Get("a")
	if got.PrefillTokensPerSec > 5000*1.05 || got.PrefillTokensPerSec < 5000*0.9 {
		t.Fatalf("after %d slow samples the prefill rate is %.0f, want about 5000", RateShiftSamples, got.PrefillTokensPerSec)
	}
	// Each request above also gave a decode sample: RateShiftSamples of
	// the RateShiftSteps the step needs.
	if got.DecodeStep > 12*time.Millisecond {
		t.Fatalf("after %d slow steps the decode step is %v: too early a restart", RateShiftSamples, got.DecodeStep)
	}
	for range RateShiftSteps - RateShiftSamples {
		r.Observe("a", replicaSample(5000, 24*time.Millisecond, 500, 40, 0)) // decode samples only
	}
	got, _ = r.Get("a")
	if d := got.DecodeStep - 24*time.Millisecond; d > time.Millisecond || d < -time.Millisecond {
		t.Fatalf("after %d slow steps the decode step is %v, want 24 ms", RateShiftSteps, got.DecodeStep)
	}
	// Faster again: the envelope rises within a few samples, as before.
	for range 12 {
		r.Observe("a", replicaSample(15000, 8*time.Millisecond, 3000, 40, 0))
	}
	got, _ = r.Get("a")
	if got.PrefillTokensPerSec < 14000 || got.DecodeStep > 9*time.Millisecond {
		t.Fatalf("restored: %+v, want about 15000 tokens/s and 8 ms again", got)
	}
}

// A run of slow samples that one sample near the estimate interrupts is
// queueing, not a slower replica: the estimate keeps its slow weight.
func TestRatesShiftNeedsAnUnbrokenRun(t *testing.T) {
	r := warmRates()
	for i := range 10 * RateShiftSamples {
		if i%(RateShiftSamples-1) == 0 {
			r.Observe("a", replicaSample(15000, 8*time.Millisecond, 3000, 40, 0))
		} else {
			// Queued 1.5 s behind work the router did not see: 1,760
			// tokens/s.
			r.Observe("a", replicaSample(15000, 8*time.Millisecond, 3000, 40, 1500*time.Millisecond))
		}
		if got, _ := r.Get("a"); got.PrefillTokensPerSec < 0.3*15000 {
			t.Fatalf("sample %d: interrupted runs restarted the estimate: %.0f tokens/s", i, got.PrefillTokensPerSec)
		}
	}
	got, _ := r.Get("a")
	// The slow weight alone: 150 low samples move it part of the way.
	if got.PrefillTokensPerSec > 14000 {
		t.Fatalf("the low samples did not move the estimate at all: %.0f", got.PrefillTokensPerSec)
	}
}

// A replica at light load sends a sample a minute: RateShiftMinSamples
// far-slower samples in a row whose first tokens span RateShiftSpan
// restart the estimate, as RateShiftSamples would. As many within a
// shorter span do not (a healthy replica's burst of unseen queueing comes
// back within seconds), nor do samples without a time, nor a run a normal
// sample broke.
func TestRatesSparseFarSlowerSamplesRestart(t *testing.T) {
	t0 := time.Unix(1000, 0)
	slow := func(at time.Duration) RateSample {
		s := replicaSample(800, 8*time.Millisecond, 3000, 40, 0) // a GPU slowed to a twentieth
		if at >= 0 {
			s.At = t0.Add(at)
		}
		return s
	}
	for _, tt := range []struct {
		name    string
		samples []RateSample
		restart bool
	}{
		{"three over a minute", []RateSample{slow(0), slow(35 * time.Second), slow(70 * time.Second)}, true},
		{"out of order", []RateSample{slow(40 * time.Second), slow(0), slow(65 * time.Second)}, true},
		{"three within 40 s", []RateSample{slow(0), slow(20 * time.Second), slow(40 * time.Second)}, false},
		{"two over two minutes", []RateSample{slow(0), slow(2 * time.Minute)}, false},
		{"no times", []RateSample{slow(-1), slow(-1), slow(-1), slow(-1)}, false},
		{"broken by a normal sample", []RateSample{slow(0), slow(35 * time.Second),
			replicaSample(15000, 8*time.Millisecond, 3000, 40, 0), slow(70 * time.Second)}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := warmRates()
			for _, s := range tt.samples {
				r.Observe("a", s)
			}
			got, _ := r.Get("a")
			if restarted := got.PrefillTokensPerSec < 1000; restarted != tt.restart {
				t.Fatalf("learned %.0f tokens/s after the samples: restarted %v, want %v", got.PrefillTokensPerSec, restarted, tt.restart)
			}
		})
	}
}

// A replica whose KV memory binds makes its requests wait for blocks: slow
// first tokens sent while it did (RateSample.MemoryBound) never restart the
// estimate, and one of them breaks a run of slow samples; they still move
// it at the slow weight.
func TestRatesMemoryBoundSamplesNeverRestart(t *testing.T) {
	r := warmRates()
	before, _ := r.Get("a")
	for range 4 * RateShiftSamples {
		s := replicaSample(15000, 8*time.Millisecond, 3000, 40, 1500*time.Millisecond) // 1.5 s waiting for memory
		s.MemoryBound = true
		r.Observe("a", s)
	}
	got, _ := r.Get("a")
	if got.PrefillTokensPerSec < RateShiftRatio*before.PrefillTokensPerSec {
		t.Fatalf("samples sent while memory bound restarted the estimate: %.0f -> %.0f tokens/s", before.PrefillTokensPerSec, got.PrefillTokensPerSec)
	}
	if got.PrefillTokensPerSec > 0.95*before.PrefillTokensPerSec {
		t.Fatalf("samples sent while memory bound did not move the estimate at all: %.0f", got.PrefillTokensPerSec)
	}
	// A run one sample short, then one taken while memory bound: the run
	// starts over.
	for range RateShiftSamples - 1 {
		r.Observe("a", replicaSample(3000, 8*time.Millisecond, 3000, 40, 0))
	}
	s := replicaSample(3000, 8*time.Millisecond, 3000, 40, 0)
	s.MemoryBound = true
	r.Observe("a", s)
	r.Observe("a", replicaSample(3000, 8*time.Millisecond, 3000, 40, 0))
	if got, _ = r.Get("a"); got.PrefillTokensPerSec < RateShiftRatio*before.PrefillTokensPerSec {
		t.Fatalf("a run broken by a memory-bound sample restarted the estimate: %.0f", got.PrefillTokensPerSec)
	}
	for range RateShiftSamples - 1 {
		r.Observe("a", replicaSample(3000, 8*time.Millisecond, 3000, 40, 0))
	}
	if got, _ = r.Get("a"); got.PrefillTokensPerSec > 3000*1.05 {
		t.Fatalf("a whole run not memory bound did not restart the estimate: %.0f, want about 3000", got.PrefillTokensPerSec)
	}
}

// provenRate holds a replica's speed to what its oldest streamed request
// still waiting for a first token proves, once that is below
// RateShiftRatio of the learned speed, and leaves unknown speeds unknown.
func TestProvenRate(t *testing.T) {
	base := load.Load{PrefillRate: 16000, DecodeStep: 10 * time.Millisecond}
	for _, tt := range []struct {
		name   string
		wait   time.Duration
		blocks float64
		want   float64
	}{
		{"nothing waits", 0, 0, 16000},
		{"above half", 2020 * time.Millisecond, 320, 16000},          // 320 blocks of 64 tokens in 2 s: 10,240 tokens/s
		{"below half", 2020 * time.Millisecond, 100, 100 * 64 / 2.0}, // 3,200
		{"waiting on nothing", 4020 * time.Millisecond, 0, 16},       // one block in 4 s
		{"a short wait", 1900 * time.Millisecond, 1, 16000},          // below RateProofWait: proves nothing
	} {
		l := base
		l.OldestPrefillWait, l.OldestPrefillBlocks = tt.wait, tt.blocks
		if got := provenRate(l, 64); math.Abs(got-tt.want) > 1e-6*tt.want {
			t.Errorf("%s: %.1f, want %.1f", tt.name, got, tt.want)
		}
	}
	// The token interval, steps with their prefill chunks, is what two
	// steps take off the wait when it is known.
	l := base
	l.TokenInterval, l.OldestPrefillWait, l.OldestPrefillBlocks = 50*time.Millisecond, 2100*time.Millisecond, 100
	if got := provenRate(l, 64); math.Abs(got-3200) > 1e-6 {
		t.Errorf("with a 50 ms token interval: %.1f, want 3200", got)
	}
	// A replica whose engine preempts, or whose cache is nearly full:
	// the wait may be for memory, not prefill, and proves nothing of its
	// speed.
	for _, bound := range []load.Load{{Preempting: true}, {KVUsage: load.MemoryBoundUsage}} {
		l = base
		l.OldestPrefillWait, l.OldestPrefillBlocks = 2020*time.Millisecond, 100
		l.Preempting, l.KVUsage = bound.Preempting, bound.KVUsage
		if got := provenRate(l, 64); got != 16000 {
			t.Errorf("memory bound (%+v): %.1f, want the learned 16000", bound, got)
		}
	}
	l = base
	l.OldestPrefillWait, l.OldestPrefillBlocks, l.KVUsage = 2020*time.Millisecond, 100, 0.85
	if got := provenRate(l, 64); got != 3200 {
		t.Errorf("at 0.85 KV usage, not preempting: %.1f, want the bound 3200", got)
	}
	unknown := load.Load{OldestPrefillWait: time.Minute, OldestPrefillBlocks: 1}
	if got := provenRate(unknown, 64); got != 0 {
		t.Errorf("a speed not learned yet became %.1f", got)
	}
}

// A replica whose oldest streamed request has waited far longer than its
// learned speed allows loses the pick to an equal replica before any of its
// slow first tokens comes back.
func TestDecideAvoidsAReplicaItsWaitsProveSlow(t *testing.T) {
	st := fleet(2)
	for _, r := range st.reps {
		st.loads[r.ID] = load.Load{Healthy: true, ActivePrefillBlocks: 20}
	}
	rt := New(Options{State: st, Seed: 1})
	for range 20 {
		rt.Rates().Observe("r0", replicaSample(16000, 10*time.Millisecond, 4000, 50, 0))
		rt.Rates().Observe("r1", replicaSample(15000, 10*time.Millisecond, 4000, 50, 0))
	}
	req := Request{Model: model, Tokens: seq(64*16, 7)}
	d, err := rt.Decide(t.Context(), req)
	if err != nil || d.Replica != "r0" {
		t.Fatalf("picked %s (%v), want the faster r0", d.Replica, err)
	}
	// r0's oldest request, 20 blocks ahead of it and 20 its own, has
	// waited 5 s: r0 prefills at most 40×16 tokens in 5 s, less two
	// 10 ms steps.
	st.loads["r0"] = load.Load{Healthy: true, ActivePrefillBlocks: 20, OldestPrefillWait: 5 * time.Second, OldestPrefillBlocks: 40}
	d, err = rt.Decide(t.Context(), req)
	if err != nil || d.Replica != "r1" {
		t.Fatalf("picked %s (%v), want r1: r0's waiting request proves it slow; candidates %+v", d.Replica, err, d.Candidates)
	}
	if l := d.Candidates[0].Load; l.PrefillRate > 200 {
		t.Fatalf("r0's prefill rate in the decision is %.0f, want the proven bound (about 128)", l.PrefillRate)
	}
}

// A cap many requests carry is learned as the mean output they generate,
// never above the cap; exact outputs, and max_tokens values not seen
// often enough, stay what the request says; no max_tokens is learned the
// same way; impossible samples are ignored.
func TestRatesExpectOutput(t *testing.T) {
	r := NewRates()
	sample := func(maxTokens, out int) RateSample {
		return RateSample{TTFT: time.Second, E2E: 2 * time.Second, Output: out, MaxTokens: maxTokens}
	}
	if got := r.ExpectOutput(32000); got != 32000 {
		t.Fatalf("nothing learned: %d, want the cap", got)
	}
	if got := r.ExpectOutput(0); got != 0 {
		t.Fatalf("nothing learned, no max_tokens: %d, want 0", got)
	}
	for i := range OutputMinSamples - 1 {
		r.Observe("a", sample(32000, 200+100*i))
	}
	if got := r.ExpectOutput(32000); got != 32000 {
		t.Fatalf("%d samples: %d, want the cap until %d", OutputMinSamples-1, got, OutputMinSamples)
	}
	r.Observe("b", sample(32000, 900)) // 200..900: mean 550
	if got := r.ExpectOutput(32000); got != 550 {
		t.Fatalf("learned cap: %d, want the mean 550", got)
	}
	// Later samples move it by OutputWeight.
	for range 200 {
		r.Observe("a", sample(32000, 2000))
	}
	if got := r.ExpectOutput(32000); got < 1990 || got > 2000 {
		t.Fatalf("after 200 outputs of 2000: %d", got)
	}
	// Exact clients: every output is its max_tokens.
	for range 3 * OutputMinSamples {
		r.Observe("a", sample(300, 300))
	}
	if got := r.ExpectOutput(300); got != 300 {
		t.Errorf("exact: %d, want 300", got)
	}
	if got := r.ExpectOutput(301); got != 301 {
		t.Errorf("unseen value: %d, want 301", got)
	}
	// No max_tokens: the mean output of such requests.
	for range OutputMinSamples {
		r.Observe("a", sample(0, 64))
	}
	if got := r.ExpectOutput(0); got != 64 {
		t.Errorf("no max_tokens: %d, want 64", got)
	}
	// An output beyond its max_tokens, a negative one and a sample with no
	// first token teach nothing.
	for range 4 * OutputMinSamples {
		r.Observe("a", sample(100, 150))
		r.Observe("a", sample(100, -1))
		r.Observe("a", RateSample{Output: 5, MaxTokens: 100})
	}
	if got := r.ExpectOutput(100); got != 100 {
		t.Errorf("impossible samples: %d, want 100", got)
	}
	if got := r.ExpectOutput(-5); got != 0 {
		t.Errorf("negative max_tokens: %d", got)
	}
}

// The learner keeps at most outputKeys max_tokens values, forgetting the
// one seen least recently.
func TestRatesExpectOutputForgetsOldValues(t *testing.T) {
	r := NewRates()
	learn := func(maxTokens int) {
		for range OutputMinSamples {
			r.Observe("a", RateSample{TTFT: time.Second, E2E: time.Second, Output: 7, MaxTokens: maxTokens})
		}
	}
	learn(1000)
	for v := range outputKeys - 1 {
		learn(2000 + v)
	}
	learn(1000) // seen again: now the most recent
	learn(5000) // one value too many: 2000, the oldest, goes
	if n := len(r.out.byMax); n != outputKeys {
		t.Fatalf("%d values kept, want %d", n, outputKeys)
	}
	if got := r.ExpectOutput(1000); got != 7 {
		t.Errorf("recently seen value forgotten: %d", got)
	}
	if got := r.ExpectOutput(2000); got != 2000 {
		t.Errorf("oldest value kept: %d, want it forgotten (2000)", got)
	}
	if got := r.ExpectOutput(5000); got != 7 {
		t.Errorf("newest value: %d", got)
	}
}
