package tokenize

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestMergeTableMatchesMap: the open-addressing table answers like a Go map
// for present and absent keys (key 0 and colliding keys included), and a
// repeated key keeps its last value.
func TestMergeTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[uint64]merge{}
	var keys []uint64
	for i := range 5000 {
		k := pairKey(rng.Uint32N(3000), rng.Uint32N(3000))
		if i == 0 {
			k = 0
		}
		keys = append(keys, k)
	}
	tab := newMergeTable(len(keys))
	for i, k := range keys {
		m := merge{rank: uint32(i), id: uint32(i * 7)}
		want[k] = m
		tab.set(k, m)
	}
	for range 20000 {
		k := pairKey(rng.Uint32N(3100), rng.Uint32N(3100))
		keys = append(keys, k)
	}
	for _, k := range keys {
		got, ok := tab.get(k)
		w, wok := want[k]
		if ok != wok || got != w {
			t.Fatalf("key %#x: table %v %v, map %v %v", k, got, ok, w, wok)
		}
	}
	if filled := len(want); 2*filled > len(tab.slots) {
		t.Fatalf("%d keys in %d slots: over half full", filled, len(tab.slots))
	}
}

// naiveMerge is BPE by the definition: while some adjacent pair has a
// merge, merge the leftmost pair of lowest rank.
func naiveMerge(m *bpe, ids []uint32) []uint32 {
	ids = slices.Clone(ids)
	for {
		best, at := ^uint32(0), -1
		var res uint32
		for i := 0; i+1 < len(ids); i++ {
			if mg, ok := m.merges.get(pairKey(ids[i], ids[i+1])); ok && mg.rank < best {
				best, at, res = mg.rank, i, mg.id
			}
		}
		if at < 0 {
			return ids
		}
		ids[at] = res
		ids = slices.Delete(ids, at+1, at+2)
	}
}

// TestMergeWordEqualsDefinition: the tree merge and the short-word merge
// give the ids of naive BPE on random words made of vocabulary tokens,
// repetitive ones included, long ones (up to a few hundred tokens)
// included, for every byte-level family.
func TestMergeWordEqualsDefinition(t *testing.T) {
	for _, name := range fixtureNames {
		enc := loadEncoder(t, name)
		m := enc.model
		if m.char != nil {
			continue // character-level symbols: covered by the fixtures
		}
		var toks []string
		for _, b := range m.tokenBytes {
			if len(b) > 0 && len(b) < 6 {
				toks = append(toks, string(b))
			}
		}
		rng := rand.New(rand.NewPCG(3, uint64(len(toks))))
		for i := range 3000 {
			var sb strings.Builder
			for n := 1 + rng.IntN(10); n > 0; n-- {
				sb.WriteString(toks[rng.IntN(len(toks))])
			}
			words := []string{sb.String(), strings.Repeat(toks[rng.IntN(len(toks))], 2+rng.IntN(30))}
			if i%50 == 0 { // long words: naive BPE is quadratic
				var long strings.Builder
				for n := 10 + rng.IntN(60); n > 0; n-- {
					long.WriteString(toks[rng.IntN(len(toks))])
				}
				words = append(words, long.String())
			}
			for _, w := range words {
				var syms []uint32
				for i := 0; i < len(w); i++ {
					syms = append(syms, m.byteID[w[i]])
				}
				want := naiveMerge(m, syms)
				for _, merge := range []struct {
					name string
					f    func([]uint32, string) ([]uint32, error)
				}{{"mergeWord", m.mergeWord}, {"mergeLong", m.mergeLong}, {"mergeShort", m.mergeShort}} {
					if merge.name == "mergeShort" && len(w) > maxShortWord {
						continue
					}
					got, err := merge.f(nil, w)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(got, want) {
						t.Fatalf("%s: word %q: %s %v, definition %v", name, w, merge.name, got, want)
					}
				}
			}
		}
	}
}

