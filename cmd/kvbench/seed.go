package main

import (
	"container/list"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/policy"
)

// The seed document's constants.
const (
	seedBlock     = 16     // tokens per block
	seedVocab     = 50_000 // token ids are drawn from [0, seedVocab)
	seedReplicas  = 4
	seedSessions  = 48
	seedTurns     = 3
	seedSysBlocks = 4
	seedModel     = "seed-model"
	// defaultSeedSeed is the fixed seed of `kvbench seed` (the seed
	// document's simulate() uses 7).
	defaultSeedSeed = 7
)

// SeedReport is `kvbench seed --json`: the seed's executed experiments
// re-run with the real kvblock, index and policy packages. README.md
// ("## kvbench seed") documents every field.
type SeedReport struct {
	Boundary BoundaryReport `json:"boundary"`
	Decay    DecayReport    `json:"decay"`
	Herding  HerdingReport  `json:"herding"`
	Stale    StaleReport    `json:"stale"`
}

// BoundaryReport: matched blocks of a 9-block prompt after one-token edits.
type BoundaryReport struct {
	Of                int `json:"of"`
	FlipLastOfBlock3  int `json:"flip_last_of_block3"`
	FlipFirstOfBlock4 int `json:"flip_first_of_block4"`
	FlipTail          int `json:"flip_tail"`
	PrependOne        int `json:"prepend_one"`
	SubBlockKeys      int `json:"sub_block_keys"`
}

// DecayReport: Dynamo's overlap-credit decay example.
type DecayReport struct {
	PlainCredit                  float64 `json:"plain_credit"`
	DecayedCredit                float64 `json:"decayed_credit"`
	LeastLoadedUnchanged         bool    `json:"least_loaded_unchanged"`
	IncomingActiveShiftInvariant bool    `json:"incoming_active_shift_invariant"`
}

// HerdingReport: the 48-session, 3-turn batch under three policies.
type HerdingReport struct {
	Requests        int        `json:"requests"`
	PureAffinity    HerdingRun `json:"pure_affinity"`
	Blended         HerdingRun `json:"blended"`
	Credit0         HerdingRun `json:"credit0"`
	MakespanSpeedup float64    `json:"makespan_speedup"`
	Credit0Penalty  float64    `json:"credit0_penalty"`
}

// HerdingRun is one policy's outcome.
type HerdingRun struct {
	Placement  []int    `json:"placement"`
	BacklogCV  float64  `json:"backlog_cv"`
	Makespan   float64  `json:"makespan"`
	Stickiness *float64 `json:"stickiness,omitempty"`
}

// StaleReport: an LRU engine's real hits versus the index's belief.
type StaleReport struct {
	WithoutRemovals StaleRun `json:"without_removals"`
	WithRemovals    StaleRun `json:"with_removals"`
	PhantomPoints   float64  `json:"phantom_points"`
}

// StaleRun counts blocks over the replay.
type StaleRun struct {
	Believed int `json:"believed"`
	Served   int `json:"served"`
	Total    int `json:"total"`
}

func runSeed(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("seed", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print exactly one JSON object instead of the table")
	seed := fs.Uint64("seed", defaultSeedSeed, "random seed of the synthetic workloads and tie-breaks")
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	rep, err := seedExperiments(*seed)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		return enc.Encode(rep)
	}
	printSeed(stdout, rep, *seed)
	return nil
}

// seedExperiments runs every experiment under one seed.
func seedExperiments(seed uint64) (SeedReport, error) {
	var rep SeedReport
	var err error
	rep.Boundary, err = seedBoundary(seed)
	if err != nil {
		return rep, err
	}
	rep.Decay, err = seedDecay()
	if err != nil {
		return rep, err
	}
	rep.Herding, err = seedHerding(seed)
	if err != nil {
		return rep, err
	}
	rep.Stale, err = seedStale(seed)
	return rep, err
}

func newRand(seed, stream uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, stream)) }

func randomTokens(r *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(r.IntN(seedVocab))
	}
	return out
}

