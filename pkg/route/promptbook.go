package route

import (
	"slices"
	"strconv"
	"sync"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

// promptBook remembers where the router sent recent prompts: the router
// key of a prompt's last full block (at the primary block size; keys
// chain, so it names the whole prompt) -> the replica and the prompt's
// blocks. A later request that resends an earlier prompt (a conversation's
// or a trajectory's next turn, a sibling of a GRPO group) finds the
// longest such prompt by probing its own keys from the longest prefix
// down. It is what Router.vouch credits where a replica's view is known
// to miss stores (ViewGaps): a record of the router's own dispatches,
// needing no event, at one entry per request. It is also where a request
// without a session key finds the conversation it continues (continues).
//
// Bounded like the homes (generations of at most max prompts). Safe for
// concurrent use (one mutex).
type promptBook struct {
	mu  sync.Mutex
	gen generations[kvblock.Key, sentPrompt]
}

// bookSenders is how many replicas one prompt's entry names. A prompt sent
// to several (a GRPO group's task, a fan-out's siblings) is held by each;
// naming only the last would send every resend of it there.
const bookSenders = 4

// sentPrompt is how long one prompt was, in blocks, and the replicas it was
// sent to, the most recent first (unused slots ""); the conversation key
// its request carried (session, "" for none); and the one later prompt
// that continued it (next, the key of its last full block; 0 for none
// yet), forked once a second, different one did.
type sentPrompt struct {
	blocks  int
	to      [bookSenders]index.ReplicaID
	session string
	next    kvblock.Key
	forked  bool
}

// sentTo reports whether the prompt was sent to id (among the last
// bookSenders replicas it went to).
func (s *sentPrompt) sentTo(id index.ReplicaID) bool {
	return id != "" && slices.Contains(s.to[:], id)
}

func newPromptBook(max int) *promptBook {
	if max <= 0 {
		return nil
	}
	return &promptBook{gen: newGenerations[kvblock.Key, sentPrompt](max)}
}

// set records that the prompt whose last full block has key last, blocks
// long, was sent to replica: first among its senders, the oldest of
// bookSenders others forgotten. A conversation key (session, "conv:") is
// kept with it for the prompts that continue it; the first one given
// stays.
func (b *promptBook) set(last kvblock.Key, replica index.ReplicaID, blocks int, session string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.gen.get(last)
	if !ok || s.blocks != blocks {
		s = sentPrompt{blocks: blocks}
	}
	if s.session == "" && keyKind(session) == kindConv {
		s.session = session
	}
	j := slices.Index(s.to[:], replica) // its earlier place, else the oldest's
	if j < 0 {
		j = len(s.to) - 1
	}
	copy(s.to[1:j+1], s.to[:j])
	s.to[0] = replica
	b.gen.set(last, s)
}

// longest returns the longest recorded prompt, of more than above blocks,
// that keys (a prompt's block keys, in order) begins with. A record's
// length is checked against its position, so a key recorded for another
// prompt length never matches.
func (b *promptBook) longest(keys []kvblock.Key, above int) (sentPrompt, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, s, ok := b.deepest(keys, len(keys)-1, above)
	return s, ok
}

// deepest probes keys from index from down to index to (at least 0) for
// a recorded prompt that keys begins with, and returns the first found:
// its last block's index and record. A record's length is checked
// against its position. b.mu held.
func (b *promptBook) deepest(keys []kvblock.Key, from, to int) (int, sentPrompt, bool) {
	for i := from; i >= max(to, 0); i-- {
		if s, ok := b.gen.get(keys[i]); ok && s.blocks == i+1 {
			return i, s, true
		}
	}
	return 0, sentPrompt{}, false
}

// continueWindow is how far below the deepest block some replica's index
// holds of a request that promptBook.continues looks for the prompt it
// continues, in blocks: the engine stores the blocks of the answer it
// computed after its prompt's, so the previous turn's prompt ends that many
// blocks below the deepest match, its answer's length; 1,024 blocks is
// 16k tokens of answer at 16 tokens a block. It bounds the probe of a
// prompt that continues none (a new question on a long shared document)
// to 1,024 look-ups (30–45 µs on a 2-core box, BenchmarkPromptBookProbe),
// where probing every block of a 128k-token prompt took 270–400 µs.
const continueWindow = 1024

// continues returns the conversation a prompt without a session key
// continues: the longest recorded prompt shorter than it that keys (its
// block keys, in order) begins with, of at most within blocks and more
// than within-continueWindow, when that prompt went to one replica only
// (home) and no other prompt continued it. key is the conversation key
// that prompt's request carried, else one named after it ("conv:p" and
// its last block's key): every later turn inherits it, as a chat
// conversation's turns share the hash of their opening (SessionKey).
//
// A prompt two different prompts continue is a fork, not a history: a
// shared document or task prompt whose last full block no request's own
// text reached, or a GRPO group's task prompt whose samples' second steps
// each extend it. The first continuation keeps what it was given; with
// claim set (a decision that is recorded, not an explanation) the second
// marks the prompt forked and every later one finds no conversation
// there. A prompt resent to several replicas is shared the same way. A
// resend of a recorded prompt (a retry, a GRPO group's next sample) is
// not probed for: it has the conversation key its first sending was
// given, or none.
func (b *promptBook) continues(keys []kvblock.Key, within int, claim bool) (key string, home index.ReplicaID, ok bool) {
	n := len(keys)
	if n < 2 || within < 1 {
		return "", "", false
	}
	me := keys[n-1]
	b.mu.Lock()
	defer b.mu.Unlock()
	if s, found := b.gen.get(me); found && s.blocks == n {
		return s.session, s.to[0], s.session != ""
	}
	// The longest earlier prompt only: a shorter one is an older turn of
	// the same history, or of one that forked.
	i, s, found := b.deepest(keys, min(n-2, within-1), within-continueWindow)
	if !found || s.forked || s.to[1] != "" {
		return "", "", false
	}
	if s.next != 0 && s.next != me {
		if claim {
			s.forked = true
			b.gen.set(keys[i], s)
		}
		return "", "", false
	}
	if claim && s.next == 0 {
		s.next = me
		b.gen.set(keys[i], s)
	}
	key = s.session
	if key == "" {
		key = "conv:p" + strconv.FormatUint(uint64(keys[i]), 16)
	}
	return key, s.to[0], true
}
