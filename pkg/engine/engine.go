package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/pkg/engine/simtok"
)

// ReqID names a submitted request inside one Engine.
type ReqID uint64

// Request is one generation request, already tokenized.
type Request struct {
	Prompt []uint32
	// MaxTokens is the exact number of tokens generated (the simulator never
	// samples an end-of-sequence token).
	MaxTokens int
	// LoRAName and LoRAID name the adapter; empty/0 for the base model.
	LoRAName string
	LoRAID   int
	// CacheSalt is folded into block 0's hash (vLLM's cache_salt).
	CacheSalt string
	// Sample is the request's sampling seed. 0 decodes greedily, as at
	// temperature 0: the output depends on the engine's seed and the prompt
	// alone, so two requests sending one prompt get one answer. Any other
	// value draws an output of its own, as sampling at a temperature above
	// 0 does (a GRPO group's samples of one task prompt answer it
	// differently); a request repeating a Sample repeats its output, as a
	// request with vLLM's per-request `seed` does.
	Sample uint64
}

// Errors returned by Submit; all wrap ErrInvalidRequest.
var (
	ErrInvalidRequest   = errors.New("engine: invalid request")
	ErrEmptyPrompt      = fmt.Errorf("%w: empty prompt", ErrInvalidRequest)
	ErrPromptTooLong    = fmt.Errorf("%w: prompt longer than max model len", ErrInvalidRequest)
	ErrMaxTokensTooLong = fmt.Errorf("%w: prompt plus max tokens longer than max model len", ErrInvalidRequest)
	ErrMaxTokens        = fmt.Errorf("%w: max tokens must be at least 1", ErrInvalidRequest)
)

// Token is one sampled output token.
type Token struct {
	ID    ReqID
	Token uint32
	// Index is the token's position in the output, from 0.
	Index int
}

// Finished reports a completed request. Times are simulated times.
type Finished struct {
	ID           ReqID
	PromptTokens int
	// CachedTokens are the prompt tokens served from the prefix cache (GPU
	// hits and CPU reloads) when the request was first scheduled: full
	// blocks only, and never the prompt's last token.
	CachedTokens int
	// ReloadedTokens is the part of CachedTokens reloaded from the CPU tier.
	ReloadedTokens int
	OutputTokens   int
	Preemptions    int
	Arrival        time.Duration
	Scheduled      time.Duration // first scheduled
	FirstToken     time.Duration
	Finish         time.Duration
	// Reason is vLLM's finish_reason: always "length" here.
	Reason string
	// Hashes are the chained hashes of the request's full prompt and
	// output blocks, as its events name them (read-only).
	Hashes []uint64
}

// StepResult is what one scheduler step did.
type StepResult struct {
	// Start and End bound the step in simulated time: its tokens and events
	// happen at End.
	Start, End time.Duration
	// Idle is set when there was nothing to do (End == Start).
	Idle bool
	// Batch is the number of sequences scheduled; PrefillTokens and
	// ReloadedTokens the prompt tokens computed and reloaded from the CPU
	// tier; DecodeTokens the single-token decodes.
	Batch          int
	PrefillTokens  int
	DecodeTokens   int
	ReloadedTokens int
	Tokens         []Token
	Finished       []Finished
	Preempted      []ReqID
	// Events are the cache events of the step, in order; one published
	// batch when not empty. They belong to the caller but are read-only:
	// their Tokens are shared with the engine's block metadata.
	Events []Event
}

