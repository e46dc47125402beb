package tokenize

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/zeebo/xxh3"
)

// Errors the local tokenizer returns; classify with errors.Is.
var (
	// ErrInvalidUTF8: the input text is not valid UTF-8 (the engine would
	// never see it as such either).
	ErrInvalidUTF8 = errors.New("tokenize: input is not valid UTF-8")
	// ErrInputTooLarge: the input exceeds the configured byte limit.
	ErrInputTooLarge = errors.New("tokenize: input too large")
	// ErrUnsupported: the tokenizer file uses a component this package does
	// not implement (it never guesses: a guess gives silently wrong ids).
	ErrUnsupported = errors.New("tokenize: unsupported tokenizer component")
	// ErrUnknownToken: an id outside the vocabulary was given to Decode.
	ErrUnknownToken = errors.New("tokenize: unknown token id")
)

func errByteMissing(b byte) error {
	return fmt.Errorf("%w: vocabulary has no token for byte 0x%02x", ErrUnsupported, b)
}

// addedToken is one entry of tokenizer.json's added_tokens, matched on the
// raw text before normalization and pre-tokenization.
type addedToken struct {
	content string
	id      uint32
	special bool
	lstrip  bool
	rstrip  bool
}

// Encoder is a HuggingFace tokenizer.json byte-level BPE tokenizer (the
// Llama-3, Qwen2/Qwen3 and GPT-2 families). It is immutable after loading
// and safe for concurrent use.
type Encoder struct {
	model  *bpe
	flavor splitFlavor
	nfc    bool
	// metaspace: the normalizer replaces " " with U+2581 (SentencePiece
	// style, Gemma 3), and the model is character-level.
	metaspace bool

	added []addedToken
	// addedTrie finds the longest added token at a position.
	addedTrie *addedTrie
	// addedOnly is set when every added token starts with the byte
	// addedByte (usually '<'): the scan for added tokens jumps between
	// occurrences of that byte.
	addedOnly bool
	addedByte byte
	addedByID map[uint32]string
	addedIDs  map[string]uint32
	// safeCut[k]: the end of added[k] is a safe cut for conversation
	// reuse (conv.go): added[k] has no rstrip and no other added token
	// contains its content.
	safeCut []bool

	// maxWorkers bounds the goroutines one long text is encoded on
	// (parallel.go); 0 means GOMAXPROCS.
	maxWorkers int

	// post is the TemplateProcessing "single" template: ids to emit, with
	// seqMarker standing for the encoded text. Empty when no special tokens
	// are added.
	post []uint32
}

const seqMarker = ^uint32(0)

// LoadEncoder reads a tokenizer.json file.
func LoadEncoder(path string) (*Encoder, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenize: read tokenizer file: %w", err)
	}
	e, err := ParseEncoder(data)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %s: %w", path, err)
	}
	return e, nil
}

type typed struct {
	Type string `json:"type"`
}

