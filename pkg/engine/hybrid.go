package engine

import "time"

// Hybrid-attention engines (Config.SlidingWindow > 0), after vLLM 0.33's
// hybrid KV-cache coordinator with one full-attention group (0) and one
// sliding-window group (1) of the same block size, drawing from one block
// pool:
//
//   - A request holds a block per full block of its tokens in each group,
//     except that sliding-window blocks wholly outside the window of the
//     next token to compute (the first max(0, computed - window + 1)
//     tokens, in whole blocks) are released before each allocation and
//     stay null (SlidingWindowManager.remove_skipped_blocks). Released
//     blocks stay cached and are evicted in free-list order like any other,
//     so a long prompt's early sliding-window blocks are evicted before its
//     full-attention blocks.
//   - Both groups cache every newly full block (with equal block sizes
//     vLLM's reachable-block mask keeps them all), each under its own key,
//     and publish it in one BlockStored per group and run, group 0 first:
//     group_idx, kv_cache_spec_kind ("full_attention", "sliding_window")
//     and, for group 1, kv_cache_spec_sliding_window. An evicted block's
//     BlockRemoved names its group.
//   - A prefix hit is decided as vLLM's coordinator decides it for a
//     simple hybrid: L = the longest prefix of full-attention blocks
//     cached (never the prompt's last token); then, scanning from block
//     L-1 down, the first run of ceil((window-1)/block size) consecutive
//     sliding-window blocks cached ends the hit; with no such run the hit
//     is the run of cached sliding-window blocks from block 0. Only the
//     hit's last window of sliding-window blocks is taken.

func (e *Engine) hybrid() bool { return e.cfg.SlidingWindow > 0 }

// swNeed is the number of consecutive sliding-window blocks a hit needs.
func (e *Engine) swNeed() int { return ceilDiv(e.cfg.SlidingWindow-1, e.cfg.BlockSize) }

// swSkipped is the number of leading sliding-window blocks outside the
// window once computed tokens are computed.
func (e *Engine) swSkipped(computed int) int {
	return max(0, computed-e.cfg.SlidingWindow+1) / e.cfg.BlockSize
}

// swCached reports whether the sliding-window group caches hash h, and
// the block.
func (e *Engine) swCached(h uint64) (int32, bool) {
	w, _ := e.pool.loc.get(groupKey(h, GroupSlidingWindow))
	return w.gpu, w.gpu >= 0
}

// swHit cuts a full-attention hit of full blocks to what the
// sliding-window group can serve.
func (e *Engine) swHit(r *request, full int) int {
	need := e.swNeed()
	if need == 0 {
		return full
	}
	run := 0
	for i := full - 1; i >= 0; i-- {
		if _, ok := e.swCached(r.hashes[i]); !ok {
			run = 0
			continue
		}
		run++
		if run >= need {
			return i + run
		}
	}
	return run
}

// releaseBlocks drops r's references in every group, last block first, the
// full-attention group's blocks before the sliding-window group's.
func (e *Engine) releaseBlocks(r *request) {
	e.pool.release(r.blocks)
	r.blocks = nil
	for i := len(r.sw) - 1; i >= 0; i-- {
		if r.sw[i] >= 0 {
			e.pool.release(r.sw[i : i+1])
		}
	}
	r.sw, r.swCommitted = nil, 0
}

// swDropSkipped releases r's sliding-window blocks that have left the
// window.
func (e *Engine) swDropSkipped(r *request) {
	n := min(e.swSkipped(r.numComputed), len(r.sw))
	for i := n - 1; i >= 0; i-- {
		if r.sw[i] < 0 {
			break
		}
		e.pool.release(r.sw[i : i+1])
		r.sw[i] = -1
	}
}

// growHybrid is grow for a hybrid engine: blocks for the first upto tokens
// in both groups, the sliding-window group's skipped blocks released first.
func (e *Engine) growHybrid(r *request, upto int) bool {
	e.swDropSkipped(r)
	end := ceilDiv(upto, e.cfg.BlockSize)
	need := max(0, end-len(r.blocks)) + max(0, end-len(r.sw))
	if need == 0 {
		return true
	}
	if e.pool.nfree < need {
		return false
	}
	for len(r.blocks) < end {
		r.blocks = append(r.blocks, e.pool.alloc())
	}
	for len(r.sw) < end {
		r.sw = append(r.sw, e.pool.alloc())
	}
	return true
}

