package tokenize

import (
	"context"
	"runtime"
	"slices"
	"sync"
)

// Encoding a long text on several cores. A text is cut into pieces that
// encode independently: the text between added tokens (normalization and
// pre-tokenization never cross an added token) and, within it, the
// chunks of Encoder.chunkEnd (whose cuts the split pattern always makes
// itself). Those are exactly the pieces the one-goroutine encoding runs
// through the chunk cache one after the other, so handing runs of them to
// different goroutines and joining their ids in order gives the same ids,
// with the same cache lookups and stores. The work is the same: CPU time
// per request does not change, a large prompt's latency shrinks with the
// cores free to take it.

// Parallel encoding thresholds: texts of at least parallelMinText bytes
// are split among up to GOMAXPROCS goroutines, each given at least
// parallelBytesPerWorker bytes (a goroutine and the join cost a few
// microseconds; a 32 KB run of text takes milliseconds cold).
const (
	parallelMinText        = 64 << 10
	parallelBytesPerWorker = 32 << 10
)

// workers is how many goroutines encode a text of n bytes.
func (e *Encoder) workers(n int) int {
	if n < parallelMinText {
		return 1
	}
	w := e.maxWorkers
	if w <= 0 {
		w = runtime.GOMAXPROCS(0)
	}
	return max(1, min(w, n/parallelBytesPerWorker))
}

// textPiece is one independently encoded piece of a text, or an added
// token (added >= 0) ending at offset end.
type textPiece struct {
	text  string
	added int
	end   int
}

// encodeParallel is encodeTextCuts on up to w goroutines, which it starts
// and joins before returning.
func (e *Encoder) encodeParallel(ctx context.Context, dst []uint32, text string, cache *chunkCache, cuts *[]textCut, base, w int) ([]uint32, error) {
	var pieces []textPiece
	e.splitAdded(text, func(seg string, k, end int) bool {
		if len(seg) < minCachedChunk {
			if seg != "" {
				pieces = append(pieces, textPiece{text: seg, added: -1})
			}
		} else {
			for s := seg; len(s) > 0; {
				n := e.chunkEnd(s)
				pieces = append(pieces, textPiece{text: s[:n], added: -1})
				s = s[n:]
			}
		}
		if k >= 0 {
			pieces = append(pieces, textPiece{added: k, end: end})
		}
		return true
	})
	// Contiguous runs of pieces of about equal bytes, one per goroutine.
	type run struct {
		from, to int      // pieces[from:to]
		ids      []uint32 // the run's text pieces' ids, in order
		ends     []int    // ends[i-from]: len(ids) after pieces[i]
		err      error
	}
	runs := make([]run, 0, w)
	per := len(text)/w + 1
	from, acc := 0, 0
	for i, p := range pieces {
		acc += len(p.text)
		if acc >= per && len(runs) < w-1 {
			runs = append(runs, run{from: from, to: i + 1})
			from, acc = i+1, 0
		}
	}
	runs = append(runs, run{from: from, to: len(pieces)})
	encodeRun := func(r *run) {
		n := 0
		for _, p := range pieces[r.from:r.to] {
			n += len(p.text)
		}
		r.ids = getRunIDs(n/3 + 16)
		r.ends = make([]int, 0, r.to-r.from)
		for _, p := range pieces[r.from:r.to] {
			if p.added < 0 {
				if r.err = ctx.Err(); r.err != nil {
					return
				}
				if r.ids, r.err = e.encodeChunk(r.ids, p.text, cache); r.err != nil {
					return
				}
			}
			r.ends = append(r.ends, len(r.ids))
		}
	}
	var wg sync.WaitGroup
	for i := 1; i < len(runs); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			encodeRun(&runs[i])
		}()
	}
	encodeRun(&runs[0]) // this goroutine takes the first run
	wg.Wait()
	defer func() {
		for i := range runs {
			putRunIDs(runs[i].ids)
		}
	}()
	for i := range runs {
		if err := runs[i].err; err != nil {
			return dst, err // the first failing piece in text order
		}
	}
	total := 0
	for i := range runs {
		total += len(runs[i].ids) + len(runs[i].ends)
	}
	dst = slices.Grow(dst, total) // ids, and at most one added token per piece
	for _, r := range runs {
		prev := 0
		for i, p := range pieces[r.from:r.to] {
			dst = append(dst, r.ids[prev:r.ends[i]]...)
			prev = r.ends[i]
			if p.added >= 0 {
				dst = append(dst, e.added[p.added].id)
				if cuts != nil && e.safeCut[p.added] {
					*cuts = append(*cuts, textCut{off: base + p.end, ids: len(dst)})
				}
			}
		}
	}
	return dst, nil
}

// A run's ids are scratch: joined into the caller's slice, then dropped.
// They are pooled, so that a long prompt's encoding allocates (and the
// runtime zeroes) its ids once, in the joined slice, not twice.
var runIDs sync.Pool // *[]uint32

// maxPooledRunIDs bounds the capacity a pooled run slice keeps (4 MiB):
// a rare huge prompt's scratch goes back to the collector.
const maxPooledRunIDs = 1 << 20

// getRunIDs returns an empty slice with room for at least n ids.
func getRunIDs(n int) []uint32 {
	if p, ok := runIDs.Get().(*[]uint32); ok {
		if cap(*p) >= n {
			return (*p)[:0]
		}
		runIDs.Put(p)
	}
	return make([]uint32, 0, n)
}

// putRunIDs returns a run's slice to the pool.
func putRunIDs(ids []uint32) {
	if cap(ids) == 0 || cap(ids) > maxPooledRunIDs {
		return
	}
	ids = ids[:0]
	runIDs.Put(&ids)
}
