package route

import (
	"slices"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

// longestMatch is the most blocks (at the primary block size) any
// candidate's index holds of the request.
func longestMatch(sc *scratch) int {
	longest := 0
	for _, c := range sc.cands {
		longest = max(longest, c.MatchedBlocks())
	}
	return longest
}

// drawingPrefix returns the key (at the primary block size) of the
// deepest block of the longest match any candidate has for the request
// (longest, longestMatch); ok is false without a match. It reads the key
// from sc.own when Decide hashed the prompt there, else hashes the
// matched prefix.
func (r *Router) drawingPrefix(sc *scratch, root kvblock.Key, opts kvblock.Options, tokens []uint32, primary int, hasIDs bool, longest int) (kvblock.Key, bool) {
	if !hasIDs {
		return 0, false
	}
	longest = min(longest, len(tokens)/primary)
	if longest == 0 {
		return 0, false
	}
	if len(sc.own) >= longest {
		return sc.own[longest-1], true
	}
	sc.keys = kvblock.Keys(sc.keys[:0], root, tokens[:longest*primary], primary, opts)
	return sc.keys[longest-1], true
}

// match computes the request's keys (from root) per distinct block size
// and lookahead of the candidates whose source is src, matches them with m
// and fills those candidates' matched blocks: raw (in the replica's own
// blocks) for the decision, converted to the primary block size for the
// policy. A lookahead (engine events, Replica.Lookahead) keys the blocks as
// kvblock.Options.WithLookahead does, as that engine hashes them. own,
// when not nil, is the prompt's keys at the primary block size from root
// with opts, already hashed by the caller: the candidates of that block
// size without a lookahead are matched with them, not hashed again.
func (r *Router) match(sc *scratch, root kvblock.Key, opts kvblock.Options, tokens []uint32, own []kvblock.Key, src source, m Matcher, raw []Candidate, primary int) {
	sc.sizes = sc.sizes[:0]
	for k, bs := range sc.bs {
		sh := shape{bs, 0}
		if src == srcEvents {
			sh.la = sc.la[k]
		}
		if sc.src[k] == src && !slices.Contains(sc.sizes, sh) {
			sc.sizes = append(sc.sizes, sh)
		}
	}
	for _, sh := range sc.sizes {
		bs := sh.bs
		keys := own
		if own == nil || bs != primary || sh.la > 0 {
			o, n := opts.WithLookahead(tokens, bs, sh.la)
			sc.keys = kvblock.Keys(sc.keys[:0], root, tokens[:n], bs, o)
			keys = sc.keys
		}
		if len(keys) == 0 {
			continue
		}
		sc.matches = m.Match(keys, sc.matches[:0])
		for _, mt := range sc.matches {
			for k := range sc.cands {
				if sc.src[k] != src || sc.bs[k] != bs || (src == srcEvents && sc.la[k] != sh.la) || sc.cands[k].Replica != mt.Replica {
					continue
				}
				raw[k].Matched = mt.ByTier
				if bs == primary {
					sc.cands[k].Matched = mt.ByTier
				} else {
					for t := range mt.ByTier {
						sc.cands[k].Matched[t] = mt.ByTier[t] * bs / primary
					}
				}
			}
		}
	}
}

// vouch credits the replicas the router sent the longest earlier prompt
// this one resends (Router.prompts: the last bookSenders of them), where a
// replica's view is known to miss stores (ViewGaps) and its index shows
// less of that prompt, with the blocks the index does not show there
// (Candidate.Vouched). Every sender is credited, not the last: siblings
// that sent one task prompt to several replicas each hold it there, and
// crediting only the last sender would draw all their next turns to it. A
// view being relearned (Trust 0: its matches count for nothing) is
// credited the whole prompt at the approximate mode's trust
// (Options.ApproxTrust), as the router's own dispatches are credited where
// no events come.
func (r *Router) vouch(sc *scratch, raw []Candidate) {
	gaps := r.opts.State.(ViewGaps)
	n := len(sc.own) // the prompt's full blocks, hashed by Decide
	// Only a prompt longer than some gapped candidate's credited match can
	// add credit: the book is probed down to the least such match.
	least := n
	for k := range sc.cands {
		if c := &sc.cands[k]; sc.src[k] == srcEvents && gaps.ViewGaps(c.Replica) {
			if c.Trust == 0 {
				least = 0
				break
			}
			least = min(least, c.MatchedBlocks())
		}
	}
	if least >= n {
		return
	}
	sent, ok := r.prompts.longest(sc.own, least)
	if !ok {
		return
	}
	for k := range sc.cands {
		c := &sc.cands[k]
		if !sent.sentTo(c.Replica) || sc.src[k] != srcEvents || !gaps.ViewGaps(c.Replica) {
			continue
		}
		if c.Trust == 0 {
			// The router's own records stand in for the view: its
			// matches count for nothing, what it sent there does.
			c.Matched, c.Trust = [index.NumTiers]int{}, r.opts.ApproxTrust
		}
		// A prompt still in flight there (Pending) is the pending credit's
		// to weigh: its blocks are being computed, not held.
		if have := c.MatchedBlocks(); c.Pending == 0 && have < sent.blocks {
			c.Matched[index.TierGPU] += sent.blocks - have
			raw[k].Vouched = sent.blocks - have
		}
	}
}

// matchPending sets each event-fed candidate's Pending to the blocks
// Options.Pending remembers were just sent there beyond both its own
// indexed match and the longest prefix any candidate's events show (the
// match itself stays what the index holds: the policy decides what a
// prefix still being prefilled is worth, see policy.Candidate.Pending). Blocks some replica is known
// to hold earn no pending credit elsewhere: a burst sharing a system
// prompt the fleet already holds is spread by the prediction as before,
// not pulled onto whichever replica took its first members; pending
// credit is for the part of a prefix nobody holds yet (a new task's
// samples, fan-out siblings), and only when that part is at least
// 1/PendingMinShare of the prompt: a guess about blocks not yet computed
// does not tip a choice the indexed blocks and the load should make (a
// burst whose members share one more block than the indexed system
// prompt). Pending's keys are this router's own (no lookahead: they are
// only ever compared with themselves).
func (r *Router) matchPending(sc *scratch, root kvblock.Key, opts kvblock.Options, tokens []uint32, now time.Time, raw []Candidate, primary int) {
	sc.sizes = sc.sizes[:0]
	for k, bs := range sc.bs {
		if sc.src[k] == srcEvents && !slices.Contains(sc.sizes, shape{bs, 0}) {
			sc.sizes = append(sc.sizes, shape{bs, 0})
		}
	}
	// The longest prefix any candidate's events show, in tokens: pending
	// credit is for prefixes beyond it only.
	indexed := 0
	for k := range sc.cands {
		if sc.src[k] != srcEvents {
			continue
		}
		have := 0
		for _, n := range raw[k].Matched {
			have += n
		}
		indexed = max(indexed, have*sc.bs[k])
	}
	for _, sh := range sc.sizes {
		keys := sc.own // hashed by decide at the primary block size
		if sh.bs != primary {
			sc.keys = kvblock.Keys(sc.keys[:0], root, tokens, sh.bs, opts)
			keys = sc.keys
		}
		if len(keys) <= indexed/sh.bs { // nothing beyond the indexed prefix
			continue
		}
		sc.matches = r.opts.Pending.Match(keys, now, sc.matches[:0])
		for _, mt := range sc.matches {
			for k := range sc.cands {
				if sc.src[k] != srcEvents || sc.bs[k] != sh.bs || sc.cands[k].Replica != mt.Replica {
					continue
				}
				have := 0
				for _, n := range raw[k].Matched {
					have += n
				}
				if extra := mt.Blocks - max(have, indexed/sh.bs); extra > 0 && extra*PendingMinShare >= len(keys) {
					raw[k].Pending = extra
					sc.cands[k].Pending = extra * sh.bs / primary
				}
			}
		}
	}
}

// approxMatcher matches against an ApproxIndex at a fixed time.
type approxMatcher struct {
	x    *ApproxIndex
	now  time.Time
	grid *[]kvblock.Key // reused buffer for the grid keys
}

// Match matches the keys at the approximate mode's grid positions
// (approxGrid) and converts each replica's count of grid keys back to
// blocks: a replica holding grid keys 0..j-1 is credited the blocks up to
// and including the (j-1)th grid position.
func (a approxMatcher) Match(keys []kvblock.Key, dst []index.ReplicaMatch) []index.ReplicaMatch {
	start := len(dst)
	*a.grid = approxGrid((*a.grid)[:0], keys)
	dst = a.x.Match(*a.grid, a.now, dst)
	for i := start; i < len(dst); i++ {
		b := approxGridBlocks(dst[i].Blocks, len(keys))
		dst[i].Blocks, dst[i].ByTier = b, [index.NumTiers]int{index.TierGPU: b}
	}
	return dst
}

// The approximate mode records and matches a prompt's keys at grid
// positions only: every block of the first approxGridDense, then every
// approxGridStep1-th up to approxGridFar, then every approxGridStep2-th,
// and the last block. A long prompt's record is then a few hundred map
// inserts rather than one per block (a 229 KB chat has about 3.5k blocks
// of 16 tokens), and a match deeper than approxGridDense blocks is
// credited to the last grid position it reaches: at most 15 blocks short
// below approxGridFar blocks and 63 beyond, when the prefix ends between
// grid positions of the longer prompt.
const (
	approxGridDense = 64
	approxGridStep1 = 16
	approxGridFar   = 1024
	approxGridStep2 = 64
)

// onApproxGrid reports whether block p of an n-block prompt is on the grid.
func onApproxGrid(p, n int) bool {
	switch {
	case p < approxGridDense || p == n-1:
		return true
	case p < approxGridFar:
		return p%approxGridStep1 == approxGridStep1-1
	}
	return p%approxGridStep2 == approxGridStep2-1
}

// approxGrid appends to dst the keys at grid positions.
func approxGrid(dst, keys []kvblock.Key) []kvblock.Key {
	for p, k := range keys {
		if onApproxGrid(p, len(keys)) {
			dst = append(dst, k)
		}
	}
	return dst
}

// approxGridBlocks is the blocks covered by the first j grid keys of an
// n-block prompt: the (j-1)th grid position plus one.
func approxGridBlocks(j, n int) int {
	for p := range n {
		if onApproxGrid(p, n) {
			if j--; j == 0 {
				return p + 1
			}
		}
	}
	return 0
}
