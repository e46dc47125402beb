package tokenize

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Character-level BPE with byte fallback: the SentencePiece-style model of
// Gemma 3's tokenizer.json. A word starts as its characters, each its
// vocabulary token; a character without one becomes its UTF-8 bytes'
// <0xXX> tokens (byte_fallback), or the unknown token (consecutive unknowns
// fused into one when fuse_unk is set). Then the same ranked merges run as
// in the byte-level model.

// charModel is the character-level part of a bpe.
type charModel struct {
	fallback    [256]uint32
	hasFallback [256]bool
	byteFB      bool
	unk         uint32
	hasUnk      bool
	fuseUnk     bool
}

func buildCharBPE(vocab map[string]uint32, mergesRaw json.RawMessage, byteFallback bool, unk *string, fuseUnk bool) (*bpe, error) {
	m := &bpe{vocab: make(map[string]uint32, len(vocab)), cache: newWordCache(wordCacheEntries), char: &charModel{byteFB: byteFallback, fuseUnk: fuseUnk}}
	var maxID uint32
	for _, id := range vocab {
		maxID = max(maxID, id)
	}
	m.tokenBytes = make([][]byte, maxID+1)
	for tok, id := range vocab {
		m.vocab[tok] = id
		var b byte
		if n, err := fmt.Sscanf(tok, "<0x%02X>", &b); err == nil && n == 1 && len(tok) == 6 {
			m.char.fallback[b], m.char.hasFallback[b] = id, true
			m.tokenBytes[id] = []byte{b}
			continue
		}
		m.tokenBytes[id] = []byte(strings.ReplaceAll(tok, "\u2581", " "))
	}
	if unk != nil && *unk != "" {
		id, ok := vocab[*unk]
		if !ok {
			return nil, fmt.Errorf("unk_token %q not in vocabulary", *unk)
		}
		m.char.unk, m.char.hasUnk = id, true
	}
	pairs, err := parseMerges(mergesRaw)
	if err != nil {
		return nil, err
	}
	m.merges = newMergeTable(len(pairs))
	for rank, p := range pairs {
		a, okA := vocab[p[0]]
		b, okB := vocab[p[1]]
		r, okR := vocab[p[0]+p[1]]
		if !okA || !okB || !okR {
			return nil, fmt.Errorf("merge %q %q: token not in vocabulary", p[0], p[1])
		}
		m.merges.set(pairKey(a, b), merge{rank: uint32(rank), id: r})
	}
	return m, nil
}

// charSymbols appends word's initial symbols.
func (m *bpe) charSymbols(syms []symbol, word string) ([]symbol, error) {
	c := m.char
	lastUnk := false
	push := func(id uint32, size int) {
		n := int32(len(syms))
		syms = append(syms, symbol{id: id, prev: n - 1, next: n + 1, size: int32(size)})
	}
	for i := 0; i < len(word); {
		_, w := utf8.DecodeRuneInString(word[i:])
		ch := word[i : i+w]
		i += w
		if id, ok := m.vocab[ch]; ok {
			push(id, w)
			lastUnk = false
			continue
		}
		if c.byteFB {
			all := true
			for k := 0; k < len(ch); k++ {
				all = all && c.hasFallback[ch[k]]
			}
			if all {
				for k := 0; k < len(ch); k++ {
					push(c.fallback[ch[k]], 1)
				}
				lastUnk = false
				continue
			}
		}
		if !c.hasUnk {
			return syms, fmt.Errorf("%w: no token for %q and no unk_token", ErrUnsupported, ch)
		}
		if lastUnk && c.fuseUnk {
			syms[len(syms)-1].size += int32(w)
			continue
		}
		push(c.unk, w)
		lastUnk = true
	}
	return syms, nil
}

// parseMerges reads merges as "a b" strings or [a, b] pairs.
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	var asStrings []string
	if err := json.Unmarshal(raw, &asStrings); err == nil {
		pairs := make([][2]string, 0, len(asStrings))
		for _, s := range asStrings {
			a, b, ok := strings.Cut(s, " ")
			if !ok {
				return nil, fmt.Errorf("merge %q: want two tokens", s)
			}
			pairs = append(pairs, [2]string{a, b})
		}
		return pairs, nil
	}
	var pairs [][2]string
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, fmt.Errorf("parse merges: %w", err)
	}
	return pairs, nil
}
