package route

import (
	"slices"
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
// needing no event, at one entry per request.
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
// sent to, the most recent first (unused slots "").
type sentPrompt struct {
	blocks int
	to     [bookSenders]index.ReplicaID
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
// bookSenders others forgotten.
func (b *promptBook) set(last kvblock.Key, replica index.ReplicaID, blocks int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.gen.get(last)
	if !ok || s.blocks != blocks {
		s = sentPrompt{blocks: blocks}
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
	for i := len(keys) - 1; i >= max(above, 0); i-- {
		if s, ok := b.gen.get(keys[i]); ok && s.blocks == i+1 {
			return s, true
		}
	}
	return sentPrompt{}, false
}
