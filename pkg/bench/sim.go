package bench

import (
	"container/heap"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/pkg/engine"
	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/policy"
	"github.com/kvroute/kvroute/pkg/route"
)

// DefaultModel is the model name the simulated fleet serves.
const DefaultModel = "sim-model"

// DefaultEngine is one replica of the simulated fleet: an 8B-class dense
// model (Llama-3.1-8B shape: 32 layers, 8 KV heads of 128 dims, bf16, so
// 128 KiB of KV per token) on one 80 GB H100 at 0.9 memory utilisation.
// About 50 GB is left for the KV cache: 24,576 blocks of 16 tokens (393K
// tokens). Prefill runs at 16,000 uncached tokens/s (about 16 GFLOP a
// token at ~40% of the GPU's dense bf16 peak, attention included); a decode
// step costs 8 ms plus 0.08 ms per sequence in the batch (weights read once
// a step, KV per sequence). vLLM's chunked-prefill budget of 8,192 tokens
// and 256 sequences. The context is extended to 192K tokens so that every
// request of the Mooncake trace (up to 191K prompt tokens) fits. Evicted
// blocks are offloaded to a CPU tier of 131,072 blocks (2M tokens, 256 GiB
// of host memory: a DGX H100's 2 TB shared by its 8 GPUs), as vLLM's
// offloading connector or LMCache provide, and reloaded at ten times the
// prefill speed (20 GB/s over PCIe).
func DefaultEngine() engine.Config {
	return engine.Config{
		BlockSize:           16,
		NumGPUBlocks:        24576,
		MaxModelLen:         196608,
		MaxNumSeqs:          256,
		MaxNumBatchedTokens: 8192,
		NumCPUBlocks:        131072,
		PrefillTokensPerSec: 16000,
		StepTime:            8 * time.Millisecond,
		StepTimePerSeq:      80 * time.Microsecond,
		Model:               DefaultModel,
	}
}

// FleetConfig describes the simulated fleet and the router's view of it.
type FleetConfig struct {
	// Replicas is the number of engines (default 8).
	Replicas int
	// Engine configures every replica (zero: DefaultEngine).
	Engine engine.Config
	// EventDelay is how long a published KV-event batch takes to reach the
	// router's index.
	EventDelay time.Duration
	// EventLoss is the probability in [0, 1) that a published batch never
	// arrives (no replay: the index stays stale until later events).
	EventLoss float64
	// PendingTTL > 0 gives the router a memory of the prefixes it just
	// sent (route.Options.Pending) for this long, as kvroute's
	// routing.pending_ttl does (default route.DefaultPendingTTL, as is
	// kvbench's -pending-ttl); 0 runs without one. Only the kvroute
	// policy reads it.
	PendingTTL time.Duration
	// ScrapeInterval is the age bound of the engines' scraped figures
	// (running, waiting, KV usage) the router sees (default 200 ms, the
	// scraper's default).
	ScrapeInterval time.Duration
	// BinWidth is the width of the per-replica load-over-time bins
	// (default 5 s).
	BinWidth time.Duration
	// NoFidelity turns the closed-loop trust off (Trust always 1).
	NoFidelity bool
	// Seed seeds the router's tie-breaks and the event loss.
	Seed uint64
	// Completions has clients send their prompts as /v1/completions
	// requests, as kvbench live's client does, instead of chat messages:
	// no request then carries a conversation key (route.SessionKey
	// derives one from a chat's opening messages only), so a session
	// without a header is keyed by its user field, if any, and one with
	// neither reaches the router without a key on every turn (the router
	// then finds the conversation its prompt continues, route's prompt
	// book).
	Completions bool
	// Speeds makes the fleet mixed: replica i runs at Speeds[i mod
	// len(Speeds)] times Engine's speed, its prefill tokens per second
	// multiplied and its decode step times divided by it, as a newer or
	// older GPU generation serving the same model would (nil: every
	// replica at Engine's speed). Memory is the same on every replica.
	Speeds []float64
	// SpeedChanges change replicas' speeds during the run (a GPU that
	// throttles, a neighbour that takes a share of it): each sets its
	// replica's speed multiplier, as Speeds does, from its time on. The
	// workload's utilization is still counted on the fleet's starting
	// speeds, so a replica slowed adds load the fleet did not plan for. A
	// request that finishes after its replica's change has its IdealTTFT
	// at the new speed.
	SpeedChanges []SpeedChange
	// MaxTokens is what clients send as max_tokens: 0, each turn's exact
	// output (as kvbench live's client and vLLM's benchmark clients do,
	// with ignore_eos); N > 0, a fixed cap, N or the turn's output if
	// that is larger (an SDK's default, an agent harness's 32k), the
	// engine still stopping at the turn's output as it would at an end
	// of sequence; -1, none (the engine's limit is the context). The
	// router knows a request's output only as what its max_tokens says.
	MaxTokens int
}

