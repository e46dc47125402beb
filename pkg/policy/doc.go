// Package policy decides which replica serves a request, given every
// candidate's matched prefix (by tier) and load.
//
// Policies are small types behind one interface: blended (NVIDIA Dynamo's
// cost), hardswitch (SGLang's gateway rule), prefixaffinity (Ray Serve's
// PrefixCacheAffinityRouter), session (consistent hashing), leastload,
// roundrobin, random and pureaffinity (experiments only: it herds). With a
// cold or empty index every policy degrades to least loaded, never to "the
// first replica". Ties never go to the lowest index.
//
// The package is pure: no goroutines, no clock, no logging; randomness is
// injected through Env.
package policy
