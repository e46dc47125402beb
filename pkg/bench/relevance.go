package bench

import (
	"fmt"
	"slices"

	"github.com/kvroute/kvroute/pkg/engine"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

// filterIrrelevant turns the relevance filter on (tests compare runs with
// it off).
var filterIrrelevant = true

// relevance tells which blocks the router's index needs: the router only
// ever reads the index through Match over the blocks of an arriving
// request's prompt, so a block that no request still to arrive holds can
// never change a decision, and nor can its descendants (a prompt holding a
// block holds its whole chain before it). The simulator knows every prompt
// in advance: a conversation's next prompt is its last prompt, the tokens
// the engine generated for it (they depend only on the engine seed and the
// prompt) and the next turn's new tokens. So relevance counts, for every
// engine block hash, the requests not yet arrived whose prompt holds it,
// and the simulator passes the index only events about blocks with a
// count above zero: every Match answer is the same as with every event
// applied, for about half the index work. Counts only fall, so a block
// left out is never needed again; a removal left out leaves an entry no
// later match reads. A workload whose prompts the simulator rebuilds
// differently from this prediction is a bug that Simulate reports (the
// counts would not all end at zero).
type relevance struct {
	*prepared
	blocks *hashTable[blockInfo] // the simulator's; pending counts here
	left   int64                 // sum of pending
	broken bool                  // a count went below zero
}

// prepared is what relevance computes from the workload alone, before any
// policy runs: every turn's prompt block hashes and, per block hash, how
// many prompts hold it. It is read-only once built, so the simulations of
// every policy on one workload and engine share it (RunCases), each
// starting from a copy of its counts.
type prepared struct {
	eng *engine.Engine // hashes and generates as every replica does
	// hashes are every turn's prompt block hashes, per session.
	hashes [][][]uint64
	blocks hashTable[blockInfo] // pending counts only
	left   int64
}

// prepare computes w's prepared relevance on engines configured as cfg.
func prepare(w *Workload, cfg engine.Config) (*prepared, error) {
	e, err := engine.New(cfg, 1)
	if err != nil {
		return nil, err
	}
	p := &prepared{eng: e, hashes: make([][][]uint64, len(w.Sessions))}
	for i := range w.Sessions {
		ss := &w.Sessions[i]
		var hist []uint32
		var prev []uint64
		for k, t := range ss.Turns {
			var prompt []uint32
			if t.TraceIDs != nil {
				prompt = kvblock.ExpandTrace(t.TraceIDs, t.TraceLen, t.TraceBlock)
			} else {
				prompt = Expand(hist, t.Append)
			}
			prompt, out, _ := fitPrompt(prompt, t.Output, cfg.MaxModelLen)
			if len(prompt) == 0 || out < 1 {
				break // the simulation stops with an error here
			}
			hashes := e.ExtendHashes(prev, engine.Request{Prompt: prompt})
			for _, h := range hashes {
				b, _ := p.blocks.ref(h)
				b.pending++
			}
			p.left += int64(len(hashes))
			p.hashes[i] = append(p.hashes[i], hashes)
			if k+1 < len(ss.Turns) && t.TraceIDs == nil {
				hist = append(prompt[:len(prompt):len(prompt)], t.resent(e.Generated(prompt, requestSample(i, k), out))...)
				prev = hashes
			}
		}
	}
	return p, nil
}

// newRelevance starts a simulation's relevance from p: blocks (the
// simulator's table, empty) becomes a copy of p's counts.
func newRelevance(p *prepared, blocks *hashTable[blockInfo]) *relevance {
	*blocks = p.blocks.clone()
	return &relevance{prepared: p, blocks: blocks, left: p.left}
}

// arrived counts turn of sess, whose prompt is prompt, as arrived, and
// returns the prompt's predicted block hashes (shared: read only).
func (rl *relevance) arrived(sess, turn int, prompt []uint32) []uint64 {
	all := rl.hashes[sess]
	if turn >= len(all) {
		rl.broken = true
		return nil
	}
	hashes := all[turn]
	if len(hashes) != len(prompt)/rl.eng.Config().BlockSize {
		rl.broken = true
	}
	for i := range min(probeAhead, len(hashes)) {
		rl.blocks.prefetch(hashes[i])
	}
	for i, h := range hashes {
		if i+probeAhead < len(hashes) {
			rl.blocks.prefetch(hashes[i+probeAhead])
		}
		b, _ := rl.blocks.ref(h)
		if b.pending <= 0 {
			rl.broken = true
			continue
		}
		b.pending--
		rl.left--
	}
	return hashes
}

// served checks a finished request's predicted prompt hashes against the
// hashes its engine computed (its full prompt blocks come first).
func (rl *relevance) served(predicted, computed []uint64) {
	if len(computed) < len(predicted) || !slices.Equal(predicted, computed[:len(predicted)]) {
		rl.broken = true
	}
}

// needed reports whether a request still to arrive holds block h.
func (rl *relevance) needed(h uint64) bool {
	b, _ := rl.blocks.get(h)
	return b.pending > 0
}

// prefetch starts loading h's count (see hashTable.prefetch).
func (rl *relevance) prefetch(h uint64) { rl.blocks.prefetch(h) }

// check reports a prediction that did not match the prompts sent.
func (rl *relevance) check() error {
	if rl.broken || rl.left != 0 {
		return fmt.Errorf("%w: internal: the predicted prompts differ from the simulated ones (%d block counts left)", ErrSim, rl.left)
	}
	return nil
}