// SpeedChange sets Replica's speed multiplier (in (0, 100], see
// FleetConfig.Speeds) to Speed from At after the workload's first arrival
// on: the steps that start from then on run at it.
type SpeedChange struct {
	Replica int
	At      time.Duration
	Speed   float64
}

// CheckSpeed reports the first of speeds that is not a replica speed
// multiplier FleetConfig.Speeds takes: one in (0, 100].
func CheckSpeed(speeds ...float64) error {
	for _, sp := range speeds {
		if !(sp > 0 && sp <= 100) {
			return fmt.Errorf("replica speed %v must be in (0, 100]", sp)
		}
	}
	return nil
}

// speed is replica i's speed multiplier (see Speeds).
func (c FleetConfig) speed(i int) float64 {
	if len(c.Speeds) == 0 {
		return 1
	}
	return c.Speeds[i%len(c.Speeds)]
}

// meanSpeed is the replicas' mean speed multiplier.
func (c FleetConfig) meanSpeed() float64 {
	sum := 0.0
	for i := range c.Replicas {
		sum += c.speed(i)
	}
	return sum / float64(max(c.Replicas, 1))
}

// replicaEngine is replica i's engine configuration: Engine at its speed.
func (c FleetConfig) replicaEngine(i int) engine.Config {
	return c.Engine.AtSpeed(c.speed(i))
}

func (c FleetConfig) withDefaults() (FleetConfig, error) {
	if c.Replicas == 0 {
		c.Replicas = 8
	}
	if c.Engine == (engine.Config{}) {
		c.Engine = DefaultEngine()
	}
	c.Engine = c.Engine.Defaults()
	if c.ScrapeInterval == 0 {
		c.ScrapeInterval = 200 * time.Millisecond
	}
	if c.BinWidth == 0 {
		c.BinWidth = 5 * time.Second
	}
	switch {
	case c.Replicas < 1:
		return c, fmt.Errorf("%w: replicas %d must be at least 1", ErrSim, c.Replicas)
	case !(c.EventLoss >= 0 && c.EventLoss < 1):
		return c, fmt.Errorf("%w: event loss %v must be in [0, 1)", ErrSim, c.EventLoss)
	case c.EventDelay < 0 || c.ScrapeInterval < 0 || c.BinWidth < 0 || c.PendingTTL < 0:
		return c, fmt.Errorf("%w: delays and widths must not be negative", ErrSim)
	case c.MaxTokens < -1:
		return c, fmt.Errorf("%w: max_tokens %d must be -1 (none), 0 (the exact output) or a cap", ErrSim, c.MaxTokens)
	}
	if err := CheckSpeed(c.Speeds...); err != nil {
		return c, fmt.Errorf("%w: %w", ErrSim, err)
	}
	for _, ch := range c.SpeedChanges {
		if ch.Replica < 0 || ch.Replica >= c.Replicas || ch.At < 0 {
			return c, fmt.Errorf("%w: speed change of replica %d at %v: no such replica or a negative time", ErrSim, ch.Replica, ch.At)
		}
		if err := CheckSpeed(ch.Speed); err != nil {
			return c, fmt.Errorf("%w: %w", ErrSim, err)
		}
	}
	if err := c.Engine.Validate(); err != nil {
		return c, fmt.Errorf("%w: %w", ErrSim, err)
	}
	return c, nil
}

// ErrSim classifies simulation setup errors.
var ErrSim = errors.New("sim")

// RequestResult is one finished request.
type RequestResult struct {
	Session, Turn int
	Replica       int
	Arrival       time.Duration
	TTFT, E2E     time.Duration
	PromptTokens  int
	// CachedTokens were served from the engine's prefix cache.
	CachedTokens int
	// PredictedTokens are the cached tokens the router's index predicted
	// on the picked replica.
	PredictedTokens int
	// CeilingTokens would have been cached by one infinite cache holding
	// every block any replica had computed or scheduled for computing
	// (prompt or output) by the time this request was first scheduled:
	// what a perfect router could have given it on this run's timing (see
	// sim.computed).
	CeilingTokens int
	OutputTokens  int
	// MaxTokens is the max_tokens its client sent (0: none; see
	// FleetConfig.MaxTokens), as a live router learns outputs against it.
	MaxTokens   int
	Preemptions int
	// QueuedTokens are the uncached prompt tokens the router estimated
	// were queued for prefill ahead of the request when it sent it
	// (route.Decision.QueuedTokens), as a live router feeds its rate
	// learner.
	QueuedTokens int
	// SentMemoryBound is the picked replica's load.Load.MemoryBound() at
	// the decision (route.RateSample.MemoryBound).
	SentMemoryBound bool
	// IdealTTFT is the request's TTFT alone on an idle replica with the
	// same cached tokens: its uncached tokens prefilled in budget-sized
	// chunks, one step each (no queueing, no batch).
	IdealTTFT time.Duration
	// Truncated is set when the prompt was cut to fit MaxModelLen.
	Truncated bool
	Reason    string
	// SessionKey is the session key the router derived for the request
	// (route.SessionKey; "" for none).
	SessionKey string
}