type hfFile struct {
	AddedTokens []struct {
		ID         uint32 `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Model         struct {
		Type                    string            `json:"type"`
		Vocab                   map[string]uint32 `json:"vocab"`
		Merges                  json.RawMessage   `json:"merges"`
		IgnoreMerges            bool              `json:"ignore_merges"`
		ByteFallback            bool              `json:"byte_fallback"`
		UnkToken                *string           `json:"unk_token"`
		FuseUnk                 bool              `json:"fuse_unk"`
		ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
		Dropout                 *float64          `json:"dropout"`
	} `json:"model"`
}

// ParseEncoder builds an Encoder from tokenizer.json contents.
func ParseEncoder(data []byte) (*Encoder, error) {
	var f hfFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: %w", err)
	}
	e := &Encoder{addedByID: map[uint32]string{}, addedIDs: map[string]uint32{}}
	var err error
	var norms normalizers
	if norms, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	e.nfc, e.metaspace = norms.nfc, norms.metaspace
	if e.nfc {
		nfcStableTable() // built now (≈ 30 ms once), not on a first request
	}
	if e.flavor, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	m := f.Model
	charLevel := e.flavor == flavorWhole
	switch {
	case m.Type != "BPE":
		return nil, fmt.Errorf("%w: model type %q (only BPE)", ErrUnsupported, m.Type)
	case charLevel != e.metaspace:
		// A split on " " is a no-op only after " " became U+2581.
		return nil, fmt.Errorf("%w: space split without the metaspace normalizer (or the reverse)", ErrUnsupported)
	case m.ByteFallback && !charLevel:
		return nil, fmt.Errorf("%w: byte_fallback in a byte-level BPE", ErrUnsupported)
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "",
		m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, fmt.Errorf("%w: subword prefix/suffix", ErrUnsupported)
	case m.Dropout != nil && *m.Dropout != 0:
		return nil, fmt.Errorf("%w: BPE dropout", ErrUnsupported)
	case len(m.Vocab) == 0:
		return nil, errors.New("tokenizer.json has an empty vocabulary")
	}
	if charLevel {
		if m.IgnoreMerges {
			return nil, fmt.Errorf("%w: ignore_merges in a character-level BPE", ErrUnsupported)
		}
		if e.model, err = buildCharBPE(m.Vocab, m.Merges, m.ByteFallback, m.UnkToken, m.FuseUnk); err != nil {
			return nil, err
		}
	} else if e.model, err = buildBPE(m.Vocab, m.Merges, m.IgnoreMerges); err != nil {
		return nil, err
	}
	for _, a := range f.AddedTokens {
		if a.SingleWord {
			return nil, fmt.Errorf("%w: single_word added token %q", ErrUnsupported, a.Content)
		}
		if a.Content == "" {
			continue
		}
		e.added = append(e.added, addedToken{content: a.Content, id: a.ID, special: a.Special, lstrip: a.LStrip, rstrip: a.RStrip})
		e.addedByID[a.ID] = a.Content
		e.addedIDs[a.Content] = a.ID
	}
	e.addedTrie = newAddedTrie(e.added)
	if firsts := e.addedTrie.nodes[0].labels; len(firsts) == 1 {
		e.addedOnly, e.addedByte = true, firsts[0]
	}
	e.safeCut = safeCuts(e.added)
	if e.post, err = parsePostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	return e, nil
}

// safeCuts reports, for each added token, whether text can be cut right
// after it for conversation reuse: it has no rstrip (which would take in
// white space after it) and no other added token contains its content (a
// longer match could then start before the cut and end after it).
func safeCuts(added []addedToken) []bool {
	index := make(map[string]int, len(added))
	for i, a := range added {
		index[a.content] = i
	}
	contained := make([]bool, len(added))
	for i, b := range added {
		for p := 0; p < len(b.content); p++ {
			for q := p + 1; q <= len(b.content); q++ {
				if j, ok := index[b.content[p:q]]; ok && j != i && b.content[p:q] != b.content {
					contained[j] = true
				}
			}
		}
	}
	out := make([]bool, len(added))
	for i, a := range added {
		out[i] = !a.rstrip && !contained[i]
	}
	return out
}

// normalizers are the normalizer components the encoder implements.
type normalizers struct {
	nfc       bool
	metaspace bool // Replace " " -> U+2581
}

func parseNormalizer(raw json.RawMessage) (normalizers, error) {
	var out normalizers
	if len(raw) == 0 || string(raw) == "null" {
		return out, nil
	}
	var t struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
		Pattern     map[string]string `json:"pattern"`
		Content     string            `json:"content"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return out, fmt.Errorf("parse normalizer: %w", err)
	}
	switch t.Type {
	case "NFC":
		out.nfc = true
		return out, nil
	case "Replace":
		if len(t.Pattern) == 1 && t.Pattern["String"] == " " && t.Content == "\u2581" {
			out.metaspace = true
			return out, nil
		}
		return out, fmt.Errorf("%w: Replace normalizer %v -> %q", ErrUnsupported, t.Pattern, t.Content)
	case "Sequence":
		for _, n := range t.Normalizers {
			sub, err := parseNormalizer(n)
			if err != nil {
				return out, err
			}
			if sub.nfc && out.metaspace {
				return out, fmt.Errorf("%w: NFC after a Replace normalizer", ErrUnsupported)
			}
			out.nfc = out.nfc || sub.nfc
			out.metaspace = out.metaspace || sub.metaspace
		}
		return out, nil
	}
	return out, fmt.Errorf("%w: normalizer %q", ErrUnsupported, t.Type)
}

