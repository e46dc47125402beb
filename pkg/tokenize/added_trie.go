package tokenize

import "strings"

// addedTrie finds, at a position of a text, the longest added token
// content starting there: a byte trie of the added tokens' contents. A
// lookup walks at most as many bytes as the longest content, however many
// added tokens share a first byte (Llama 3 has 256 beginning with "<|").
type addedTrie struct {
	// root[b] is the node reached by the byte b from the root, 0 when no
	// content starts with b (node 0 is the root itself).
	root  [256]int32
	nodes []trieNode
}

type trieNode struct {
	// labels[i] is the byte of the edge to next[i].
	labels string
	next   []int32
	// tok is the index into Encoder.added of the content ending here,
	// -1 for none; for equal contents, the first one added.
	tok int32
}

// newAddedTrie builds the trie of added's contents (none empty).
func newAddedTrie(added []addedToken) *addedTrie {
	t := &addedTrie{nodes: []trieNode{{tok: -1}}}
	for k, a := range added {
		n := int32(0)
		for i := 0; i < len(a.content); i++ {
			n = t.child(n, a.content[i], true)
		}
		if t.nodes[n].tok < 0 {
			t.nodes[n].tok = int32(k)
		}
	}
	return t
}

// child returns the node reached from n by byte c, 0 when there is none
// and add is false.
func (t *addedTrie) child(n int32, c byte, add bool) int32 {
	if n == 0 {
		if t.root[c] != 0 || !add {
			return t.root[c]
		}
	} else if i := strings.IndexByte(t.nodes[n].labels, c); i >= 0 {
		return t.nodes[n].next[i]
	} else if !add {
		return 0
	}
	id := int32(len(t.nodes))
	t.nodes = append(t.nodes, trieNode{tok: -1})
	if n == 0 {
		t.root[c] = id
	} else {
		t.nodes[n].labels += string([]byte{c})
		t.nodes[n].next = append(t.nodes[n].next, id)
	}
	return id
}

// longest returns the index into Encoder.added of the longest added
// content text[i:] starts with, -1 when none does.
func (t *addedTrie) longest(text string, i int) int {
	n := t.root[text[i]]
	best := int32(-1)
	for n != 0 {
		nd := &t.nodes[n]
		if nd.tok >= 0 {
			best = nd.tok
		}
		if i++; i == len(text) {
			break
		}
		j := strings.IndexByte(nd.labels, text[i])
		if j < 0 {
			break
		}
		n = nd.next[j]
	}
	return int(best)
}