// ReplicaResult is one replica's totals.
type ReplicaResult struct {
	ID       string
	Requests int
	// Busy is the time the replica spent in steps; Work is the part of it
	// that depends on what was batched (prefill, reloads and per-sequence
	// decode time: the step time minus its fixed cost), the replica's
	// share of the fleet's compute.
	Busy          time.Duration
	Work          time.Duration
	PrefillTokens int64
	DecodeTokens  int64
	Preemptions   int64
	// WorkBins is Work's fraction of each BinWidth-wide bin of time.
	WorkBins []float64
}

// Run is one policy's simulation of one workload.
type Run struct {
	Policy   string
	Workload string
	// Requests are in finish order.
	Requests []RequestResult
	Replicas []ReplicaResult
	BinWidth time.Duration
	// Makespan is the last finish time.
	Makespan time.Duration
	// EventsApplied and EventsLost count KV-event batches.
	EventsApplied, EventsLost int
	// Capacity is the fleet's prefill speed, tokens per second
	// (FleetConfig.PrefillCapacity).
	Capacity float64
}

type evKind uint8

// Same-time order: speed changes, a step's results, then index
// deliveries, then arrivals (so a decision sees everything that happened
// at that instant), then new steps (which see the arrivals and speeds).
const (
	evRetime evKind = iota // a replica's speed changes (FleetConfig.SpeedChanges)
	evDone
	evDeliver
	evArrival
	evStep
)

type event struct {
	at      time.Duration
	kind    evKind
	seq     uint64
	replica int
	res     *engine.StepResult
	sess    int
	turn    int
	speed   float64 // evRetime's new speed multiplier
}

type evHeap []*event

func (h evHeap) Len() int { return len(h) }
func (h evHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.at != b.at {
		return a.at < b.at
	}
	if a.kind != b.kind {
		return a.kind < b.kind
	}
	return a.seq < b.seq
}
func (h evHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *evHeap) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *evHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// live is an in-flight request.
type live struct {
	sess, turn int
	replica    int
	prompt     []uint32
	outputs    []uint32 // collected only when a later turn needs them
	keepOut    bool
	maxTokens  int // what the client sent as max_tokens
	handle     *load.Handle
	predicted  int      // cached tokens the index showed on the pick (RequestResult.PredictedTokens)
	credited   int      // predicted plus what the router vouched for there (route.Candidate.Vouched): what the closed loop checks
	hashes     []uint64 // the prompt's block hashes relevance predicted
	truncated  bool
	reason     string
	key        string
	// opener is the first request of its conversation (promptHash: its
	// prompt's hash); its answer opens the conversation.
	opener     bool
	promptHash uint64
	// queued are the uncached tokens the router estimated were queued
	// ahead of it (route.Decision.QueuedTokens).
	queued int
	// memBound is the picked replica's load.Load.MemoryBound() then.
	memBound bool
}

type replica struct {
	id       string
	eng      *engine.Engine
	stepping bool // a step is running (its done event is queued)
	queued   bool // a step start is queued
	res      ReplicaResult
	scraped  engine.Stats
	scrapeAt time.Duration
	scrapeOK bool
	// preemptAt is the scrape that first saw the engine's preemption
	// count higher than the scrape before; preempted says one did.
	preemptAt time.Duration
	preempted bool
	// gapAt is when a batch of this replica's with stores in it was last
	// lost; gapped says one was at all (see simState.ViewGaps).
	gapAt  time.Duration
	gapped bool
}

type sim struct {
	ledger  bool // the policy reads the tracker's decoding ledger (policy.ReadsReleases): requests carry their expected output
	cfg     FleetConfig
	w       *Workload
	now     time.Duration
	q       evHeap
	spare   []*event // popped events, reused by push
	seq     uint64
	reps    []*replica
	routes  []route.Replica
	ids     map[index.ReplicaID]int
	idx     *index.Index
	feed    *applier
	rel     *relevance // nil: every event reaches the index
	tracker *load.Tracker
	fid     *load.Fidelity
	router  *route.Router
	loss    *rand.Rand
	live    []map[engine.ReqID]*live
	history [][]uint32           // per session: the last prompt plus its outputs
	conv    []int32              // per session: its conversation (see conversations)
	opened  []bool               // per conversation: its first request has arrived
	opening [][]byte             // per conversation: its opening messages (see openingMessages)
	blocks  hashTable[blockInfo] // per engine block hash: see blockInfo
	run     *Run
}

// Simulate runs w through a fleet of engines in simulated time, with pol
// deciding through route.Decide over a real index fed by the engines' KV
// events. It is deterministic: the same workload, policy (freshly built)
// and config give the same Run. ctx cancels a long run.
func Simulate(ctx context.Context, w *Workload, pol policy.Policy, cfg FleetConfig) (*Run, error) {
	return simulate(ctx, w, pol, cfg, nil)
}