// Stats is a snapshot of the engine's state and counters: what a vLLM
// engine reports on /metrics (names in brackets), plus a few figures an
// observer of its steps can derive. Counters only grow; durations are
// simulated time.
type Stats struct {
	// Running and Waiting count requests (num_requests_running,
	// num_requests_waiting).
	Running, Waiting int
	UsedGPUBlocks    int // held by running requests
	// FreeGPUBlocks are the blocks a new request can take: NumGPUBlocks -
	// UsedGPUBlocks, cached-but-unreferenced blocks included (they are
	// evicted on allocation), as vLLM's block pool counts free blocks.
	FreeGPUBlocks   int
	CachedGPUBlocks int // holding a prefix-cache hash
	NumGPUBlocks    int
	CPUBlocks       int
	NumCPUBlocks    int
	// KVUsage is UsedGPUBlocks / NumGPUBlocks (kv_cache_usage_perc).
	KVUsage float64
	// PrefixQueries and PrefixHits count prompt tokens looked up and found
	// (prefix_cache_queries / prefix_cache_hits).
	PrefixQueries, PrefixHits int64
	// PromptTokens counts the prompt tokens of admitted requests
	// (prompt_tokens); PrefillTokens the prompt tokens actually computed,
	// recomputation after preemption included; ReloadedTokens those
	// reloaded from the CPU tier.
	PromptTokens     int64
	PrefillTokens    int64
	ReloadedTokens   int64
	GenerationTokens int64 // generation_tokens
	// Preemptions counts preemptions (num_preemptions); Finished finished
	// requests.
	Preemptions int64
	Finished    int64
	Steps       int64
	// Busy is the total duration of the steps run.
	Busy time.Duration
	// FirstTokens counts requests that produced their first token; the
	// sums are over them (time_to_first_token_seconds, and the
	// request_queue_time / request_prefill_time histograms: arrival to
	// first scheduled, first scheduled to first token). DecodeTimeSum is
	// first to last token of finished requests (request_decode_time).
	FirstTokens                           int64
	TTFTSum, QueueTimeSum, PrefillTimeSum time.Duration
	DecodeTimeSum                         time.Duration
	// PrefillRate is an exponentially weighted average (weight 0.1 a step)
	// of the tokens computed per second of steps that prefilled (prefill
	// tokens over the step's duration: what an observer of iteration
	// tokens and step times sees, decode overhead of mixed steps
	// included); 0 before the first such step. DecodeStep is the same
	// average of the duration of steps that decoded: the inter-token
	// latency running requests see.
	PrefillRate float64
	DecodeStep  time.Duration
}

// ewmaWeight is the weight of a new step in Stats.PrefillRate and
// Stats.DecodeStep.
const ewmaWeight = 0.1

type state uint8

const (
	waiting state = iota
	running
	done
)

type request struct {
	id          ReqID
	req         Request
	tokens      []uint32 // prompt, then outputs
	gen         *simtok.Generator
	state       state
	numComputed int
	blocks      []int32
	hashes      []uint64
	committed   int // leading blocks already in (or known to) the cache
	// sw and swCommitted are blocks and committed of a hybrid engine's
	// sliding-window group; -1 marks a block outside the window (null).
	sw          []int32
	swCommitted int
	outputs     int
	cached      int // -1 until first scheduled
	reloaded    int
	preemptions int
	arrival     time.Duration
	scheduled   time.Duration
	firstToken  time.Duration
}

// Engine is the cache and scheduler model. It is not safe for concurrent
// use; it starts no goroutine and reads no clock.
type Engine struct {
	cfg       Config
	seed      uint64
	noneHash  uint64
	pool      *pool
	events    []Event
	reqs      map[ReqID]*request
	waiting   []*request
	running   []*request
	nextID    ReqID
	busyUntil time.Duration
	st        Stats
	scratch   []byte
	gpuIDs    []int32     // admit's scratch: each prefix hit's GPU block or -1
	spare     []Event     // a recycled batch array for the next step's events
	batch     []scheduled // the step's batch (scratch, reused)
}

// New returns an engine for cfg (defaulted, then validated). seed fixes the
// root of every block-hash chain and the generated text: two engines built
// with the same config and seed and fed the same calls behave identically.
func New(cfg Config, seed uint64) (*Engine, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := &Engine{
		cfg:      cfg,
		seed:     seed,
		noneHash: xxh3.HashString("enginesim/none-hash\x00" + strconv.FormatUint(seed, 10)),
		reqs:     make(map[ReqID]*request),
	}
	e.pool = newPool(cfg.NumGPUBlocks, cfg.NumCPUBlocks, cfg.BlockSize, &e.events)
	return e, nil
}

