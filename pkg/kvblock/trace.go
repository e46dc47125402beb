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
	for i := range n {
		id := ids[i/traceBlock]
		out[i] = traceToken(uint64(id), uint64(i%traceBlock))
	}
	return out
}

// traceToken derives a token id in [0, 2^17) from a trace block id and an
// offset with SplitMix64, so runs of different ids look unrelated.
func traceToken(id, off uint64) uint32 {
	z := id*0x9e3779b97f4a7c15 + off + 0x632be59bd9b4e019
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return uint32(z & (1<<17 - 1))
}