// pendingWeigher is a policy that weighs policy.Candidate.Pending (the
// in-flight prefixes route.Options.Pending reports), as kvroute does.
type pendingWeigher interface {
	WeighsPending() bool
}

// simulate is Simulate with w's relevance prepared for cfg's engines (nil:
// prepared here).
func simulate(ctx context.Context, w *Workload, pol policy.Policy, cfg FleetConfig, pre *prepared) (*Run, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &sim{
		cfg:     cfg,
		w:       w,
		ids:     make(map[index.ReplicaID]int),
		idx:     index.New(index.Config{}),
		loss:    rand.New(rand.NewPCG(cfg.Seed, 0x6c6f7373)),
		history: make([][]uint32, len(w.Sessions)),
		run:     &Run{Policy: pol.Name(), Workload: w.Name, BinWidth: cfg.BinWidth, Capacity: cfg.PrefillCapacity()},
	}
	s.conv = conversations(w)
	s.opened = make([]bool, len(w.Sessions))
	s.opening = make([][]byte, len(w.Sessions))
	s.feed = newApplier(s.idx, cfg.Engine.Model)
	// The block table can be hundreds of MB outside the Go heap: give it
	// back as soon as the run ends.
	defer s.blocks.free()
	if filterIrrelevant {
		own := pre == nil
		if own {
			if pre, err = prepare(w, cfg.Engine); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrSim, err)
			}
		} else if pre.eng.Config() != cfg.Engine {
			return nil, fmt.Errorf("%w: internal: relevance prepared for other engines", ErrSim)
		}
		s.rel = newRelevance(pre, &s.blocks)
		s.feed.needed, s.feed.prefetch = s.rel.needed, s.rel.prefetch
		if own {
			pre.blocks.free() // copied; nothing else reads it
		}
	}
	s.tracker, err = load.NewTracker(nil)
	if err != nil {
		return nil, err
	}
	s.tracker.SetClock(func() time.Time { return time.Unix(0, int64(s.now)) })
	if !cfg.NoFidelity {
		s.fid, err = load.NewFidelity(load.FidelityConfig{}, nil)
		if err != nil {
			return nil, err
		}
	}
	for i := range cfg.Replicas {
		// Every replica shares one engine seed, as a fleet started with a
		// fixed PYTHONHASHSEED does: generated text then depends only on
		// the prompt and the request's sampling seed (requestSample), so
		// every policy sees the same conversations.
		e, err := engine.New(cfg.replicaEngine(i), 1)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSim, err)
		}
		id := "r" + strconv.Itoa(i)
		s.reps = append(s.reps, &replica{id: id, eng: e, res: ReplicaResult{ID: id}})
		s.routes = append(s.routes, route.Replica{ID: index.ReplicaID(id), Address: id, Model: cfg.Engine.Model, BlockSize: cfg.Engine.BlockSize})
		s.ids[index.ReplicaID(id)] = i
		s.live = append(s.live, make(map[engine.ReqID]*live))
	}
	var pending *route.ApproxIndex
	if _, weighs := pol.(pendingWeigher); cfg.PendingTTL > 0 && weighs {
		// Only a policy that weighs in-flight prefixes gets the memory:
		// for any other, keeping it costs CPU and changes nothing.
		pending = route.NewApproxIndex(route.ApproxConfig{TTL: cfg.PendingTTL})
	}
	s.ledger = policy.ReadsReleases(pol)
	s.router = route.New(route.Options{
		Matcher:   s.idx,
		State:     (*simState)(s),
		Policy:    pol,
		Seed:      cfg.Seed,
		Fallbacks: -1,
		Now:       func() time.Time { return time.Unix(0, int64(s.now)) },
		Pending:   pending,
		Releases:  s.tracker,
	})
	first := time.Duration(-1) // the first arrival
	for i, ss := range w.Sessions {
		if len(ss.Turns) == 0 {
			continue
		}
		at := ss.Start + ss.Turns[0].Gap
		s.push(event{at: at, kind: evArrival, sess: i})
		if first < 0 || at < first {
			first = at
		}
	}
	for _, ch := range cfg.SpeedChanges {
		s.push(event{at: max(first, 0) + ch.At, kind: evRetime, replica: ch.Replica, speed: ch.Speed})
	}
	steps := 0
	for s.q.Len() > 0 {
		ev := heap.Pop(&s.q).(*event)
		s.now = ev.at
		switch ev.kind {
		case evArrival:
			if err := s.arrive(ctx, ev.sess, ev.turn); err != nil {
				return nil, err
			}
		case evStep:
			s.step(ev.replica)
			steps++
			if steps%4096 == 0 && ctx.Err() != nil {
				return nil, ctx.Err()
			}
		case evDone:
			s.done(ev.replica, ev.res)
		case evDeliver:
			s.apply(ev.replica, ev.res.Events)
		case evRetime:
			if err := s.reps[ev.replica].eng.Retime(cfg.Engine.AtSpeed(ev.speed)); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrSim, err)
			}
		}
		*ev = event{}
		s.spare = append(s.spare, ev)
	}
	if s.rel != nil {
		if err := s.rel.check(); err != nil {
			return nil, err
		}
	}
	for _, r := range s.reps {
		st := r.eng.Stats()
		r.res.Preemptions = st.Preemptions
		s.run.Replicas = append(s.run.Replicas, r.res)
	}
	return s.run, nil
}