// Config returns the engine's defaulted configuration.
func (e *Engine) Config() Config { return e.cfg }

// Retime gives the engine cfg's speeds (PrefillTokensPerSec,
// ReloadTokensPerSec, StepTime, StepTimePerSeq) from its next step on, as
// a GPU that throttles, or a neighbour that takes a share of it, changes
// a replica's speed while its cache and queues stay. cfg (defaulted) must
// be valid and equal to the engine's configuration in every other field.
func (e *Engine) Retime(cfg Config) error {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	same := e.cfg
	same.PrefillTokensPerSec, same.ReloadTokensPerSec = cfg.PrefillTokensPerSec, cfg.ReloadTokensPerSec
	same.StepTime, same.StepTimePerSeq = cfg.StepTime, cfg.StepTimePerSeq
	if same != cfg {
		return fmt.Errorf("%w: Retime changes only the speeds", ErrConfig)
	}
	e.cfg = cfg
	return nil
}

// Submit queues a request arriving at simulated time now.
func (e *Engine) Submit(now time.Duration, r Request) (ReqID, error) {
	switch n := len(r.Prompt); {
	case n == 0:
		return 0, ErrEmptyPrompt
	case r.MaxTokens < 1:
		return 0, ErrMaxTokens
	case n > e.cfg.MaxModelLen:
		return 0, fmt.Errorf("%w: %d > %d", ErrPromptTooLong, n, e.cfg.MaxModelLen)
	case n+r.MaxTokens > e.cfg.MaxModelLen:
		return 0, fmt.Errorf("%w: %d + %d > %d", ErrMaxTokensTooLong, n, r.MaxTokens, e.cfg.MaxModelLen)
	}
	e.nextID++
	// Every slice the request grows is sized once for its whole life
	// (prompt plus output), so that appending never copies.
	total := len(r.Prompt) + r.MaxTokens
	q := &request{
		id:      e.nextID,
		req:     r,
		tokens:  append(make([]uint32, 0, total), r.Prompt...),
		gen:     simtok.NewGenerator(sampleSeed(e.seed, r.Sample), r.Prompt),
		blocks:  make([]int32, 0, ceilDiv(total, e.cfg.BlockSize)),
		hashes:  make([]uint64, 0, total/e.cfg.BlockSize),
		cached:  -1,
		arrival: now,
	}
	e.reqs[q.id] = q
	e.waiting = append(e.waiting, q)
	return q.id, nil
}

// Abort drops a waiting or running request, releasing its blocks (they stay
// cached). It reports whether the request was still live.
func (e *Engine) Abort(id ReqID) bool {
	r, ok := e.reqs[id]
	if !ok {
		return false
	}
	switch r.state {
	case waiting:
		e.waiting = slices.DeleteFunc(e.waiting, func(x *request) bool { return x == r })
	case running:
		e.releaseBlocks(r)
		e.running = slices.DeleteFunc(e.running, func(x *request) bool { return x == r })
	}
	r.state = done
	delete(e.reqs, id)
	return true
}

// NextEventTime returns when the next step can start, and false when the
// engine is idle (nothing running or waiting: only a Submit brings work).
func (e *Engine) NextEventTime() (time.Duration, bool) {
	if len(e.running) == 0 && len(e.waiting) == 0 {
		return 0, false
	}
	return e.busyUntil, true
}

// ResetPrefixCache forgets every cached block on both tiers and returns the
// AllBlocksCleared event to publish. Like vLLM it refuses (false) while any
// block is held by a running request.
func (e *Engine) ResetPrefixCache() ([]Event, bool) {
	if e.pool.used() > 0 {
		return nil, false
	}
	e.pool.clear()
	return []Event{{Kind: AllBlocksCleared}}, true
}