func concat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

var seedRoot = kvblock.Root(seedModel, "")

func keysOf(tokens []uint32) []kvblock.Key {
	return kvblock.Keys(nil, seedRoot, tokens, seedBlock, kvblock.Options{})
}

// engineHash is a synthetic engine block hash for a router key: opaque to
// the index, distinct from the key, one per block.
func engineHash(k kvblock.Key) uint64 { return uint64(k)*0x9e3779b97f4a7c15 + 0x7f4a7c15 }

func engineHashes(keys []kvblock.Key) []uint64 {
	out := make([]uint64, len(keys))
	for i, k := range keys {
		out[i] = engineHash(k)
	}
	return out
}

// storeAll feeds the index a BlockStored event for every full block of
// tokens on replica, as an engine would after a prefill.
func storeAll(ix *index.Index, replica index.ReplicaID, tokens []uint32) error {
	keys := keysOf(tokens)
	res := ix.Stored(index.Stored{
		Replica: replica, Root: seedRoot, Hashes: engineHashes(keys),
		Tokens: tokens[:len(keys)*seedBlock], BlockSize: seedBlock, Tier: index.TierGPU,
	})
	if res.BadShape || res.UnknownParent || res.Blocks != len(keys) {
		return fmt.Errorf("seed: index rejected a stored event: %+v", res)
	}
	return nil
}

// matched returns each replica's matched blocks for tokens.
func matched(ix *index.Index, tokens []uint32, replicas []index.ReplicaID) []int {
	ms := ix.Match(keysOf(tokens), nil)
	out := make([]int, len(replicas))
	for _, m := range ms {
		for i, r := range replicas {
			if m.Replica == r {
				out[i] = m.Blocks
			}
		}
	}
	return out
}

func replicaIDs(n int) []index.ReplicaID {
	ids := make([]index.ReplicaID, n)
	for i := range ids {
		ids[i] = index.ReplicaID(fmt.Sprint("replica-", i))
	}
	return ids
}

// seedBoundary is the seed's section 2: the block, not the token, is the
// unit of matching.
func seedBoundary(seed uint64) (BoundaryReport, error) {
	r := newRand(seed, 2)
	sys := randomTokens(r, seedSysBlocks*seedBlock)
	base := concat(sys, randomTokens(r, 5*seedBlock+9)) // 9 full blocks + a 9-token tail
	ix := index.New(index.Config{})
	solo := replicaIDs(1)
	if err := storeAll(ix, solo[0], base); err != nil {
		return BoundaryReport{}, err
	}
	flip := func(i int) []uint32 {
		out := append([]uint32(nil), base...)
		out[i] = (out[i] + 1) % seedVocab
		return out
	}
	m := func(tokens []uint32) int { return matched(ix, tokens, solo)[0] }
	return BoundaryReport{
		Of:                m(base),
		FlipLastOfBlock3:  m(flip(4*seedBlock - 1)),
		FlipFirstOfBlock4: m(flip(4 * seedBlock)),
		FlipTail:          m(flip(9*seedBlock + 3)),
		PrependOne:        m(concat([]uint32{7}, base)),
		SubBlockKeys:      len(keysOf(base[:seedBlock-1])),
	}, nil
}

