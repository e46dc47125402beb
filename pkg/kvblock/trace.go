package kvblock

// TraceBlockTokens is the block size of Mooncake-format traces (hash_ids).
const TraceBlockTokens = 512

// ExpandTrace turns a trace's prefix block ids (each standing for traceBlock
// tokens, chained: an equal id means the whole prefix up to it is equal) into
// a deterministic token sequence of inputLen tokens, so that the router's own
// blocks can be cut from it. Equal ids give equal token runs, so two requests
// share exactly as many router blocks as their shared id prefix covers.
// Tokens past the last id, if inputLen asks for more, are not produced: the
// result has min(inputLen, len(ids)*traceBlock) tokens.
func ExpandTrace(ids []int64, inputLen, traceBlock int) []uint32 {
	if traceBlock <= 0 {
		traceBlock = TraceBlockTokens
	}
	n := min(inputLen, len(ids)*traceBlock)
	if n <= 0 {
		return nil
	}
	out := make([]uint32, n)
	// Block by block: token i of the result is traceToken(ids[i/traceBlock],
	// i%traceBlock), without a division per token.
	for b := 0; b*traceBlock < n; b++ {
		run := out[b*traceBlock : min(n, (b+1)*traceBlock)]
		base := uint64(ids[b])*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019
		for off := range run {
			run[off] = splitMixToken(base + uint64(off))
		}
	}
	return out
}

// traceToken derives a token id in [0, 2^17) from a trace block id and an
// offset with SplitMix64, so runs of different ids look unrelated.
func traceToken(id, off uint64) uint32 {
	return splitMixToken(id*0x9e3779b97f4a7c15 + off + 0x632be59bd9b4e019)
}

// splitMixToken is SplitMix64's output function on z, cut to 17 bits.
func splitMixToken(z uint64) uint32 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return uint32(z & (1<<17 - 1))
}
