package tokenize

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// naiveLongestAdded is the definition addedTrie.longest implements: the
// longest added content text[i:] starts with, the first one added among
// equal contents; -1 for none.
func naiveLongestAdded(added []addedToken, text string, i int) int {
	best := -1
	for k, a := range added {
		if strings.HasPrefix(text[i:], a.content) && (best < 0 || len(a.content) > len(added[best].content)) {
			best = k
		}
	}
	return best
}

// TestAddedTrieLongest: at every position of texts made of every
// family's added tokens, their prefixes, tokens run together and
// tokens with a byte changed, the trie finds the token the naive
// longest-first scan finds; and the splits of the encoder follow it.
func TestAddedTrieLongest(t *testing.T) {
	synthetic := []addedToken{{content: "<e>"}, {content: "<e>x"}, {content: "<e>"}, {content: "e"}, {content: "<"}, {content: "<ab"}, {content: "<a"}, {content: "<abc>"}}
	sets := map[string][]addedToken{"synthetic": synthetic}
	for _, name := range fixtureNames {
		sets[name] = loadEncoder(t, name).added
	}
	for name, added := range sets {
		t.Run(name, func(t *testing.T) {
			trie := newAddedTrie(added)
			rng := rand.New(rand.NewPCG(uint64(len(added)), 11))
			checked, found := 0, 0
			for range 120 {
				var b strings.Builder
				for range 1 + rng.IntN(6) {
					c := added[rng.IntN(len(added))].content
					switch rng.IntN(5) {
					case 0:
						c = c[:rng.IntN(len(c)+1)]
					case 1:
						bs := []byte(c)
						bs[rng.IntN(len(bs))] ^= byte(1 + rng.IntN(255))
						c = string(bs)
					case 2:
						b.WriteString(" x")
					}
					b.WriteString(c)
				}
				text := b.String()
				for i := range len(text) {
					want := naiveLongestAdded(added, text, i)
					if got := trie.longest(text, i); got != want {
						t.Fatalf("%q at %d: trie %d, naive %d", text, i, got, want)
					}
					checked++
					if want >= 0 {
						found++
					}
				}
			}
			if found == 0 || found == checked {
				t.Fatalf("%d of %d positions matched: the texts do not test both outcomes", found, checked)
			}
		})
	}
}