// seedDecay is the seed's decay example on the real blended policy: two
// replicas with 6 matched blocks of an 8-block request, the second carrying
// 8 blocks (one request-equivalent) of excess active prefill.
func seedDecay() (DecayReport, error) {
	plainP, err := policy.NewBlended(policy.BlendedConfig{})
	if err != nil {
		return DecayReport{}, err
	}
	decayP, err := policy.NewBlended(policy.BlendedConfig{OverlapScoreCreditDecay: 1})
	if err != nil {
		return DecayReport{}, err
	}
	cands := make([]policy.Candidate, 2)
	for i := range cands {
		cands[i] = policy.Candidate{
			Replica: index.ReplicaID(fmt.Sprint("replica-", i)),
			Matched: [index.NumTiers]int{6, 0, 0},
			Trust:   1,
			Load:    load.Load{ActivePrefillBlocks: float64(8 * i), Healthy: true},
		}
	}
	env := policy.Env{Rand: newRand(1, 1)}
	req := policy.Request{PromptBlocks: 8}
	plain := plainP.Pick(req, cands, env)
	decayed := decayP.Pick(req, cands, env)
	shifted := plainP.Pick(policy.Request{PromptBlocks: 8, ExpectedOutputBlocks: 4}, cands, env)
	invariant := shifted.Pick == plain.Pick
	for i := range cands {
		invariant = invariant && shifted.Costs[i]-plain.Costs[i] == 4
	}
	raw := 8.0 + 8.0 // replica 1's active prefill plus the prompt
	return DecayReport{
		PlainCredit:                  raw - plain.Costs[1],
		DecayedCredit:                raw - decayed.Costs[1],
		LeastLoadedUnchanged:         plain.Costs[0] == decayed.Costs[0],
		IncomingActiveShiftInvariant: invariant,
	}, nil
}

// seedHerding is the seed's simulate() under pure affinity, blended
// (credit 1) and blended with overlap_score_credit 0. The workload is the
// same in all three runs (one stream, seeded alike); tie-breaks draw from
// their own stream.
func seedHerding(seed uint64) (HerdingReport, error) {
	pure, err := policy.New(policy.NamePureAffinity, policy.Config{})
	if err != nil {
		return HerdingReport{}, err
	}
	blended, err := policy.New(policy.NameBlended, policy.Config{})
	if err != nil {
		return HerdingReport{}, err
	}
	zero, err := policy.New(policy.NameBlended, policy.Config{Blended: policy.BlendedConfig{OverlapScoreCredit: policy.Float(0)}})
	if err != nil {
		return HerdingReport{}, err
	}
	var h HerdingReport
	var n int
	if h.PureAffinity, n, err = simulate(pure, seed); err != nil {
		return h, err
	}
	if h.Blended, _, err = simulate(blended, seed); err != nil {
		return h, err
	}
	if h.Credit0, _, err = simulate(zero, seed); err != nil {
		return h, err
	}
	h.Requests = n
	h.PureAffinity.Stickiness = nil // the seed reports it only for the load-aware runs
	h.MakespanSpeedup = h.PureAffinity.Makespan / h.Blended.Makespan
	h.Credit0Penalty = h.Credit0.Makespan / h.Blended.Makespan
	return h, nil
}