// push queues ev, in an event struct the loop handed back (spare) when
// there is one: a run queues several events per step.
func (s *sim) push(ev event) {
	s.seq++
	ev.seq = s.seq
	var e *event
	if n := len(s.spare); n > 0 {
		e, s.spare = s.spare[n-1], s.spare[:n-1]
	} else {
		e = new(event)
	}
	*e = ev
	heap.Push(&s.q, e)
}

// prompt builds the prompt of a session's turn.
func (s *sim) prompt(sess, turn int) []uint32 {
	t := s.w.Sessions[sess].Turns[turn]
	if t.TraceIDs != nil {
		return kvblock.ExpandTrace(t.TraceIDs, t.TraceLen, t.TraceBlock)
	}
	p := s.history[sess]
	s.history[sess] = nil
	return Expand(p, t.Append)
}

// fitPrompt cuts a prompt and its output to the model's context: an output
// of the whole context is halved, then the prompt loses its end.
func fitPrompt(prompt []uint32, out, maxLen int) ([]uint32, int, bool) {
	if out >= maxLen {
		out = maxLen / 2
	}
	if len(prompt)+out > maxLen {
		return prompt[:max(0, maxLen-out)], out, true
	}
	return prompt, out, false
}

func (s *sim) arrive(ctx context.Context, sess, turn int) error {
	t := s.w.Sessions[sess].Turns[turn]
	prompt, out, truncated := fitPrompt(s.prompt(sess, turn), t.Output, s.cfg.Engine.MaxModelLen)
	if len(prompt) == 0 || out < 1 {
		return fmt.Errorf("%w: session %d turn %d: empty prompt or output", ErrSim, sess, turn)
	}
	keep := turn+1 < len(s.w.Sessions[sess].Turns)
	var blockHashes []uint64
	if s.rel != nil {
		blockHashes = s.rel.arrived(sess, turn, prompt)
	}
	in := route.TokenizeInput{Chat: true, Messages: s.opening[s.conv[sess]]}
	if s.cfg.Completions {
		in = route.TokenizeInput{}
	}
	dec, err := s.router.Decide(ctx, route.Request{
		Model:      s.cfg.Engine.Model,
		Tokens:     prompt,
		Input:      in,
		SessionKey: s.w.Sessions[sess].Key,
		User:       s.w.Sessions[sess].User,
		MaxTokens:  s.sentMaxTokens(out),
		Streams:    true,
	})
	if err != nil {
		return fmt.Errorf("%w: session %d turn %d: %w", ErrSim, sess, turn, err)
	}
	ri := s.ids[dec.Replica]
	r := s.reps[ri]
	id, err := r.eng.Submit(s.now, engine.Request{Prompt: prompt, MaxTokens: out, Sample: requestSample(sess, turn)})
	if err != nil {
		return fmt.Errorf("%w: session %d turn %d: %w", ErrSim, sess, turn, err)
	}
	bs := s.cfg.Engine.BlockSize
	matched := dec.MatchedBlocks()
	predicted := min(matched*bs, (len(prompt)-1)/bs*bs)
	credited := min((matched+dec.VouchedBlocks())*bs, (len(prompt)-1)/bs*bs)
	lv := &live{
		sess: sess, turn: turn, replica: ri,
		keepOut:   keep,
		maxTokens: dec.MaxTokens,
		handle:    s.tracker.StartExpecting(r.id, dec.PrefillBlocks, dec.PromptBlocks, s.expecting(dec.ExpectedOutputTokens)),
		predicted: predicted,
		credited:  credited,
		hashes:    blockHashes,
		truncated: truncated,
		reason:    dec.Reason,
		queued:    dec.QueuedTokens,
		memBound:  dec.Picked().Load.MemoryBound(),
		key:       dec.Session,
	}
	if lv.keepOut {
		lv.prompt = prompt // the next turn resends it
	}
	if c := s.conv[sess]; !s.cfg.Completions && !s.opened[c] {
		// A chat client's later turns resend the opening messages
		// (route.SessionKey's conversation key); a completions client's
		// carry none.
		s.opened[c], lv.opener, lv.promptHash = true, true, hashTokens(prompt)
	}
	s.live[ri][id] = lv
	r.res.Requests++
	if !r.stepping && !r.queued {
		at, _ := r.eng.NextEventTime()
		r.queued = true
		s.push(event{at: max(at, s.now), kind: evStep, replica: ri})
	}
	return nil
}

// blockInfo is what the simulator tracks per engine block hash (one table
// for both, so that a stored block's two look-ups share a cache line):
// when a replica first computed it (the ceiling's infinite cache; every
// replica shares one engine seed, so equal blocks have equal hashes
// fleet-wide) and how many requests still to arrive hold it (relevance).
type blockInfo struct {
	avail    time.Duration
	pending  int32
	computed bool
}

