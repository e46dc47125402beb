package tokenize

import (
	"context"
	"encoding/binary"
	"sort"
	"sync"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/pkg/jsonscan"
	"github.com/kvroute/kvroute/pkg/route"
)

// Conversation reuse. A multi-turn chat resends its whole history each
// turn; the chunk cache already spares re-encoding it, but every turn
// still hashed and looked up every chunk and scanned the whole prompt for
// added tokens. The conversation memo keeps each large chat request's
// rendered prompt and ids, keyed by a hash of its messages' raw JSON. The
// next turn of the same conversation (its messages start with the same
// messages, byte for byte) finds that entry, takes the longest common
// prefix of the two rendered prompts, and reuses the ids up to the last
// safe cut inside it: only the text after the cut is encoded.
//
// A cut is the end of an added token the encoder matched (see encodeText)
// when that token has no rstrip and no other added token contains it. The
// reuse is exact by construction, whatever the chat template: the
// encoder's decisions before the cut depend only on the bytes before it
// (a match reaching past it would have to contain the cut's token), and
// after the cut it starts afresh, as it does after any added token. So
// the ids of the common part are the ids a full encoding of the new
// prompt gives, and the template is free to render the history
// differently from one turn to the next (the common prefix then simply
// ends earlier).

// minConvText: prompts shorter than this are not remembered (the saving
// would not pay for the copy).
const minConvText = 4 << 10

// maxConvBack bounds how many messages back from the end a request's
// previous turn is looked for.
const maxConvBack = 16

// textCut is a safe cut of a rendered prompt: off bytes of text give the
// first ids ids.
type textCut struct {
	off int
	ids int
}

type convEntry struct {
	key  xxh3.Uint128
	text string
	ids  []uint32  // its capacity is the array the entry holds
	cuts []textCut // increasing
}

func (e *convEntry) size() int {
	return len(e.text) + 4*cap(e.ids) + 16*len(e.cuts) + chunkEntryOverhead
}

// convMemo is a bounded LRU of convEntry by messages key. It is safe for
// concurrent use; entries are immutable once stored.
type convMemo struct {
	mu     sync.Mutex
	lru    *lru[xxh3.Uint128, *convEntry]
	hits   uint64
	misses uint64
	reused uint64 // ids taken from entries
}

func newConvMemo(maxBytes int) *convMemo {
	return &convMemo{lru: newLRU[xxh3.Uint128, *convEntry](maxBytes)}
}

// find returns the entry of the longest prefix of keys that has one,
// trying the whole request first, then up to maxConvBack messages fewer.
func (c *convMemo) find(keys []xxh3.Uint128) *convEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := len(keys) - 1; k >= 0 && k >= len(keys)-1-maxConvBack; k-- {
		if e, ok := c.lru.get(keys[k]); ok {
			c.hits++
			return e
		}
	}
	c.misses++
	return nil
}

// put stores e under its key, replacing an older entry.
func (c *convMemo) put(e *convEntry) {
	size := e.size()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lru.put(e.key, e, size)
}

func (c *convMemo) addReused(n int) {
	c.mu.Lock()
	c.reused += uint64(n)
	c.mu.Unlock()
}

func (c *convMemo) stats() (hits, misses, reused uint64, bytes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses, c.reused, c.lru.size()
}

// messageKeys returns, for k = 1..len(msgs), a hash of the request's
// tools and template arguments and its first k messages' raw JSON (each
// length-prefixed). It returns nil when a message has no raw JSON.
func messageKeys(in route.TokenizeInput) []xxh3.Uint128 {
	var h xxh3.Hasher
	var n [8]byte
	write := func(b []byte) {
		binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
		_, _ = h.Write(n[:])
		_, _ = h.Write(b)
	}
	write(in.Tools)
	write(in.ChatTemplateKwargs)
	if len(in.ChatMessages) == 0 {
		// A request converted into chat (Responses, Anthropic Messages)
		// has no decoded messages: its messages array is split here.
		elems := arrayElements(in.Messages)
		keys := make([]xxh3.Uint128, len(elems))
		for i, raw := range elems {
			write(raw)
			keys[i] = h.Sum128()
		}
		return keys
	}
	keys := make([]xxh3.Uint128, len(in.ChatMessages))
	for i := range in.ChatMessages {
		raw := in.ChatMessages[i].Raw
		if len(raw) == 0 {
			return nil
		}
		write(raw)
		keys[i] = h.Sum128()
	}
	return keys
}