// admitHybrid is admit for a hybrid engine (no CPU tier).
func (e *Engine) admitHybrid(r *request, budget int, now time.Duration) (n, reloaded int, ok bool) {
	bs := e.cfg.BlockSize
	maxHit := (len(r.tokens) - 1) / bs
	e.ensureHashes(r, maxHit)
	full := 0
	for full < maxHit && e.pool.hasGPU(r.hashes[full]) {
		full++
	}
	hits := e.swHit(r, full)
	swFrom := max(0, hits-e.swNeed())
	computed := hits * bs
	n = min(len(r.tokens)-computed, budget)
	end := ceilDiv(computed+n, bs)
	freeHits := 0
	for i := range hits {
		if e.pool.blocks[e.pool.gpuOf(r.hashes[i])].inFree {
			freeHits++
		}
	}
	for i := swFrom; i < hits; i++ {
		id, _ := e.swCached(r.hashes[i])
		if e.pool.blocks[id].inFree {
			freeHits++
		}
	}
	if e.pool.nfree-freeHits < 2*(end-hits) {
		return 0, 0, false
	}
	r.blocks, r.sw = r.blocks[:0], r.sw[:0]
	for i := range hits {
		id := e.pool.gpuOf(r.hashes[i])
		e.pool.touch(id)
		r.blocks = append(r.blocks, id)
	}
	for i := range hits {
		if i < swFrom {
			r.sw = append(r.sw, -1)
			continue
		}
		id, _ := e.swCached(r.hashes[i])
		e.pool.touch(id)
		r.sw = append(r.sw, id)
	}
	r.numComputed, r.committed, r.swCommitted = computed, hits, hits
	e.growHybrid(r, computed+n) // cannot fail: checked above
	e.commit(r, computed+n)
	r.state = running
	e.st.PrefixQueries += int64(len(r.tokens))
	e.st.PrefixHits += int64(computed)
	if r.cached < 0 {
		r.cached, r.reloaded = computed, 0
		r.scheduled = now
		e.st.PromptTokens += int64(len(r.req.Prompt))
	}
	return n, 0, true
}

// commitSW caches r's first full sliding-window blocks (commit's full)
// and emits one BlockStored (group 1) per run of blocks neither null nor
// cached.
func (e *Engine) commitSW(r *request, full int) {
	full = min(full, len(r.sw))
	free := func(i int) bool {
		if r.sw[i] < 0 {
			return false
		}
		_, cached := e.swCached(r.hashes[i])
		return !cached
	}
	for i := r.swCommitted; i < full; {
		if !free(i) {
			i++
			continue
		}
		j := i + 1
		for j < full && free(j) {
			j++
		}
		e.storeRun(r, i, j, GroupSlidingWindow, func(k int, m *blockMeta) {
			e.pool.cacheGroup(r.sw[k], r.hashes[k], GroupSlidingWindow, m)
		})
		i = j
	}
	r.swCommitted = max(r.swCommitted, full)
}

// HitBlocks returns how many leading full blocks of r's prompt a prefix
// lookup would serve from the GPU now, the last-token cap aside: the
// full-attention hit, cut by the sliding-window group on a hybrid engine.
// It is the engine's truth to compare a router's prediction with.
func (e *Engine) HitBlocks(r Request) int {
	q := &request{req: r, tokens: r.Prompt}
	n := len(r.Prompt) / e.cfg.BlockSize
	e.ensureHashes(q, n)
	full := 0
	for full < n && e.pool.hasGPU(q.hashes[full]) {
		full++
	}
	if e.hybrid() {
		return e.swHit(q, full)
	}
	return full
}

// gpuOf is the GPU block caching hash h in the full-attention group (the
// caller knows there is one).
func (p *pool) gpuOf(h uint64) int32 {
	w, _ := p.loc.get(h)
	return w.gpu
}