// ceiling counts the tokens of a finished request's prompt that one
// infinite cache of every computed block would have served when the
// request was first scheduled: its leading full blocks that some replica
// had scheduled in a step started before then, never the prompt's last
// token (as the engine), and no less than the engine served it. A step's
// blocks are found by requests admitted into that step too, but the table
// does not say which request stored them, and the request itself is one
// of them; what its engine found in that step is in its cached tokens.
func (s *sim) ceiling(f *engine.Finished) int {
	bs := s.cfg.Engine.BlockSize
	limit := min((f.PromptTokens-1)/bs, len(f.Hashes))
	hit := 0
	for i := range min(probeAhead, limit) {
		s.blocks.prefetch(f.Hashes[i])
	}
	for hit < limit {
		if hit+probeAhead < limit {
			s.blocks.prefetch(f.Hashes[hit+probeAhead])
		}
		b, ok := s.blocks.get(f.Hashes[hit])
		if !ok || !b.computed || b.avail >= f.Scheduled {
			break
		}
		hit++
	}
	return max(hit*bs, f.CachedTokens)
}

// computed records when the step's stored blocks became available: a
// block stored on the GPU was computed by the step (or reloaded, and then
// computed earlier); the first time any replica stores a hash counts. The
// engine caches a step's blocks as it schedules it, so a request
// scheduled in the same step finds them: they count from the step's
// start, and the ceiling is never below what an engine served.
func (s *sim) computed(res *engine.StepResult) {
	// Start every event's first look-ups before the first: an offload
	// step's events store one block each.
	for i := range res.Events {
		ev := &res.Events[i]
		if ev.Kind == engine.BlockStored && ev.Medium != engine.MediumCPU {
			for _, h := range ev.Hashes[:min(probeAhead, len(ev.Hashes))] {
				s.blocks.prefetch(h)
			}
		}
	}
	for i := range res.Events {
		ev := &res.Events[i]
		if ev.Kind != engine.BlockStored || ev.Medium == engine.MediumCPU {
			// A CPU-tier store is an offload of a block the GPU stored
			// (in this step's events or an earlier step's): computed then.
			continue
		}
		for i, h := range ev.Hashes {
			if i+probeAhead < len(ev.Hashes) {
				s.blocks.prefetch(ev.Hashes[i+probeAhead])
			}
			if b, _ := s.blocks.ref(h); !b.computed || res.Start < b.avail {
				b.avail, b.computed = res.Start, true
			}
		}
	}
}

func (s *sim) step(ri int) {
	r := s.reps[ri]
	r.queued = false
	res := r.eng.Step(s.now)
	if res.Idle {
		return
	}
	r.stepping = true
	s.push(event{at: res.End, kind: evDone, replica: ri, res: &res})
}

func (s *sim) done(ri int, res *engine.StepResult) {
	r := s.reps[ri]
	r.stepping = false
	r.res.Busy += res.End - res.Start
	s.work(r, res.Start, res.End-r.eng.Config().StepTime)
	r.res.PrefillTokens += int64(res.PrefillTokens)
	r.res.DecodeTokens += int64(res.DecodeTokens)
	s.computed(res)
	lives := s.live[ri]
	for _, tk := range res.Tokens {
		lv := lives[tk.ID]
		if lv == nil {
			continue
		}
		if tk.Index == 0 {
			lv.handle.FirstToken()
		}
		if lv.keepOut {
			lv.outputs = append(lv.outputs, tk.Token)
		}
	}
	for i := range res.Finished {
		f := &res.Finished[i]
		lv := lives[f.ID]
		if lv == nil {
			continue
		}
		delete(lives, f.ID)
		lv.handle.Done()
		if s.rel != nil {
			s.rel.served(lv.hashes, f.Hashes)
		}
		if s.fid != nil {
			s.fid.Observe(r.id, lv.credited, f.CachedTokens)
		}
		s.run.Requests = append(s.run.Requests, RequestResult{
			Session: lv.sess, Turn: lv.turn, Replica: ri, Arrival: f.Arrival,
			TTFT: f.FirstToken - f.Arrival, E2E: f.Finish - f.Arrival,
			PromptTokens: f.PromptTokens, CachedTokens: f.CachedTokens,
			PredictedTokens: lv.predicted, CeilingTokens: s.ceiling(f),
			OutputTokens: f.OutputTokens, MaxTokens: lv.maxTokens, Preemptions: f.Preemptions,
			IdealTTFT: idealTTFT(r.eng.Config(), f.PromptTokens-f.CachedTokens),
			Truncated: lv.truncated, Reason: lv.reason, SessionKey: lv.key,
			QueuedTokens: lv.queued, SentMemoryBound: lv.memBound,
		})
		s.run.Makespan = max(s.run.Makespan, f.Finish)
		if lv.opener {
			s.opening[s.conv[lv.sess]] = openingMessages(lv.promptHash, requestSample(lv.sess, lv.turn), f.OutputTokens)
		}
		if lv.keepOut {
			hist := append(lv.prompt, s.w.Sessions[lv.sess].Turns[lv.turn].resent(lv.outputs)...)
			s.history[lv.sess] = hist
			next := s.w.Sessions[lv.sess].Turns[lv.turn+1]
			s.push(event{at: f.Finish + next.Gap, kind: evArrival, sess: lv.sess, turn: lv.turn + 1})
		}
	}
	if len(res.Events) > 0 {
		switch {
		case s.cfg.EventLoss > 0 && s.loss.Float64() < s.cfg.EventLoss:
			s.run.EventsLost++
			if slices.ContainsFunc(res.Events, func(e engine.Event) bool { return e.Kind == engine.BlockStored }) {
				r.gapAt, r.gapped = s.now, true
			}
			r.eng.Recycle(res.Events)
		case s.cfg.EventDelay == 0:
			s.apply(ri, res.Events)
		default:
			s.push(event{at: res.End + s.cfg.EventDelay, kind: evDeliver, replica: ri, res: res})
		}
	}
	if at, busy := r.eng.NextEventTime(); busy && !r.queued {
		r.queued = true
		s.push(event{at: max(at, s.now), kind: evStep, replica: ri})
	}
}