// Recycle hands back a batch of events that Step returned once the caller
// is done with it (nothing may read it afterwards): a later step reuses its
// array. Optional; it saves the allocation of a batch a step.
func (e *Engine) Recycle(evs []Event) {
	if cap(evs) > cap(e.spare) {
		clear(evs)
		e.spare = evs[:0]
	}
}

// Stats returns a snapshot of the engine's state and counters.
func (e *Engine) Stats() Stats {
	s := e.st
	s.Running, s.Waiting = len(e.running), len(e.waiting)
	s.UsedGPUBlocks = e.pool.used()
	s.FreeGPUBlocks = e.pool.nfree
	s.CachedGPUBlocks = e.pool.gpuLen()
	s.NumGPUBlocks = e.cfg.NumGPUBlocks
	s.CPUBlocks = e.pool.cpuLen()
	s.NumCPUBlocks = e.cfg.NumCPUBlocks
	s.KVUsage = float64(s.UsedGPUBlocks) / float64(s.NumGPUBlocks)
	return s
}

// BlockHashes returns the engine's hashes of r's full prompt blocks.
func (e *Engine) BlockHashes(r Request) []uint64 {
	q := &request{req: r, tokens: r.Prompt}
	e.ensureHashes(q, len(r.Prompt)/e.cfg.BlockSize)
	return q.hashes
}

// ExtendHashes returns the engine's hashes of r's full prompt blocks (a
// new slice), taking prefix as the hashes of its first len(prefix) blocks
// (a conversation's earlier prompt) instead of computing them again.
func (e *Engine) ExtendHashes(prefix []uint64, r Request) []uint64 {
	n := len(r.Prompt) / e.cfg.BlockSize
	if len(prefix) > n {
		prefix = prefix[:n]
	}
	q := &request{req: r, tokens: r.Prompt, hashes: append(make([]uint64, 0, n), prefix...)}
	e.ensureHashes(q, n)
	return q.hashes
}

// Generated returns the n tokens the engine generates for prompt at the
// sampling seed sample (Request.Sample; they depend only on the engine's
// seed, sample and the prompt).
func (e *Engine) Generated(prompt []uint32, sample uint64, n int) []uint32 {
	g := simtok.NewGenerator(sampleSeed(e.seed, sample), prompt)
	out := make([]uint32, n)
	for i := range out {
		out[i] = g.Next()
	}
	return out
}

// sampleSeed is the output generator's seed for a request with sampling
// seed sample: the engine's own for a greedy request (0), else mixed with
// sample.
func sampleSeed(seed, sample uint64) uint64 {
	if sample == 0 {
		return seed
	}
	return seed ^ xxh3.HashSeed([]byte("sample"), sample)
}

// CachedPrefix returns how many leading full blocks of r's prompt the engine
// holds, counted by the best tier holding each (GPU first): the engine's own
// truth, to compare with a router index's belief.
func (e *Engine) CachedPrefix(r Request) (gpu, cpu int) {
	for _, h := range e.BlockHashes(r) {
		switch {
		case e.pool.hasGPU(h):
			gpu++
		case e.pool.cpuHas(h):
			cpu++
		default:
			return gpu, cpu
		}
	}
	return gpu, cpu
}

// CachedBlocks returns the number of distinct block hashes the engine holds
// on either tier (a hybrid engine: in its full-attention group).
func (e *Engine) CachedBlocks() int {
	if e.hybrid() {
		n := 0
		for i := range e.pool.blocks {
			if b := &e.pool.blocks[i]; b.cached && b.group == GroupFullAttention {
				n++
			}
		}
		return n
	}
	return e.pool.loc.n
}

// extras returns block i's extra keys in vLLM's order: LoRA name, then the
// cache salt on block 0.
func (r *request) extras(i int) []string {
	var out []string
	if r.req.LoRAName != "" {
		out = append(out, r.req.LoRAName)
	}
	if i == 0 && r.req.CacheSalt != "" {
		out = append(out, r.req.CacheSalt)
	}
	return out
}