// arrayElements splits a JSON array into its elements' raw bytes (slices of
// raw); nil when raw is not one JSON array (the memo is then not used:
// keys only find a turn to reuse, whose text is compared anyway).
func arrayElements(raw []byte) [][]byte {
	s := jsonscan.New(raw)
	if s.Peek() != '[' {
		return nil
	}
	out := [][]byte{}
	err := s.Array(func(int) error {
		el, err := s.Raw(1)
		out = append(out, el)
		return err
	})
	if err != nil || s.End() != nil {
		return nil
	}
	return out
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i+4096 <= n && a[i:i+4096] == b[i:i+4096] {
		i += 4096
	}
	for i+64 <= n && a[i:i+64] == b[i:i+64] {
		i += 64
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// encodeTurn encodes a chat request's rendered prompt text, reusing the
// ids of its previous turn from the memo, and remembers this turn. The
// caller has checked that no post-processor template applies.
func (l *Local) encodeTurn(ctx context.Context, in route.TokenizeInput, text string) ([]uint32, error) {
	keys := messageKeys(in)
	if keys == nil {
		return l.enc.appendEncode(ctx, make([]uint32, 0, len(text)/3+4), text, false, l.cache)
	}
	e, reused, err := l.enc.encodeReusing(ctx, l.conv.find(keys), text, l.cache)
	if err != nil {
		return nil, err
	}
	l.conv.addReused(reused)
	e.key = keys[len(keys)-1]
	// The memo and the caller share the ids (callers read them and may
	// append, never write them in place: route.Tokens); the caller's view
	// is clipped, so that an append never writes into the memo's array.
	// When the array has much unused room, the memo keeps an exact copy
	// instead (it counts the array it holds).
	n := len(e.ids)
	if cap(e.ids)-n > n/8+16 {
		e.ids = append(make([]uint32, 0, n), e.ids...)
	}
	l.conv.put(e)
	return e.ids[:n:n], nil
}

// encodeReusing encodes text (without post-processor tokens), taking the
// ids of the longest common prefix of text and base.text up to its last
// safe cut from base (nil: nothing to reuse). It returns text's entry
// (ids and cuts; no key) and how many ids came from base.
func (e *Encoder) encodeReusing(ctx context.Context, base *convEntry, text string, cache *chunkCache) (*convEntry, int, error) {
	var cuts []textCut
	start, reused := 0, 0
	var from []uint32
	if base != nil {
		common := commonPrefix(base.text, text)
		j := sort.Search(len(base.cuts), func(i int) bool { return base.cuts[i].off > common }) - 1
		if j >= 0 {
			c := base.cuts[j]
			from = base.ids[:c.ids]
			cuts = append(make([]textCut, 0, j+1+16), base.cuts[:j+1]...)
			start, reused = c.off, c.ids
		}
	}
	// Room for the reused ids and the new text at up to one id per two
	// bytes, so that the new ids rarely make the slice grow (a copy of the
	// whole prompt's ids). A text long enough to encode in parallel knows
	// its ids' count before it appends them and grows dst once to fit.
	room := (len(text)-start)/2 + 16
	if e.workers(len(text)-start) > 1 {
		room = 16
	}
	dst := append(make([]uint32, 0, reused+room), from...)
	dst, err := e.encodeTextCuts(ctx, dst, text[start:], cache, &cuts, start)
	if err != nil {
		return nil, 0, err
	}
	return &convEntry{text: text, ids: dst, cuts: cuts}, reused, nil
}