type preTok struct {
	Type           string            `json:"type"`
	Pretokenizers  []json.RawMessage `json:"pretokenizers"`
	Pattern        map[string]string `json:"pattern"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	AddPrefixSpace bool              `json:"add_prefix_space"`
	UseRegex       bool              `json:"use_regex"`
}

func parsePreTokenizer(raw json.RawMessage) (splitFlavor, error) {
	var p preTok
	if len(raw) == 0 || string(raw) == "null" {
		return 0, fmt.Errorf("%w: no pre-tokenizer (byte-level BPE needs one)", ErrUnsupported)
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return 0, fmt.Errorf("parse pre_tokenizer: %w", err)
	}
	switch p.Type {
	case "Split":
		// Gemma 3: split on " " after the normalizer turned every " "
		// into U+2581, which leaves the text whole.
		if p.Pattern["String"] == " " && len(p.Pattern) == 1 && p.Behavior == "MergedWithPrevious" && !p.Invert {
			return flavorWhole, nil
		}
		return 0, fmt.Errorf("%w: split %v/%s", ErrUnsupported, p.Pattern, p.Behavior)
	case "ByteLevel":
		if p.AddPrefixSpace {
			return 0, fmt.Errorf("%w: ByteLevel add_prefix_space", ErrUnsupported)
		}
		if !p.UseRegex {
			return 0, fmt.Errorf("%w: ByteLevel pre-tokenizer without a split", ErrUnsupported)
		}
		return flavorGPT2, nil
	case "Sequence":
		n := len(p.Pretokenizers)
		if n < 2 {
			return 0, fmt.Errorf("%w: pre-tokenizer sequence of %d", ErrUnsupported, n)
		}
		var splits []string
		for _, raw := range p.Pretokenizers[:n-1] {
			var split preTok
			if err := json.Unmarshal(raw, &split); err != nil {
				return 0, fmt.Errorf("parse pre_tokenizer: %w", err)
			}
			if split.Type != "Split" || split.Behavior != "Isolated" || split.Invert {
				return 0, fmt.Errorf("%w: pre-tokenizer %s/%s", ErrUnsupported, split.Type, split.Behavior)
			}
			splits = append(splits, split.Pattern["Regex"])
		}
		var bl preTok
		if err := json.Unmarshal(p.Pretokenizers[n-1], &bl); err != nil {
			return 0, fmt.Errorf("parse pre_tokenizer: %w", err)
		}
		if bl.Type != "ByteLevel" || bl.UseRegex || bl.AddPrefixSpace {
			return 0, fmt.Errorf("%w: last pre-tokenizer %s", ErrUnsupported, bl.Type)
		}
		if len(splits) == 3 && splits[0] == patternDeepSeekNum && splits[1] == patternDeepSeekCJK && splits[2] == patternDeepSeek3 {
			return flavorDeepSeek, nil
		}
		if len(splits) != 1 {
			return 0, fmt.Errorf("%w: pre-tokenizer sequence of %d splits %q", ErrUnsupported, len(splits), splits)
		}
		fl, ok := flavorOf(splits[0])
		if !ok {
			return 0, fmt.Errorf("%w: split pattern %q", ErrUnsupported, splits[0])
		}
		return fl, nil
	}
	return 0, fmt.Errorf("%w: pre-tokenizer %q", ErrUnsupported, p.Type)
}

func parsePostProcessor(raw json.RawMessage) ([]uint32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var p struct {
		Type       string            `json:"type"`
		Processors []json.RawMessage `json:"processors"`
		Single     []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct {
				ID string `json:"id"`
			} `json:"Sequence"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []uint32 `json:"ids"`
		} `json:"special_tokens"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("parse post_processor: %w", err)
	}
	switch p.Type {
	case "ByteLevel":
		return nil, nil
	case "Sequence":
		var out []uint32
		for _, sub := range p.Processors {
			ids, err := parsePostProcessor(sub)
			if err != nil {
				return nil, err
			}
			if ids != nil {
				if out != nil {
					return nil, fmt.Errorf("%w: two template post-processors", ErrUnsupported)
				}
				out = ids
			}
		}
		return out, nil
	case "TemplateProcessing":
		out := []uint32{}
		for _, it := range p.Single {
			switch {
			case it.SpecialToken != nil:
				st, ok := p.SpecialTokens[it.SpecialToken.ID]
				if !ok {
					return nil, fmt.Errorf("post_processor: special token %q undefined", it.SpecialToken.ID)
				}
				out = append(out, st.IDs...)
			case it.Sequence != nil:
				out = append(out, seqMarker)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w: post-processor %q", ErrUnsupported, p.Type)
}

func buildBPE(vocab map[string]uint32, mergesRaw json.RawMessage, ignoreMerges bool) (*bpe, error) {
	inv := byteLevelInverse()
	m := &bpe{
		vocab:        make(map[string]uint32, len(vocab)),
		ignoreMerges: ignoreMerges,
		cache:        newWordCache(wordCacheEntries),
	}
	var maxID uint32
	for _, id := range vocab {
		maxID = max(maxID, id)
	}
	m.tokenBytes = make([][]byte, maxID+1)
	decode := func(s string) (string, bool) {
		var b strings.Builder
		for _, r := range s {
			c, ok := inv[r]
			if !ok {
				return "", false
			}
			b.WriteByte(c)
		}
		return b.String(), true
	}
	for tok, id := range vocab {
		raw, ok := decode(tok)
		if !ok {
			// Not spelled in the byte-level alphabet: unreachable by
			// encoding, decodes as written.
			m.tokenBytes[id] = []byte(tok)
			continue
		}
		m.vocab[raw] = id
		m.tokenBytes[id] = []byte(raw)
		if len(raw) == 1 {
			m.byteID[raw[0]] = id
			m.hasByte[raw[0]] = true
		}
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
		// Like HuggingFace, a repeated pair keeps its last rank.
		m.merges.set(pairKey(a, b), merge{rank: uint32(rank), id: r})
	}
	m.fillBytePairs()
	if ignoreMerges {
		m.buildVocabFilter()
	}
	return m, nil
}

// Encode returns text's token ids. addSpecial applies the post-processor's
// template (e.g. Llama-3's <|begin_of_text|>), as add_special_tokens does.
func (e *Encoder) Encode(text string, addSpecial bool) ([]uint32, error) {
	return e.AppendEncode(make([]uint32, 0, len(text)/3+4), text, addSpecial)
}

// AppendEncode is Encode appending to dst.
func (e *Encoder) AppendEncode(dst []uint32, text string, addSpecial bool) ([]uint32, error) {
	return e.appendEncode(context.Background(), dst, text, addSpecial, nil)
}

// appendEncode encodes text, reusing and filling cache when it is not nil.
// It stops with ctx's error, checked before each segment between added
// tokens and each chunk of a long segment.
//
// Text that is not valid UTF-8 is refused with ErrInvalidUTF8. The check is
// made piece by piece (each segment between added tokens, each chunk of a
// long segment), skipping chunks found in the cache: those bytes were
// checked when their ids were stored. Every cut is at an ASCII byte or at
// the start of an added token (which no continuation byte can be), so the
// text is valid exactly when all its pieces are.
func (e *Encoder) appendEncode(ctx context.Context, dst []uint32, text string, addSpecial bool, cache *chunkCache) ([]uint32, error) {
	if !addSpecial || len(e.post) == 0 {
		return e.encodeText(ctx, dst, text, cache)
	}
	var err error
	for _, id := range e.post {
		if id != seqMarker {
			dst = append(dst, id)
			continue
		}
		if dst, err = e.encodeText(ctx, dst, text, cache); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

// encodeText splits on added tokens and encodes the rest. Text between two
// added tokens is encoded on its own (normalization and pre-tokenization
// never cross an added token), which is what makes chunk reuse exact.
func (e *Encoder) encodeText(ctx context.Context, dst []uint32, text string, cache *chunkCache) ([]uint32, error) {
	return e.encodeTextCuts(ctx, dst, text, cache, nil, 0)
}

// encodeTextCuts is encodeText, also appending to *cuts (when cuts is not
// nil) each safe cut of text (see conv.go), its offset shifted by base.
// Long texts are encoded on several goroutines (parallel.go).
func (e *Encoder) encodeTextCuts(ctx context.Context, dst []uint32, text string, cache *chunkCache, cuts *[]textCut, base int) ([]uint32, error) {
	if w := e.workers(len(text)); w > 1 {
		return e.encodeParallel(ctx, dst, text, cache, cuts, base, w)
	}
	var err error
	e.splitAdded(text, func(seg string, k, end int) bool {
		if dst, err = e.encodeSegment(ctx, dst, seg, cache); err != nil {
			return false
		}
		if k >= 0 {
			dst = append(dst, e.added[k].id)
			if cuts != nil && e.safeCut[k] {
				*cuts = append(*cuts, textCut{off: base + end, ids: len(dst)})
			}
		}
		return true
	})
	return dst, err
}

// splitAdded cuts text at its added tokens: for each, in order, it calls
// f with the text before the token (white space an lstrip/rstrip token
// takes in removed), the token's index in e.added and the offset where
// the token (and what it takes in) ends; then once more with the text
// after the last token and k = -1. It stops when f returns false.
func (e *Encoder) splitAdded(text string, f func(seg string, k, end int) bool) {
	if len(e.added) == 0 {
		f(text, -1, len(text))
		return
	}
	last := 0
	for i := 0; i < len(text); i++ {
		if e.addedOnly {
			j := strings.IndexByte(text[i:], e.addedByte)
			if j < 0 {
				break
			}
			i += j
		}
		k := e.addedTrie.longest(text, i)
		if k < 0 {
			continue
		}
		a := &e.added[k]
		start, end := i, i+len(a.content)
		if a.lstrip {
			start = trimLeftSpaceFrom(text, last, start)
		}
		if a.rstrip {
			end = skipSpace(text, end)
		}
		if !f(text[last:start], k, end) {
			return
		}
		last = end
		i = end - 1
	}
	f(text[last:], -1, len(text))
}

// encodeSegment encodes text free of added tokens, chunk by chunk through
// the cache when there is one, or when ctx can end (chunked equals whole,
// see below).
func (e *Encoder) encodeSegment(ctx context.Context, dst []uint32, s string, cache *chunkCache) ([]uint32, error) {
	if err := ctx.Err(); err != nil {
		return dst, err
	}
	if cache == nil && ctx.Done() == nil || len(s) < minCachedChunk {
		return e.encodeChecked(dst, s)
	}
	var err error
	for len(s) > 0 {
		if err := ctx.Err(); err != nil {
			return dst, err
		}
		n := e.chunkEnd(s)
		if dst, err = e.encodeChunk(dst, s[:n], cache); err != nil {
			return dst, err
		}
		s = s[n:]
	}
	return dst, nil
}

// encodeChunk encodes one chunk of a segment (see chunkEnd), through the
// cache when there is one and the chunk is long enough to be worth it.
func (e *Encoder) encodeChunk(dst []uint32, chunk string, cache *chunkCache) ([]uint32, error) {
	if len(chunk) < minCachedChunk || cache == nil {
		return e.encodeChecked(dst, chunk)
	}
	key := xxh3.HashString128(chunk)
	if ids, ok := cache.get(key, len(chunk)); ok {
		return append(dst, ids...), nil
	}
	start := len(dst)
	dst, err := e.encodeChecked(dst, chunk)
	if err != nil {
		return dst, err
	}
	cache.put(key, len(chunk), dst[start:])
	return dst, nil
}

// Chunking. A long segment is cut where the pre-tokenizer splits whatever
// follows: right after a "\n" when the next byte is an ASCII letter. For the
// Llama-3 and Qwen2 patterns the piece holding that newline is \s*[\r\n]+,
// which ends at the run's last newline both in the whole text and in the
// chunk alone; no alternative lets a piece start with "\n" and continue into
// a letter; and an ASCII letter is an NFC starter that never composes with
// what precedes it. So encoding the chunks separately gives the same ids as
// encoding the segment whole. GPT-2's pattern lacks the newline alternative
// (its \s+(?!\S) keeps a trailing newline run whole only at the end of the
// text), so GPT-2-style segments are not cut.
const (
	minCachedChunk = 256
	targetChunk    = 2048
)

func (e *Encoder) chunkEnd(s string) int {
	if e.flavor == flavorGPT2 || e.flavor == flavorWhole || len(s) <= targetChunk {
		return len(s)
	}
	for i := targetChunk; i+1 < len(s); i++ {
		if s[i] == '\n' && isASCIILetter(s[i+1]) {
			return i + 1
		}
		j := strings.IndexByte(s[i+1:], '\n')
		if j < 0 {
			break
		}
		i += j
	}
	return len(s)
}

func isASCIILetter(c byte) bool { return (c|0x20) >= 'a' && (c|0x20) <= 'z' }

func trimLeftSpaceFrom(s string, floor, i int) int {
	for i > floor {
		r, w := utf8.DecodeLastRuneInString(s[floor:i])
		if !unicode.IsSpace(r) {
			break
		}
		i -= w
	}
	return i
}

func skipSpace(s string, i int) int {
	for i < len(s) {
		r, w := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += w
	}
	return i
}

// encodeChecked is encodePlain for text not yet checked to be UTF-8.
func (e *Encoder) encodeChecked(dst []uint32, s string) ([]uint32, error) {
	if !utf8.ValidString(s) {
		return dst, ErrInvalidUTF8
	}
	return e.encodePlain(dst, s)
}

// encodePlain normalizes, pre-tokenizes and BPE-encodes a span without added
// tokens.
func (e *Encoder) encodePlain(dst []uint32, s string) ([]uint32, error) {
	if s == "" {
		return dst, nil
	}
	if e.nfc {
		s = nfc(s)
	}
	if e.metaspace {
		s = strings.ReplaceAll(s, " ", "\u2581")
	}
	var err error
	for i := 0; i < len(s); {
		end := nextPiece(e.flavor, s, i)
		if dst, err = e.model.encodeWord(dst, s[i:end]); err != nil {
			return dst, err
		}
		i = end
	}
	return dst, nil
}

// Decode returns the text ids stand for, special tokens included. Byte
// sequences that are not valid UTF-8 are replaced with U+FFFD, as the
// reference decoder does.
func (e *Encoder) Decode(ids []uint32) (string, error) {
	var b bytes.Buffer
	for _, id := range ids {
		if s, ok := e.addedByID[id]; ok {
			if e.metaspace { // the decoder's Replace applies to added tokens too
				s = strings.ReplaceAll(s, "\u2581", " ")
			}
			b.WriteString(s)
			continue
		}
		if int(id) >= len(e.model.tokenBytes) || e.model.tokenBytes[id] == nil {
			return "", fmt.Errorf("%w: %d", ErrUnknownToken, id)
		}
		b.Write(e.model.tokenBytes[id])
	}
	return strings.ToValidUTF8(b.String(), "\uFFFD"), nil
}

// TokenID returns the id of an added token (e.g. "<|im_start|>").
func (e *Encoder) TokenID(content string) (uint32, bool) {
	id, ok := e.addedIDs[content]
	return id, ok
}

// VocabSize is the number of ids the encoder can produce.
func (e *Encoder) VocabSize() int {
	n := len(e.model.tokenBytes)
	for id := range e.addedByID {
		n = max(n, int(id)+1)
	}
	return n
}