// ensureHashes computes the chained hashes of r's first n full blocks:
// xxh3-64 over parent (8 bytes big-endian) || tokens (uint32 little-endian)
// || extras (0xff, uvarint length, bytes each), rooted at the seed's
// none-hash.
func (e *Engine) ensureHashes(r *request, n int) {
	bs := e.cfg.BlockSize
	for i := len(r.hashes); i < n; i++ {
		parent := e.noneHash
		if i > 0 {
			parent = r.hashes[i-1]
		}
		buf := binary.BigEndian.AppendUint64(e.scratch[:0], parent)
		for _, t := range r.tokens[i*bs : (i+1)*bs] {
			buf = binary.LittleEndian.AppendUint32(buf, t)
		}
		for _, x := range r.extras(i) {
			buf = append(buf, 0xff)
			buf = binary.AppendUvarint(buf, uint64(len(x)))
			buf = append(buf, x...)
		}
		e.scratch = buf
		r.hashes = append(r.hashes, xxh3.Hash(buf))
	}
}

// fillMeta sets m to the metadata of r's block i.
func (e *Engine) fillMeta(m *blockMeta, r *request, i int) {
	bs := e.cfg.BlockSize
	*m = blockMeta{
		tokens:   r.tokens[i*bs : (i+1)*bs : (i+1)*bs],
		extra:    r.extras(i),
		loraID:   r.req.LoRAID,
		loraName: r.req.LoRAName,
	}
	if i > 0 {
		m.parent, m.hasParent = r.hashes[i-1], true
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// grow gives r blocks for its first upto tokens, or reports false when the
// free list is too short (nothing is allocated then).
func (e *Engine) grow(r *request, upto int) bool {
	if e.hybrid() {
		return e.growHybrid(r, upto)
	}
	need := ceilDiv(upto, e.cfg.BlockSize) - len(r.blocks)
	if need <= 0 {
		return true
	}
	if e.pool.nfree < need {
		return false
	}
	if need == 1 {
		r.blocks = append(r.blocks, e.pool.alloc())
		return true
	}
	// Prefetch maxPrefetch allocations ahead of the one being made.
	a := e.pool.prefetchAlloc(need)
	for k := range need {
		r.blocks = append(r.blocks, e.pool.alloc())
		if k+maxPrefetch < need {
			e.pool.prefetchNext(&a)
		}
	}
	return true
}

// prefetchGrowth starts loading what growing the running requests within
// budget will probe (see pool.prefetchAlloc): a decode step allocates a
// block here and there across the batch, one at a time, each evicting and
// offloading a cached block; prefetched together, their misses overlap.
// It changes nothing.
func (e *Engine) prefetchGrowth(budget int) {
	if !prefetching || e.hybrid() || len(e.running) < 2 {
		return
	}
	need := 0
	for _, r := range e.running {
		if budget <= 0 || need >= maxPrefetch {
			break
		}
		n := min(len(r.tokens)-r.numComputed, budget)
		need += max(0, ceilDiv(r.numComputed+n, e.cfg.BlockSize)-len(r.blocks))
		budget -= n
	}
	if need > 1 {
		e.pool.prefetchAlloc(need)
	}
}

func (e *Engine) preempt(r *request) {
	e.releaseBlocks(r)
	r.numComputed, r.committed = 0, 0
	r.state = waiting
	r.preemptions++
	e.st.Preemptions++
	e.running = e.running[:len(e.running)-1] // r is always the last
	e.waiting = slices.Insert(e.waiting, 0, r)
}

// admit schedules waiting request r with at most budget tokens, looking up
// its prefix first. It returns the tokens scheduled and the tokens reloaded
// from the CPU tier, or ok=false (and changes nothing) when the free list
// cannot hold the blocks.
func (e *Engine) admit(r *request, budget int, now time.Duration) (n, reloaded int, ok bool) {
	if e.hybrid() {
		return e.admitHybrid(r, budget, now)
	}
	bs := e.cfg.BlockSize
	// vLLM never serves a request's last prompt token from the cache: the
	// token must be computed to sample the first output.
	maxHit := (len(r.tokens) - 1) / bs
	e.ensureHashes(r, maxHit)
	var gpuHits, cpuHits, freeHits int
	hits := 0
	gpuIDs := e.gpuIDs[:0]
	if prefetching {
		for i := range min(maxHit, maxPrefetch) {
			e.pool.loc.prefetch(r.hashes[i])
		}
	}
	for ; hits < maxHit; hits++ {
		if ahead := hits + maxPrefetch; prefetching && ahead < maxHit {
			e.pool.loc.prefetch(r.hashes[ahead])
		}
		w, _ := e.pool.loc.get(r.hashes[hits])
		if w.gpu >= 0 {
			gpuHits++
			if e.pool.blocks[w.gpu].inFree {
				freeHits++
			}
		} else if w.cpu >= 0 {
			cpuHits++
		} else {
			break
		}
		gpuIDs = append(gpuIDs, w.gpu)
	}
	e.gpuIDs = gpuIDs
	computed := hits * bs
	n = min(len(r.tokens)-computed, budget)
	need := ceilDiv(computed+n, bs) - gpuHits
	if e.pool.nfree-freeHits < need {
		return 0, 0, false
	}
	// Pin the GPU hits and read the CPU hits' metadata first, so that
	// allocating the rest can evict neither.
	metas := make([]*blockMeta, hits)
	for i := range hits {
		if id := gpuIDs[i]; id >= 0 {
			e.pool.touch(id)
		} else {
			metas[i], _ = e.pool.cpuGet(r.hashes[i])
		}
	}
	var reloads []Event
	var run *Event
	r.blocks = r.blocks[:0]
	for i := range hits {
		h := r.hashes[i]
		if metas[i] == nil {
			r.blocks = append(r.blocks, gpuIDs[i])
			if run != nil {
				reloads = append(reloads, *run)
				run = nil
			}
			continue
		}
		m := metas[i]
		id := e.pool.alloc()
		e.pool.cache(id, h, m)
		r.blocks = append(r.blocks, id)
		if run == nil {
			ev := e.pool.storedEvent(h, m, MediumGPU)
			ev.Tokens = append([]uint32(nil), m.tokens...)
			run = &ev
			continue
		}
		run.Hashes = append(run.Hashes, h)
		run.Tokens = append(run.Tokens, m.tokens...)
		run.ExtraKeys = append(run.ExtraKeys, m.extra)
	}
	if run != nil {
		reloads = append(reloads, *run)
	}
	e.grow(r, computed+n) // cannot fail: checked above
	e.events = append(e.events, reloads...)
	r.numComputed, r.committed = computed, hits
	e.commit(r, computed+n)
	r.state = running
	e.st.PrefixQueries += int64(len(r.tokens))
	e.st.PrefixHits += int64(computed)
	if r.cached < 0 {
		r.cached, r.reloaded = computed, cpuHits*bs
		r.scheduled = now
		e.st.PromptTokens += int64(len(r.req.Prompt))
	}
	return n, cpuHits * bs, true
}

// commit caches r's full blocks among its first upto tokens, the tokens it
// is scheduled to have computed when the step ends, and emits one
// BlockStored per run of blocks not already cached. The step calls it as
// it schedules r, as vLLM v1's allocate_slots caches the blocks a step is
// about to compute: a request admitted later in the same step finds them
// and does not compute them again (the step computes each block once,
// before any attention reads it). A run's metadata, hashes, tokens and
// extra keys are allocated once, at their final size.
func (e *Engine) commit(r *request, upto int) {
	bs := e.cfg.BlockSize
	full := upto / bs
	e.ensureHashes(r, full)
	// Every block's location is looked up once, in order: prefetch ahead.
	next := r.committed
	for ; prefetching && next < min(full, r.committed+maxPrefetch); next++ {
		e.pool.loc.prefetch(r.hashes[next])
	}
	for i := r.committed; i < full; {
		if prefetching && next < full {
			e.pool.loc.prefetch(r.hashes[next])
			next++
		}
		if e.pool.hasGPU(r.hashes[i]) {
			// Another request cached the same block first; this copy stays
			// private and is never published.
			i++
			continue
		}
		j := i + 1
		for j < full && !e.pool.hasGPU(r.hashes[j]) {
			if prefetching && next < full {
				e.pool.loc.prefetch(r.hashes[next])
				next++
			}
			j++
		}
		e.storeRun(r, i, j, GroupFullAttention, func(k int, m *blockMeta) { e.pool.cache(r.blocks[k], r.hashes[k], m) })
		i = j
	}
	r.committed = max(r.committed, full)
	if e.hybrid() {
		e.commitSW(r, full)
	}
}

// storeRun emits the BlockStored event of r's blocks i..j-1 in group and
// hands each block's metadata to cache. The run's metadata, hashes, tokens
// and extra keys are allocated once, at their final size; its tokens are
// copied once and shared by the event and the blocks' metadata, so a
// cached block does not keep its request's whole token array alive.
func (e *Engine) storeRun(r *request, i, j, group int, cache func(k int, m *blockMeta)) {
	bs := e.cfg.BlockSize
	n := j - i
	metas := make([]blockMeta, n)
	ev := Event{
		Kind:      BlockStored,
		Hashes:    make([]uint64, 0, n),
		Tokens:    make([]uint32, 0, n*bs),
		BlockSize: bs,
		LoRAID:    r.req.LoRAID,
		LoRAName:  r.req.LoRAName,
		Medium:    MediumGPU,
		ExtraKeys: make([][]string, 0, n),
	}
	if group == GroupSlidingWindow {
		ev.Group, ev.SpecKind, ev.SlidingWindow = GroupSlidingWindow, SpecSlidingWindow, e.cfg.SlidingWindow
	}
	if i > 0 {
		ev.Parent, ev.HasParent = r.hashes[i-1], true
	}
	ev.Tokens = append(ev.Tokens, r.tokens[i*bs:j*bs]...)
	for k := i; k < j; k++ {
		m := &metas[k-i]
		e.fillMeta(m, r, k)
		m.tokens = ev.Tokens[(k-i)*bs : (k-i+1)*bs : (k-i+1)*bs]
		cache(k, m)
		ev.Hashes = append(ev.Hashes, r.hashes[k])
		ev.ExtraKeys = append(ev.ExtraKeys, m.extra)
	}
	e.events = append(e.events, ev)
}

// observeStep updates the step counters and running averages.
func (e *Engine) observeStep(d time.Duration, prefill, decode, reloaded int) {
	e.st.Busy += d
	e.st.PrefillTokens += int64(prefill)
	e.st.ReloadedTokens += int64(reloaded)
	if prefill > 0 {
		rate := float64(prefill) / d.Seconds()
		if e.st.PrefillRate == 0 {
			e.st.PrefillRate = rate
		} else {
			e.st.PrefillRate += ewmaWeight * (rate - e.st.PrefillRate)
		}
	}
	if decode > 0 {
		if e.st.DecodeStep == 0 {
			e.st.DecodeStep = d
		} else {
			e.st.DecodeStep += time.Duration(ewmaWeight * float64(d-e.st.DecodeStep))
		}
	}
}

type scheduled struct {
	r *request
	n int
}

// Step runs one scheduler step starting at max(now, end of the previous
// step): running requests first (decodes and unfinished chunked prefills, in
// arrival order, preempting the most recently admitted request when blocks
// run out), then waiting requests in order while the batch has room, the
// token budget lasts and blocks can be found. The step's duration is
// StepTime + StepTimePerSeq × batch + prefill tokens / PrefillTokensPerSec +
// reloaded tokens / ReloadTokensPerSec; tokens are sampled, and requests
// finish, at its end.
func (e *Engine) Step(now time.Duration) StepResult {
	start := max(now, e.busyUntil)
	res := StepResult{Start: start, End: start}
	if len(e.running) == 0 && len(e.waiting) == 0 {
		res.Idle = true
		return res
	}
	e.events = e.events[:0]
	budget := e.cfg.MaxNumBatchedTokens
	batch := e.batch[:0]
	defer func() { e.batch = batch[:0] }()
	preempted := false
	e.prefetchGrowth(budget)
	for i := 0; i < len(e.running) && budget > 0; i++ {
		r := e.running[i]
		n := min(len(r.tokens)-r.numComputed, budget)
		self := false
		for !e.grow(r, r.numComputed+n) {
			victim := e.running[len(e.running)-1]
			e.preempt(victim)
			res.Preempted = append(res.Preempted, victim.id)
			preempted = true
			if victim == r {
				self = true
				break
			}
		}
		if self {
			break
		}
		e.commit(r, r.numComputed+n)
		batch = append(batch, scheduled{r, n})
		budget -= n
	}
	reloaded := 0
	if !preempted {
		for len(e.waiting) > 0 && len(e.running) < e.cfg.MaxNumSeqs && budget > 0 {
			r := e.waiting[0]
			n, rl, ok := e.admit(r, budget, start)
			if !ok {
				break
			}
			e.waiting = e.waiting[1:]
			e.running = append(e.running, r)
			batch = append(batch, scheduled{r, n})
			budget -= n
			reloaded += rl
		}
	}
	prefill, decode := 0, 0
	for _, s := range batch {
		if s.n == 1 && s.r.outputs > 0 && s.r.numComputed == len(s.r.tokens)-1 {
			decode++
		} else {
			prefill += s.n
		}
	}
	d := e.cfg.StepTime + time.Duration(len(batch))*e.cfg.StepTimePerSeq +
		time.Duration(float64(prefill)/e.cfg.PrefillTokensPerSec*float64(time.Second)) +
		time.Duration(float64(reloaded)/e.cfg.ReloadTokensPerSec*float64(time.Second))
	end := start + d
	res.End, res.Batch = end, len(batch)
	res.PrefillTokens, res.DecodeTokens, res.ReloadedTokens = prefill, decode, reloaded
	e.observeStep(d, prefill, decode, reloaded)
	finished := false
	res.Tokens = make([]Token, 0, len(batch))
	for _, s := range batch {
		r := s.r
		r.numComputed += s.n
		if r.numComputed < len(r.tokens) {
			continue
		}
		tok := r.gen.Next()
		r.tokens = append(r.tokens, tok)
		r.outputs++
		e.st.GenerationTokens++
		if r.outputs == 1 {
			r.firstToken = end
			e.st.FirstTokens++
			e.st.TTFTSum += end - r.arrival
			e.st.QueueTimeSum += r.scheduled - r.arrival
			e.st.PrefillTimeSum += end - r.scheduled
		}
		res.Tokens = append(res.Tokens, Token{ID: r.id, Token: tok, Index: r.outputs - 1})
		if r.outputs >= r.req.MaxTokens || len(r.tokens) >= e.cfg.MaxModelLen {
			e.releaseBlocks(r)
			r.state = done
			finished = true
			delete(e.reqs, r.id)
			e.st.Finished++
			e.st.DecodeTimeSum += end - r.firstToken
			res.Finished = append(res.Finished, Finished{
				ID: r.id, PromptTokens: len(r.req.Prompt), CachedTokens: r.cached, ReloadedTokens: r.reloaded,
				OutputTokens: r.outputs, Preemptions: r.preemptions, Arrival: r.arrival,
				Scheduled: r.scheduled, FirstToken: r.firstToken, Finish: end, Reason: "length",
				Hashes: r.hashes,
			})
		}
	}
	if finished {
		e.running = slices.DeleteFunc(e.running, func(x *request) bool { return x.state == done })
	}
	if len(e.events) > 0 {
		// Hand the batch over; the next step starts a fresh one.
		res.Events = e.events
		e.events, e.spare = e.spare, nil
		if e.events == nil {
			e.events = make([]Event, 0, len(res.Events))
		}
	}
	e.busyUntil = end
	e.st.Steps++
	return res
}