// TestWordCacheConcurrent: goroutines encoding overlapping words through
// one small word cache (many words per slot, so entries are overwritten
// while others read them) always get each word's own ids.
func TestWordCacheConcurrent(t *testing.T) {
	enc := loadEncoder(t, "qwen3")
	m := *enc.model // a copy with its own small cache
	m.cache = newWordCache(64)
	var words []string
	var want [][]uint32
	for i := range 400 {
		w := fmt.Sprintf(" w%dord%c", i*7919, 'a'+i%26)
		ids, err := m.mergeWord(nil, w)
		if err != nil {
			t.Fatal(err)
		}
		words, want = append(words, w), append(want, ids)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range 50 {
				for k := range words {
					i := (k*(g+1) + round) % len(words)
					got, err := m.encodeWord(nil, words[i])
					if err == nil && !slices.Equal(got, want[i]) {
						err = fmt.Errorf("word %q: ids %v, want %v", words[i], got, want[i])
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	hits := 0
	for i, w := range words {
		if ids, ok := m.cache.get(w); ok {
			hits++
			if !slices.Equal(ids, want[i]) {
				t.Fatalf("cached %q: %v, want %v", w, ids, want[i])
			}
		}
	}
	if hits == 0 {
		t.Fatal("nothing stayed in the cache")
	}
}

// TestBytePairsMatchMergeTable: the byte-pair array answers every pair of
// bytes as the merge table does, for every byte-level family.
func TestBytePairsMatchMergeTable(t *testing.T) {
	for _, name := range fixtureNames {
		m := loadEncoder(t, name).model
		if m.char != nil {
			if m.bytePairs != nil {
				t.Fatalf("%s: character-level model with byte pairs", name)
			}
			continue
		}
		merges := 0
		for a := range 256 {
			for b := range 256 {
				got := m.bytePairs[a<<8|b]
				want, ok := m.merges.get(pairKey(m.byteID[a], m.byteID[b]))
				if !ok {
					want = merge{rank: noRank}
				} else {
					merges++
				}
				if got != want {
					t.Fatalf("%s: bytes %#x %#x: array %v, table %v", name, a, b, got, want)
				}
			}
		}
		if merges < 100 {
			t.Fatalf("%s: only %d byte pairs merge", name, merges)
		}
	}
}

// TestMergeLongPiecesEqualDefinition: every distinct pre-token longer
// than maxShortWord in the fixture texts (CJK runs, symbol and white
// space runs, long words) merges to the ids of naive BPE, for every
// byte-level family.
func TestMergeLongPiecesEqualDefinition(t *testing.T) {
	for _, name := range fixtureNames {
		enc := loadEncoder(t, name)
		m := enc.model
		if m.char != nil {
			continue // character-level symbols: covered by the fixtures
		}
		seen := map[string]bool{}
		for _, f := range loadFixtures(t, name).Plain {
			text := f.Text
			if enc.nfc {
				text = nfc(text)
			}
			for i := 0; i < len(text); {
				end := nextPiece(enc.flavor, text, i)
				w := text[i:end]
				i = end
				// Naive BPE is quadratic: pieces up to 1 KB (the fixture
				// tests check longer ones against HuggingFace).
				if len(w) <= maxShortWord || len(w) > 1024 || seen[w] {
					continue
				}
				seen[w] = true
				syms := make([]uint32, len(w))
				for k := range len(w) {
					syms[k] = m.byteID[w[k]]
				}
				got, err := m.mergeLong(nil, w)
				if err != nil {
					t.Fatal(err)
				}
				if want := naiveMerge(m, syms); !slices.Equal(got, want) {
					t.Fatalf("%s: piece %q: %v, definition %v", name, w, got, want)
				}
			}
		}
		if len(seen) < 10 {
			t.Fatalf("%s: only %d long pieces", name, len(seen))
		}
	}
}

// TestWordCacheFilter: every word put is found with its ids until its
// shard is emptied (the filter never hides a word), words never put are
// not found, and a full shard's filter lets through few novel words (its
// false "maybe" rate stays near the 1.4% it is sized for).
func TestWordCacheFilter(t *testing.T) {
	c := newWordCache(1 << 12) // 256 words a shard
	ids := func(i int) []uint32 { return []uint32{uint32(i), uint32(i * 3)} }
	word := func(i int) string { return fmt.Sprintf("w%d", i) }
	const n = 3000 // enough for every shard to be emptied at least once
	for i := range n {
		c.put(word(i), ids(i))
		// The word just put and the one before it (unless its shard was
		// emptied since) are there.
		for _, k := range []int{i, i - 1} {
			if k < 0 {
				continue
			}
			got, ok := c.get(word(k))
			if k == i && !ok {
				t.Fatalf("word %d not found right after its put", k)
			}
			if ok && !slices.Equal(got, ids(k)) {
				t.Fatalf("word %d: %v, want %v", k, got, ids(k))
			}
		}
	}
	// Each shard holds what was put since it was last emptied: all found.
	held := 0
	for i := range n {
		w := word(i)
		s := &c.shards[wordHash(w)&15]
		if _, inMap := s.m[w]; !inMap {
			continue
		}
		held++
		if got, ok := c.get(w); !ok || !slices.Equal(got, ids(i)) {
			t.Fatalf("word %d in its shard's map but get says %v %v", i, got, ok)
		}
	}
	if held < 1000 {
		t.Fatalf("only %d words held", held)
	}
	// Fill every shard to just below full, then look up novel words.
	c = newWordCache(1 << 12)
	for i := 0; ; i++ {
		w := word(i)
		s := &c.shards[wordHash(w)&15]
		if len(s.m) < c.perShard-1 {
			c.put(w, ids(i))
		}
		full := true
		for k := range c.shards {
			full = full && len(c.shards[k].m) >= c.perShard-1
		}
		if full {
			break
		}
	}
	maybe := 0
	const novel = 20000
	for i := range novel {
		w := fmt.Sprintf("novel-%d", i)
		s := &c.shards[wordHash(w)&15]
		a, b := filterBits(wordHash(w), len(s.filter))
		if s.filter[a>>6].Load()&(1<<(a&63)) != 0 && s.filter[b>>6].Load()&(1<<(b&63)) != 0 {
			maybe++
		}
		if _, ok := c.get(w); ok {
			t.Fatalf("novel word %q found", w)
		}
	}
	if rate := float64(maybe) / novel; rate > 0.03 {
		t.Fatalf("full filters let %.1f%% of novel words through", 100*rate)
	} else {
		t.Logf("full filters let %.2f%% of novel words through", 100*rate)
	}
}

// TestVocabFilter: for every family whose model ignores merges for whole
// tokens, every vocabulary token is found with its id through the filter,
// words that are no token are not, and the filter lets few of them
// through to the map.
func TestVocabFilter(t *testing.T) {
	checked := 0
	for _, name := range fixtureNames {
		m := loadEncoder(t, name).model
		if !m.ignoreMerges {
			if m.vocabFilter != nil {
				t.Fatalf("%s: vocabulary filter without ignore_merges", name)
			}
			continue
		}
		checked++
		for w, id := range m.vocab {
			if got, ok := m.inVocab(wordHash(w), w); !ok || got != id {
				t.Fatalf("%s: token %q: %d %v, want %d", name, w, got, ok, id)
			}
		}
		rng := rand.New(rand.NewPCG(7, 8))
		maybe := 0
		const n = 20000
		for i := range n {
			w := fmt.Sprintf(" q%dz%c", rng.Uint64(), 'a'+i%26)
			if _, inMap := m.vocab[w]; inMap {
				continue
			}
			if _, ok := m.inVocab(wordHash(w), w); ok {
				t.Fatalf("%s: %q found", name, w)
			}
			a, b := filterBits(wordHash(w), len(m.vocabFilter))
			if m.vocabFilter[a>>6]&(1<<(a&63)) != 0 && m.vocabFilter[b>>6]&(1<<(b&63)) != 0 {
				maybe++
			}
		}
		if rate := float64(maybe) / n; rate > 0.03 {
			t.Fatalf("%s: the filter lets %.1f%% of non-tokens through", name, 100*rate)
		}
		long := strings.Repeat("a", m.maxVocabLen+1)
		if _, ok := m.inVocab(wordHash(long), long); ok {
			t.Fatalf("%s: a word longer than every token found", name)
		}
	}
	if checked == 0 {
		t.Fatal("no family ignores merges")
	}
}