// simulate mirrors the seed's simulate() line by line: 48 sessions of a
// shared 4-block system prompt plus a 3..9-block body; each later turn
// resends the history plus 2 new blocks. Replica 0 is warmed with the
// system prompt. Each pick adds the uncached prompt blocks to the replica's
// prefill backlog and half the prompt blocks to its decode backlog, and the
// index learns the prompt from a BlockStored event. incoming_active_blocks
// is half the request's blocks.
func simulate(p policy.Policy, seed uint64) (HerdingRun, int, error) {
	w := newRand(seed, 3) // the workload stream: identical for every policy
	env := policy.Env{Rand: newRand(seed, 4)}
	ids := replicaIDs(seedReplicas)
	ix := index.New(index.Config{})
	sys := randomTokens(w, seedSysBlocks*seedBlock)
	convo := make([][]uint32, seedSessions)
	for s := range convo {
		body := 3 + w.IntN(7) // 3..9 blocks, numpy's integers(3, 10)
		convo[s] = concat(sys, randomTokens(w, body*seedBlock))
	}
	if err := storeAll(ix, ids[0], sys); err != nil {
		return HerdingRun{}, 0, err
	}
	var prefill, decode [seedReplicas]float64
	var placed [seedReplicas]int
	first := make([]int, seedSessions)
	sticky, later := 0, 0
	cands := make([]policy.Candidate, seedReplicas)
	for t := range seedTurns {
		for s := range seedSessions {
			if t > 0 {
				convo[s] = concat(convo[s], randomTokens(w, 2*seedBlock))
			}
			reqBlocks := len(convo[s]) / seedBlock
			m := matched(ix, convo[s], ids)
			for i := range cands {
				cands[i] = policy.Candidate{
					Replica: ids[i],
					Matched: [index.NumTiers]int{m[i], 0, 0},
					Trust:   1,
					Load: load.Load{
						ActivePrefillBlocks: prefill[i],
						ActiveDecodeBlocks:  decode[i],
						ActiveRequests:      placed[i],
						Healthy:             true,
					},
				}
			}
			res := p.Pick(policy.Request{
				PromptBlocks:         reqBlocks,
				PromptTokens:         len(convo[s]),
				ExpectedOutputBlocks: 0.5 * float64(reqBlocks),
			}, cands, env)
			pick := res.Pick
			if pick < 0 {
				return HerdingRun{}, 0, fmt.Errorf("seed: %s picked nothing (%s)", p.Name(), res.Reason)
			}
			placed[pick]++
			if t == 0 {
				first[s] = pick
			} else {
				later++
				if pick == first[s] {
					sticky++
				}
			}
			prefill[pick] += float64(max(0, reqBlocks-m[pick]))
			decode[pick] += 0.5 * float64(reqBlocks)
			if err := storeAll(ix, ids[pick], convo[s]); err != nil {
				return HerdingRun{}, 0, err
			}
		}
	}
	backlog := make([]float64, seedReplicas)
	total := 0
	for i := range backlog {
		backlog[i] = prefill[i] + decode[i]
		total += placed[i]
	}
	st := float64(sticky) / float64(later)
	return HerdingRun{
		Placement:  placed[:],
		BacklogCV:  cv(backlog),
		Makespan:   maxOf(backlog),
		Stickiness: &st,
	}, total, nil
}

// cv is the coefficient of variation (population standard deviation over
// the mean, numpy's default).
func cv(xs []float64) float64 {
	mean := 0.0
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	v := 0.0
	for _, x := range xs {
		v += (x - mean) * (x - mean)
	}
	return math.Sqrt(v/float64(len(xs))) / mean
}

func maxOf(xs []float64) float64 {
	m := math.Inf(-1)
	for _, x := range xs {
		m = math.Max(m, x)
	}
	return m
}

// lruEngine is an engine's real GPU-resident block set: capacity-bounded,
// least recently used evicted first, keyed by engine block hash.
type lruEngine struct {
	capacity int
	order    *list.List // front = most recent
	slots    map[uint64]*list.Element
}

func newLRUEngine(capacity int) *lruEngine {
	return &lruEngine{capacity: capacity, order: list.New(), slots: make(map[uint64]*list.Element)}
}

// admit makes hashes resident and returns the evicted ones.
func (e *lruEngine) admit(hashes []uint64) []uint64 {
	var evicted []uint64
	for _, h := range hashes {
		if el, ok := e.slots[h]; ok {
			e.order.MoveToFront(el)
			continue
		}
		if len(e.slots) >= e.capacity {
			old := e.order.Back()
			oh := e.order.Remove(old).(uint64)
			delete(e.slots, oh)
			evicted = append(evicted, oh)
		}
		e.slots[h] = e.order.PushFront(h)
	}
	return evicted
}