// sentMaxTokens is the max_tokens a client sends for a turn that will
// generate out tokens (FleetConfig.MaxTokens); 0 for none.
func (s *sim) sentMaxTokens(out int) int {
	switch m := s.cfg.MaxTokens; {
	case m == 0:
		return out
	case m < 0:
		return 0
	default:
		return max(m, out)
	}
}

// expecting is what a request expected to generate out tokens (the
// router's estimate from its max_tokens, Rates.ExpectOutput) tells the
// tracker, as the router does: its output, for a policy that reads the
// decoding ledger; nothing (no ledger entry) otherwise or when not known.
func (s *sim) expecting(out int) load.Output {
	// Every simulated response streams: the router sees each first token
	// when it is generated.
	if !s.ledger || out <= 0 {
		return load.Output{Streams: true}
	}
	return load.Output{Tokens: out, Blocks: float64(out) / float64(s.cfg.Engine.BlockSize), Streams: true}
}

// requestSample is the sampling seed of a session's turn
// (engine.Request.Sample): every simulated request samples its output, as
// the OpenAI API does by default (temperature 1), each with a seed of its
// own, so that requests sending one prompt (a GRPO group's samples of a
// task) answer it differently, while a run repeats exactly.
func requestSample(sess, turn int) uint64 {
	return 1<<63 | uint64(sess)<<24 | uint64(turn)&(1<<24-1)
}

// openingMessages is what a chat client resends at the start of every
// later request of a conversation, as the OpenAI messages array: the first
// request's prompt (its system and user messages, here one user message)
// and the answer to it. The simulator has token ids, not text, so the
// prompt's content is a hash of its tokens, and the answer's names the
// engine's output for that prompt (which depends only on the prompt and
// the request's sampling seed, every replica sharing one engine seed) by
// the prompt's hash, the sampling seed and the output's length.
// route.SessionKey derives the conversation's key from it exactly as from
// a live request's body (a conversation's first request carries none: it
// has no assistant message yet), so the simulated router sees the
// identities a live one would: two samples of one task prompt open two
// conversations.
func openingMessages(promptHash, sample uint64, outputTokens int) []byte {
	b := append(make([]byte, 0, 112), `[{"role":"user","content":"`...)
	b = strconv.AppendUint(b, promptHash, 16)
	b = append(b, `"},{"role":"assistant","content":"answer to `...)
	b = strconv.AppendUint(b, promptHash, 16)
	b = append(b, ' ')
	b = strconv.AppendUint(b, sample, 16)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(outputTokens), 10)
	return append(b, `"}]`...)
}

// conversations maps each session to its conversation: a session of
// several turns is one (its later turns resend its history), and the
// trace's single-request sessions of one rebuilt conversation (one
// Session.ID; their prompts extend each other) share the first's. Other
// sessions sharing an ID are not later turns of each other (fan-out
// siblings send one prompt at once) and stay apart.
func conversations(w *Workload) []int32 {
	conv := make([]int32, len(w.Sessions))
	first := map[string]int32{}
	for i := range w.Sessions {
		ss := &w.Sessions[i]
		conv[i] = int32(i)
		if len(ss.Turns) == 0 || ss.Turns[0].TraceIDs == nil || ss.ID == "" {
			continue
		}
		if c, ok := first[ss.ID]; ok {
			conv[i] = c
		} else {
			first[ss.ID] = int32(i)
		}
	}
	return conv
}

// hashTokens hashes token ids (little-endian bytes).
func hashTokens(toks []uint32) uint64 {
	h := xxh3.New()
	var buf [4 * 256]byte
	for len(toks) > 0 {
		n := min(len(toks), 256)
		for i, t := range toks[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], t)
		}
		_, _ = h.Write(buf[:4*n])
		toks = toks[n:]
	}
	return h.Sum64()
}

