package tokenize

import "strings"

// addedTrie finds, at a position of a text, the longest added token
// content starting there: a path-compressed byte trie of the added tokens'
// contents. A lookup compares a few edges (Llama 3's "<|", "reserved_",
// "special_token_", ...) however many added tokens share a first byte
// (Llama 3 has 256 beginning with "<|").
type addedTrie struct {
	// nodes[0] is the root.
	nodes []trieNode
}

type trieNode struct {
	// labels[j] is the first byte of edges[j], the bytes that lead to
	// next[j]; no two edges of a node share a first byte.
	labels string
	edges  []string
	next   []int32
	// tok is the index into Encoder.added of the content ending here,
	// -1 for none; for equal contents, the first one added.
	tok int32
}

// newAddedTrie builds the trie of added's contents (none empty).
func newAddedTrie(added []addedToken) *addedTrie {
	// A plain byte trie first (one byte per edge), then compressed: each
	// chain of nodes with one child and no token becomes one edge.
	plain := []trieNode{{tok: -1}}
	for k, a := range added {
		n := int32(0)
		for i := 0; i < len(a.content); i++ {
			c := a.content[i]
			j := strings.IndexByte(plain[n].labels, c)
			if j < 0 {
				plain[n].labels += string([]byte{c})
				plain[n].next = append(plain[n].next, int32(len(plain)))
				plain = append(plain, trieNode{tok: -1})
				j = len(plain[n].next) - 1
			}
			n = plain[n].next[j]
		}
		if plain[n].tok < 0 {
			plain[n].tok = int32(k)
		}
	}
	t := &addedTrie{}
	t.compress(plain, 0)
	return t
}

// compress appends plain node p, compressed, and returns its index.
func (t *addedTrie) compress(plain []trieNode, p int32) int32 {
	id := int32(len(t.nodes))
	t.nodes = append(t.nodes, trieNode{tok: plain[p].tok, labels: plain[p].labels})
	for j := range len(plain[p].labels) {
		seg := []byte{plain[p].labels[j]}
		v := plain[p].next[j]
		for plain[v].tok < 0 && len(plain[v].labels) == 1 {
			seg = append(seg, plain[v].labels[0])
			v = plain[v].next[0]
		}
		child := t.compress(plain, v)
		t.nodes[id].edges = append(t.nodes[id].edges, string(seg))
		t.nodes[id].next = append(t.nodes[id].next, child)
	}
	return id
}

// longest returns the index into Encoder.added of the longest added
// content text[i:] starts with, -1 when none does.
func (t *addedTrie) longest(text string, i int) int {
	best := int32(-1)
	nd := &t.nodes[0]
	for i < len(text) {
		c := text[i]
		j := 0
		for j < len(nd.labels) && nd.labels[j] != c {
			j++
		}
		if j == len(nd.labels) {
			break
		}
		// An edge passes no token and no branch: a text that leaves it
		// midway matches nothing longer.
		e := nd.edges[j]
		if !strings.HasPrefix(text[i:], e) {
			break
		}
		i += len(e)
		nd = &t.nodes[nd.next[j]]
		if nd.tok >= 0 {
			best = nd.tok
		}
	}
	return int(best)
}