// realHit counts the leading hashes resident.
func (e *lruEngine) realHit(hashes []uint64) int {
	for i, h := range hashes {
		if _, ok := e.slots[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// seedStale is the seed's section 4: 40 requests of the system prompt plus
// 4 own blocks, twice over, through a 60-block LRU engine; the index is fed
// BlockStored events and, in the second run, BlockRemoved for evictions.
func seedStale(seed uint64) (StaleReport, error) {
	run := func(propagate bool) (StaleRun, error) {
		r := newRand(seed, 5)
		sys := randomTokens(r, seedSysBlocks*seedBlock)
		reqs := make([][]uint32, 40)
		for i := range reqs {
			reqs[i] = concat(sys, randomTokens(r, 4*seedBlock))
		}
		eng := newLRUEngine(60)
		ix := index.New(index.Config{})
		id := replicaIDs(1)
		var out StaleRun
		for _, toks := range append(append([][]uint32(nil), reqs...), reqs...) {
			hs := engineHashes(keysOf(toks))
			out.Believed += matched(ix, toks, id)[0]
			out.Served += eng.realHit(hs)
			out.Total += len(hs)
			ev := eng.admit(hs)
			if err := storeAll(ix, id[0], toks); err != nil {
				return out, err
			}
			if propagate {
				ix.Removed(index.Removed{Replica: id[0], Hashes: ev, Tier: index.TierGPU})
			}
		}
		return out, nil
	}
	var s StaleReport
	var err error
	if s.WithoutRemovals, err = run(false); err != nil {
		return s, err
	}
	if s.WithRemovals, err = run(true); err != nil {
		return s, err
	}
	w := s.WithoutRemovals
	s.PhantomPoints = 100 * float64(w.Believed-w.Served) / float64(w.Total)
	return s, nil
}

func printSeed(w io.Writer, r SeedReport, seed uint64) {
	b, d, h, s := r.Boundary, r.Decay, r.Herding, r.Stale
	fmt.Fprintf(w, "kvbench seed (seed %d): the seed document's experiments on the real kvblock/index/policy packages\n\n", seed)
	fmt.Fprintf(w, "boundary (matched blocks of %d):\n", b.Of)
	fmt.Fprintf(w, "  %-36s %d\n", "flip last token of block 3", b.FlipLastOfBlock3)
	fmt.Fprintf(w, "  %-36s %d\n", "flip first token of block 4", b.FlipFirstOfBlock4)
	fmt.Fprintf(w, "  %-36s %d\n", "flip inside the partial tail", b.FlipTail)
	fmt.Fprintf(w, "  %-36s %d\n", "prepend one token", b.PrependOne)
	fmt.Fprintf(w, "  %-36s %d\n\n", "keys of a sub-block prompt", b.SubBlockKeys)
	fmt.Fprintf(w, "decay: 6 matched blocks credited as %g at decay=1 with one request-equivalent of excess prefill (was %g)\n",
		d.DecayedCredit, d.PlainCredit)
	fmt.Fprintf(w, "       least-loaded candidate unchanged: %v; incoming_active_blocks shift-invariant: %v\n\n",
		d.LeastLoadedUnchanged, d.IncomingActiveShiftInvariant)
	fmt.Fprintf(w, "herding (%d requests, %d replicas):\n", h.Requests, seedReplicas)
	fmt.Fprintf(w, "  %-14s %-20s %10s %10s %11s\n", "policy", "placement", "backlog cv", "makespan", "stickiness")
	row := func(name string, run HerdingRun) {
		st := "-"
		if run.Stickiness != nil {
			st = fmt.Sprintf("%.1f%%", 100**run.Stickiness)
		}
		fmt.Fprintf(w, "  %-14s %-20s %10.3f %10.1f %11s\n", name, fmt.Sprint(run.Placement), run.BacklogCV, run.Makespan, st)
	}
	row("pure affinity", h.PureAffinity)
	row("blended", h.Blended)
	row("credit 0", h.Credit0)
	fmt.Fprintf(w, "  makespan speedup (pure affinity / blended): %.2fx; credit-0 penalty (credit 0 / blended): %.2fx\n\n",
		h.MakespanSpeedup, h.Credit0Penalty)
	fmt.Fprintf(w, "stale index: without removal events believed %d/%d blocks cached, engine served %d/%d (%.1f pts of phantom hit rate);\n",
		s.WithoutRemovals.Believed, s.WithoutRemovals.Total, s.WithoutRemovals.Served, s.WithoutRemovals.Total, s.PhantomPoints)
	fmt.Fprintf(w, "             with removal events believed %d == served %d\n", s.WithRemovals.Believed, s.WithRemovals.Served)
}