// idealTTFT is the time an idle engine of configuration e takes to prefill
// n uncached tokens and sample the first token: ceil(n / budget) steps of
// one sequence.
func idealTTFT(e engine.Config, n int) time.Duration {
	n = max(n, 1)
	steps := (n + e.MaxNumBatchedTokens - 1) / e.MaxNumBatchedTokens
	return time.Duration(steps)*(e.StepTime+e.StepTimePerSeq) +
		time.Duration(float64(n)/e.PrefillTokensPerSec*float64(time.Second))
}

// apply converts an engine's published batch into index updates, as the
// events package does with decoded wire batches.
// The batch goes back to its engine afterwards.
func (s *sim) apply(ri int, evs []engine.Event) {
	s.run.EventsApplied++
	s.feed.apply(index.ReplicaID(s.reps[ri].id), evs)
	s.reps[ri].eng.Recycle(evs)
}

// work adds [from, to) to the replica's work time and bins.
func (s *sim) work(r *replica, from, to time.Duration) {
	if to <= from {
		return
	}
	r.res.Work += to - from
	w := s.cfg.BinWidth
	for from < to {
		b := int(from / w)
		end := min(to, time.Duration(b+1)*w)
		for len(r.res.WorkBins) <= b {
			r.res.WorkBins = append(r.res.WorkBins, 0)
		}
		r.res.WorkBins[b] += float64(end-from) / float64(w)
		from = end
	}
}

// simState is the router's view of the simulated fleet: its own in-flight
// tracker plus engine figures scraped at most ScrapeInterval ago, combined
// as load.View combines them; trust from load.Fidelity.
type simState sim

// Replicas is called once per decision: it first hands the router's rate
// learner the requests that finished since the last decision, with what a
// live router reads of a response (its time to first token and end, the
// usage's prompt, cached and output tokens), and returns the replica set.
func (st *simState) Replicas() []route.Replica {
	s := (*sim)(st)
	rates := s.router.Rates()
	for _, r := range s.run.Requests[min(rates.Observed(), len(s.run.Requests)):] {
		rates.Observe(index.ReplicaID(s.reps[r.Replica].id), route.RateSample{
			Uncached: r.PromptTokens - r.CachedTokens, Queued: r.QueuedTokens,
			TTFT: r.TTFT, E2E: r.E2E, Output: r.OutputTokens, MaxTokens: r.MaxTokens, MemoryBound: r.SentMemoryBound,
			At: time.Unix(0, int64(r.Arrival+r.TTFT)),
		})
	}
	return st.routes
}

func (st *simState) Load(id index.ReplicaID) load.Load {
	s := (*sim)(st)
	i, ok := s.ids[id]
	if !ok {
		return load.Load{}
	}
	r := s.reps[i]
	if !r.scrapeOK || s.now-r.scrapeAt >= s.cfg.ScrapeInterval {
		prev := r.scraped.Preemptions
		r.scraped, r.scrapeAt, r.scrapeOK = r.eng.Stats(), s.now, true
		if r.scraped.Preemptions > prev {
			r.preemptAt, r.preempted = s.now, true
		}
	}
	local := s.tracker.Get(r.id)
	reqs := max(local.Requests, r.scraped.Running+r.scraped.Waiting)
	return load.Load{
		ActivePrefillBlocks: float64(local.PrefillBlocks),
		ActiveDecodeBlocks:  float64(local.DecodeBlocks),
		ActiveRequests:      reqs - r.scraped.Waiting,
		WaitingRequests:     r.scraped.Waiting,
		KVUsage:             r.scraped.KVUsage,
		KVBlocks:            float64(r.scraped.NumGPUBlocks),
		Preempting:          r.preempted && s.now-r.preemptAt < load.PreemptionHold,
		OldestPrefillWait:   local.OldestWait,
		OldestPrefillBlocks: float64(local.OldestBlocks),
		Healthy:             true,
	}
}

// ViewGaps implements route.ViewGaps: a batch of the replica's with
// stores in it was lost within index.GapHold. A live router learns of a
// lost batch from the sequence gap and replays it; the simulator's loss is
// a replay that failed, and the view misses those stores from then on.
// (The events manager marks a view at the first store below a missing
// parent instead: the only sign left once a failed replay's view has been
// cleared and relearned. The simulator cannot: which stores reach its
// index depends on the relevance filter, which must change nothing.)
func (st *simState) ViewGaps(id index.ReplicaID) bool {
	s := (*sim)(st)
	i, ok := s.ids[id]
	if !ok {
		return false
	}
	r := s.reps[i]
	return r.gapped && s.now-r.gapAt < index.GapHold
}

func (st *simState) Trust(id index.ReplicaID) float64 {
	s := (*sim)(st)
	if s.fid == nil {
		return 1
	}
	return s.fid.Credit(string(id))
}
